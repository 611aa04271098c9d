import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { StatsError, StatsErrorCode } from "./errors.js";
import { Registry } from "./registry.js";

/** A running metrics endpoint returned by {@link serveMetrics}. */
export interface MetricsServer {
  /** The bound port (resolved when 0 was asked). */
  port: number;
  /** The bound host, as given. */
  host: string;
  /** Stops listening and closes open connections. */
  close(): Promise<void>;
}

/** Options of {@link serveMetrics}. */
export interface ServeMetricsOptions {
  /**
   * Readiness probe behind `GET /readyz`: `true` answers 200 `ready`, a string answers 503 with
   * that string as the reason (e.g. `"drafter loading"`). A throwing probe answers 503 with its
   * message. Without a probe `/readyz` answers 200 as soon as the endpoint is up.
   */
  ready?: () => true | string;
  /**
   * More Prometheus text appended after the registries on every scrape (e.g. a child process's
   * exposition re-served by a supervisor). Its families must not repeat the registries' names.
   */
  extra?: () => string | Promise<string>;
}

/**
 * Serves over node:http on `host:port` (port 0 picks a free port):
 * - `GET /metrics`: Prometheus text, every registry in order, then `options.extra()`;
 * - `GET /healthz`: 200 `ok` while the process is up (liveness);
 * - `GET /readyz`: 200 `ready` when `options.ready()` is true, else 503 with the reason.
 *
 * `HEAD` works on each; other paths answer 404, other methods 405. Give the registries distinct
 * prefixes: their texts are concatenated as they are. `options` may also be passed third, in place
 * of `host`.
 */
export function serveMetrics(
  registries: Registry[],
  port: number,
  host?: string | ServeMetricsOptions,
  options: ServeMetricsOptions = {},
): Promise<MetricsServer> {
  if (typeof host === "object" && host !== null) {
    options = host;
    host = undefined;
  }
  const bindHost = host ?? "127.0.0.1";
  if (!Array.isArray(registries) || registries.some((r) => !(r instanceof Registry))) {
    return Promise.reject(
      new StatsError(StatsErrorCode.BAD_OPTION, "registries must be an array of Registry"),
    );
  }
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    return Promise.reject(
      new StatsError(StatsErrorCode.BAD_OPTION, `port ${port} is not an integer in [0, 65535]`),
    );
  }
  if (typeof bindHost !== "string" || bindHost === "") {
    return Promise.reject(new StatsError(StatsErrorCode.BAD_OPTION, "host must be a non-empty string"));
  }
  if (typeof options !== "object" || options === null) {
    return Promise.reject(new StatsError(StatsErrorCode.BAD_OPTION, "options must be an object"));
  }
  for (const key of ["ready", "extra"] as const) {
    if (options[key] !== undefined && typeof options[key] !== "function") {
      return Promise.reject(new StatsError(StatsErrorCode.BAD_OPTION, `option ${key} must be a function`));
    }
  }
  const { ready, extra } = options;
  const server = createServer((req, res) => {
    const path = (req.url ?? "/").split("?", 1)[0];
    if (path !== "/metrics" && path !== "/healthz" && path !== "/readyz") {
      res.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
      return;
    }
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.writeHead(405, { "content-type": "text/plain", allow: "GET, HEAD" }).end("method not allowed\n");
      return;
    }
    const reply = (status: number, body: string, type = "text/plain; charset=utf-8") => {
      res.writeHead(status, { "content-type": type, "cache-control": "no-store" });
      res.end(req.method === "HEAD" ? undefined : body);
    };
    if (path === "/healthz") {
      reply(200, "ok\n");
      return;
    }
    if (path === "/readyz") {
      let verdict: true | string;
      try {
        verdict = ready === undefined ? true : ready();
      } catch (err) {
        verdict = `readiness probe failed: ${err instanceof Error ? err.message : String(err)}`;
      }
      if (verdict === true) reply(200, "ready\n");
      else reply(503, `not ready: ${String(verdict).replace(/\n/g, " ")}\n`);
      return;
    }
    Promise.all([
      ...registries.map((r) => r.prometheus()),
      extra === undefined ? "" : Promise.resolve().then(extra),
    ]).then(
      // an empty registry renders as a lone newline: leave it out
      (texts) => reply(200, texts.filter((t) => t.trim() !== "").join("\n"), Registry.contentType),
      (err: unknown) => reply(500, `${String(err)}\n`),
    );
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, bindHost, () => {
      server.off("error", reject);
      const bound = (server.address() as AddressInfo).port;
      resolve({
        port: bound,
        host: bindHost,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            server.closeAllConnections();
          }),
      });
    });
  });
}
