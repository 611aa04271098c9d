import type { IncomingMessage, ServerResponse } from "node:http";
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
  /**
   * More GET paths served by the same server (issue 24: a live page and its Server-Sent Events,
   * see {@link sseRoute} and {@link pageRoute}). Keys are paths (`"/"`, `"/events"`); they may not
   * replace `/metrics`, `/healthz` or `/readyz`.
   */
  routes?: Readonly<Record<string, (req: IncomingMessage, res: ServerResponse) => void>>;
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
  const routes = options.routes ?? {};
  if (typeof routes !== "object" || routes === null) {
    return Promise.reject(new StatsError(StatsErrorCode.BAD_OPTION, "option routes must be an object"));
  }
  for (const [k, f] of Object.entries(routes)) {
    if (
      !k.startsWith("/") ||
      k === "/metrics" ||
      k === "/healthz" ||
      k === "/readyz" ||
      typeof f !== "function"
    ) {
      return Promise.reject(
        new StatsError(
          StatsErrorCode.BAD_OPTION,
          `option routes: ${JSON.stringify(k)} is not a new path with a handler`,
        ),
      );
    }
  }
  const { ready, extra } = options;
  const server = createServer((req, res) => {
    const path = (req.url ?? "/").split("?", 1)[0] ?? "/";
    const route = Object.hasOwn(routes, path) ? routes[path] : undefined;
    if (route !== undefined && (req.method === "GET" || req.method === "HEAD")) {
      route(req, res);
      return;
    }
    if (path !== "/metrics" && path !== "/healthz" && path !== "/readyz" && route === undefined) {
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

/** Options of {@link sseRoute}. */
export interface SseRouteOptions {
  /** Milliseconds between events (default 500; at least 50). */
  intervalMs?: number;
  /** Clients at once (default 16); more are answered 503. */
  maxClients?: number;
}

/** A route of {@link ServeMetricsOptions.routes} streaming Server-Sent Events, with a way to end them. */
export interface SseRoute {
  /** The request handler. */
  (req: IncomingMessage, res: ServerResponse): void;
  /** Clients connected now. */
  readonly clients: number;
  /** Sends `event: name` with `data` (JSON) to every client now. */
  send(name: string, data: unknown): void;
  /** Stops the timer and ends every stream. */
  close(): void;
}

/**
 * A Server-Sent Events route: every `intervalMs` each client gets `data: JSON.stringify(state())`
 * (a first one at once). A throwing `state` sends an `event: error` line instead. Timers are
 * unref'd; `close()` ends every stream.
 */
export function sseRoute(state: () => unknown, options: SseRouteOptions = {}): SseRoute {
  const every = options.intervalMs ?? 500;
  const max = options.maxClients ?? 16;
  if (!Number.isInteger(every) || every < 50)
    throw new StatsError(StatsErrorCode.BAD_OPTION, `option intervalMs ${every} is not an integer >= 50`);
  if (!Number.isInteger(max) || max < 1)
    throw new StatsError(StatsErrorCode.BAD_OPTION, `option maxClients ${max} is not an integer >= 1`);
  const clients = new Set<ServerResponse>();
  const frame = (name: string | null, data: unknown): string => {
    let json: string;
    try {
      json = JSON.stringify(data);
    } catch (e) {
      return `event: error\ndata: ${JSON.stringify(String(e))}\n\n`;
    }
    return `${name !== null ? `event: ${name}\n` : ""}data: ${json}\n\n`;
  };
  const tick = (): string => {
    try {
      return frame(null, state());
    } catch (e) {
      return `event: error\ndata: ${JSON.stringify(e instanceof Error ? e.message : String(e))}\n\n`;
    }
  };
  let timer: ReturnType<typeof setInterval> | null = null;
  const start = (): void => {
    if (timer !== null) return;
    timer = setInterval(() => {
      if (clients.size === 0) return;
      const f = tick();
      for (const c of clients) c.write(f);
    }, every);
    timer.unref?.();
  };
  const handler = ((req: IncomingMessage, res: ServerResponse) => {
    if (clients.size >= max) {
      res.writeHead(503, { "content-type": "text/plain" }).end("too many event streams\n");
      return;
    }
    res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-store",
      connection: "keep-alive",
    });
    if (req.method === "HEAD") {
      res.end();
      return;
    }
    clients.add(res);
    res.write(`retry: ${every}\n\n${tick()}`);
    const drop = (): void => {
      clients.delete(res);
    };
    req.once("close", drop);
    res.once("close", drop);
    start();
  }) as SseRoute;
  Object.defineProperty(handler, "clients", { get: () => clients.size });
  handler.send = (name, data) => {
    const f = frame(name, data);
    for (const c of clients) c.write(f);
  };
  handler.close = () => {
    if (timer !== null) clearInterval(timer);
    timer = null;
    for (const c of clients) c.end();
    clients.clear();
  };
  return handler;
}

/** A route answering `body` (an HTML page by default) to GET and HEAD. */
export function pageRoute(
  body: string,
  type = "text/html; charset=utf-8",
): (req: IncomingMessage, res: ServerResponse) => void {
  const buf = Buffer.from(body, "utf8");
  return (req, res) => {
    res.writeHead(200, { "content-type": type, "content-length": buf.length, "cache-control": "no-store" });
    res.end(req.method === "HEAD" ? undefined : buf);
  };
}
