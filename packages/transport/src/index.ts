/**
 * `@tapwire/transport`: request/response transports close to the socket limit (CONTRACT 3).
 *
 * @packageDocumentation
 */
import { Registry } from "@tapwire/stats";
import { type Endpoint, parseEndpoint } from "./endpoint.js";
import { TransportError } from "./errors.js";
import { clientMetrics, serverMetrics } from "./metrics.js";
import {
  type ClientOptions,
  DEFAULT_CLOSE_TIMEOUT_MS,
  DEFAULT_CONNECT_TIMEOUT_MS,
  DEFAULT_MAX_MESSAGE_BYTES,
  type Handler,
  intOption,
  MAX_U32,
  type RpcClient,
  type RpcServer,
  type ServerOptions,
} from "./options.js";
import { StreamClient } from "./stream-client.js";
import { StreamServer } from "./stream-server.js";
import { ZmqClient, ZmqServer } from "./zmq.js";

const MAX_TIMEOUT_MS = 0x7fff_ffff;

function checkObject(name: string, v: unknown): void {
  if (v !== undefined && (typeof v !== "object" || v === null)) {
    throw new TransportError("TRANSPORT_BAD_OPTION", `${name}: not an object`);
  }
}

function checkType(name: string, v: unknown, type: "boolean" | "function" | "string"): void {
  if (v !== undefined && typeof v !== type) {
    throw new TransportError("TRANSPORT_BAD_OPTION", `option ${name}: ${String(v)} is not a ${type}`);
  }
}

/** PEM material: a string, a Buffer, or an array of them (what node:tls accepts). */
function checkPem(name: string, v: unknown, required: boolean): void {
  if (v === undefined) {
    if (required) throw new TransportError("TRANSPORT_BAD_OPTION", `option ${name}: required`);
    return;
  }
  const ok = (x: unknown) => typeof x === "string" || x instanceof Uint8Array;
  if (!(ok(v) || (Array.isArray(v) && v.length > 0 && v.every((x) => ok(x) || typeof x === "object")))) {
    throw new TransportError("TRANSPORT_BAD_OPTION", `option ${name}: not PEM (a string or Buffer)`);
  }
}

/**
 * Makes a client for `endpoint` (not yet connected: call `connect()`). CONTRACT 3.
 *
 * @throws {TransportError} `TRANSPORT_BAD_ENDPOINT`, `TRANSPORT_BAD_OPTION` naming the option.
 */
export function makeClient(endpoint: string, options: ClientOptions = {}): RpcClient {
  const ep: Endpoint = parseEndpoint(endpoint);
  checkObject("options", options);
  const maxMessageBytes = intOption(
    "maxMessageBytes",
    options.maxMessageBytes,
    DEFAULT_MAX_MESSAGE_BYTES,
    0,
    MAX_U32,
  );
  const connectTimeoutMs = intOption(
    "connectTimeoutMs",
    options.connectTimeoutMs,
    DEFAULT_CONNECT_TIMEOUT_MS,
    1,
    MAX_TIMEOUT_MS,
  );
  checkObject("tls", options.tls);
  if (options.tls !== undefined) {
    const t = options.tls;
    checkPem("tls.ca", t.ca, false);
    checkPem("tls.cert", t.cert, false);
    checkPem("tls.key", t.key, false);
    if ((t.cert === undefined) !== (t.key === undefined)) {
      throw new TransportError("TRANSPORT_BAD_OPTION", "option tls.cert and tls.key: give both or neither");
    }
    checkType("tls.servername", t.servername, "string");
    checkType("tls.rejectUnauthorized", t.rejectUnauthorized, "boolean");
  }
  const registry = options.registry ?? new Registry();
  const metrics = clientMetrics(registry);
  switch (ep.scheme) {
    case "tcp":
    case "unix":
    case "tls":
      return new StreamClient(
        endpoint,
        ep,
        { maxMessageBytes, connectTimeoutMs, tls: options.tls, registry },
        metrics,
      );
    case "zmq+tcp":
    case "zmq+ipc":
      return new ZmqClient(endpoint, ep, { maxMessageBytes, connectTimeoutMs, registry }, metrics);
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
  checkObject("options", options);
  const maxMessageBytes = intOption(
    "maxMessageBytes",
    options.maxMessageBytes,
    DEFAULT_MAX_MESSAGE_BYTES,
    0,
    MAX_U32,
  );
  const idleTimeoutMs = intOption("idleTimeoutMs", options.idleTimeoutMs, 0, 0, MAX_TIMEOUT_MS);
  const closeTimeoutMs = intOption(
    "closeTimeoutMs",
    options.closeTimeoutMs,
    DEFAULT_CLOSE_TIMEOUT_MS,
    0,
    MAX_TIMEOUT_MS,
  );
  checkObject("tls", options.tls);
  if (options.tls !== undefined || ep.scheme === "tls") {
    const t = options.tls;
    if (t === undefined) {
      throw new TransportError(
        "TRANSPORT_BAD_OPTION",
        "option tls: required (cert and key) for tls:// endpoints",
      );
    }
    checkPem("tls.cert", t.cert, true);
    checkPem("tls.key", t.key, true);
    checkPem("tls.ca", t.ca, false);
    checkType("tls.requestCert", t.requestCert, "boolean");
    checkType("tls.rejectUnauthorized", t.rejectUnauthorized, "boolean");
  }
  checkType("onConnection", options.onConnection, "function");
  checkType("onClose", options.onClose, "function");
  checkType("onError", options.onError, "function");
  checkType("receiveInto", options.receiveInto, "function");
  const registry = options.registry ?? new Registry();
  const metrics = serverMetrics(registry);
  const cfg = { maxMessageBytes, idleTimeoutMs, closeTimeoutMs, options, metrics, registry };
  switch (ep.scheme) {
    case "tcp":
    case "unix":
    case "tls": {
      const s = new StreamServer(ep, handler, cfg);
      await s.start();
      return s;
    }
    case "zmq+tcp":
    case "zmq+ipc": {
      const z = new ZmqServer(ep, handler, cfg);
      await z.start();
      return z;
    }
  }
}

export type { Endpoint } from "./endpoint.js";
export { formatEndpoint, parseEndpoint, SCHEMES, Scheme } from "./endpoint.js";
export { TransportError, TransportErrorCode } from "./errors.js";
export type {
  ClientOptions,
  ClientTlsOptions,
  ConnInfo,
  Handler,
  ReceiveInto,
  ReceivePlan,
  Reply,
  RpcClient,
  RpcServer,
  ServerOptions,
  ServerTlsOptions,
} from "./options.js";
export { DEFAULT_CONNECT_TIMEOUT_MS, DEFAULT_MAX_MESSAGE_BYTES } from "./options.js";
