import type { AddressInfo, Socket } from "node:net";
import { createServer } from "node:net";

/** A plain TCP (or unix) echo server for proxy and transport tests. */
export interface EchoServer {
  /** Bound port (0 for a unix server). */
  readonly port: number;
  /** `{ host, port }` or `{ path }`, usable as a {@link startFaultProxy} target. */
  readonly target: { host: string; port: number } | { path: string };
  /** Bytes received, over all connections. */
  readonly received: () => number;
  /** Connections accepted so far. */
  readonly connections: () => number;
  close(): Promise<void>;
}

/** Starts an echo server on 127.0.0.1:0, or on a unix socket `path`; echoes every byte back. */
export function startEchoServer(path?: string): Promise<EchoServer> {
  let received = 0;
  let connections = 0;
  const sockets = new Set<Socket>();
  const server = createServer({ allowHalfOpen: true, noDelay: true }, (s) => {
    connections++;
    sockets.add(s);
    s.on("data", (d: Buffer) => {
      received += d.length;
      s.write(d);
    });
    s.on("end", () => s.end());
    s.on("error", () => {});
    s.on("close", () => sockets.delete(s));
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    const ready = () => {
      server.off("error", reject);
      const port = path === undefined ? (server.address() as AddressInfo).port : 0;
      resolve({
        port,
        target: path === undefined ? { host: "127.0.0.1", port } : { path },
        received: () => received,
        connections: () => connections,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            for (const s of sockets) s.destroy();
          }),
      });
    };
    if (path === undefined) server.listen(0, "127.0.0.1", ready);
    else server.listen(path, ready);
  });
}
