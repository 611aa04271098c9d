// The two entry points: a client for an endpoint, a server on an endpoint (CONTRACT 3).
import { clientConfig, serverConfig } from "./config.js";
import { parseEndpoint } from "./endpoint.js";
import { TransportError } from "./errors.js";
import { clientMetrics } from "./metrics.js";
import type { ClientOptions, Handler, RpcClient, RpcServer, ServerOptions } from "./options.js";
import { ShmClient, shmClientOptions } from "./shm-client.js";
import { ShmServer } from "./shm-server.js";
import { StreamClient } from "./stream-client.js";
import { StreamServer } from "./stream-server.js";
import { ZmqClient } from "./zmq-client.js";
import { ZmqServer } from "./zmq-server.js";

/**
 * Makes a client for `endpoint` (not yet connected: call `connect()`). CONTRACT 3.
 *
 * @throws {TransportError} `TRANSPORT_BAD_ENDPOINT`, `TRANSPORT_BAD_OPTION` naming the option.
 */
export function makeClient(endpoint: string, options: ClientOptions = {}): RpcClient {
  const ep = parseEndpoint(endpoint);
  const cfg = clientConfig(options);
  const metrics = clientMetrics(cfg.registry);
  switch (ep.scheme) {
    case "tcp":
    case "unix":
    case "tls":
      return new StreamClient(endpoint, ep, cfg, metrics);
    case "zmq+tcp":
    case "zmq+ipc":
      return new ZmqClient(endpoint, ep, cfg, metrics);
    case "shm+unix":
      return new ShmClient(endpoint, ep.path, cfg, metrics, shmClientOptions(options));
  }
}

/**
 * Listens on `endpoint` and answers each request with `handler`. Resolves once bound; the
 * returned server's `endpoint` has port 0 resolved. CONTRACT 3.
 *
 * @throws {TransportError} `TRANSPORT_BAD_ENDPOINT`, `TRANSPORT_BAD_OPTION`, `TRANSPORT_LISTEN`.
 */
export async function listen(
  endpoint: string,
  handler: Handler,
  options: ServerOptions = {},
): Promise<RpcServer> {
  const ep = parseEndpoint(endpoint);
  if (typeof handler !== "function")
    throw new TransportError("TRANSPORT_BAD_OPTION", "handler: not a function");
  if (ep.scheme === "shm+unix") {
    const shm = new ShmServer(ep.path, handler, options);
    await shm.start();
    return shm;
  }
  const cfg = serverConfig(ep, options);
  const s =
    ep.scheme === "zmq+tcp" || ep.scheme === "zmq+ipc"
      ? new ZmqServer(ep, handler, cfg)
      : new StreamServer(ep, handler, cfg);
  await s.start();
  return s;
}
