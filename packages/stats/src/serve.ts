import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { StatsError, StatsErrorCode } from "./errors.js";
import { Registry } from "./registry.js";

/** A running metrics endpoint returned by {@link serveMetrics}. */
export interface MetricsServer {
  /** The bound port (resolved when 0 was asked). */
  port: number;
  /** Stops listening and closes open connections. */
  close(): Promise<void>;
}

/**
 * Serves `GET /metrics` (Prometheus text, every registry in order) over node:http on
 * `host:port` (port 0 picks a free port). Other paths answer 404, other methods 405.
 * Give the registries distinct prefixes: their texts are concatenated as they are.
 */
export function serveMetrics(
  registries: Registry[],
  port: number,
  host = "127.0.0.1",
): Promise<MetricsServer> {
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
  const server = createServer((req, res) => {
    const path = (req.url ?? "/").split("?", 1)[0];
    if (path !== "/metrics") {
      res.writeHead(404, { "content-type": "text/plain" }).end("not found\n");
      return;
    }
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.writeHead(405, { "content-type": "text/plain", allow: "GET, HEAD" }).end("method not allowed\n");
      return;
    }
    Promise.all(registries.map((r) => r.prometheus())).then(
      (texts) => {
        res.writeHead(200, { "content-type": Registry.contentType });
        res.end(req.method === "HEAD" ? undefined : texts.join("\n"));
      },
      (err: unknown) => {
        res.writeHead(500, { "content-type": "text/plain" }).end(`${String(err)}\n`);
      },
    );
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      const bound = (server.address() as AddressInfo).port;
      resolve({
        port: bound,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            server.closeAllConnections();
          }),
      });
    });
  });
}
