// Option validation of makeClient and listen: every option checked (type, range) and a bad one
// named in a TRANSPORT_BAD_OPTION error before anything is connected or bound.
import { Registry } from "@tapwire/stats";
import { intOption } from "./check.js";
import type { Endpoint } from "./endpoint.js";
import { TransportError } from "./errors.js";
import { type ServerMetrics, serverMetrics } from "./metrics.js";
import {
  type ClientOptions,
  type ClientTlsOptions,
  DEFAULT_CLOSE_TIMEOUT_MS,
  DEFAULT_CONNECT_TIMEOUT_MS,
  DEFAULT_MAX_MESSAGE_BYTES,
  MAX_TIMER_MS,
  MAX_U32,
  type ServerOptions,
} from "./options.js";

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

/** Validated client options. */
export interface ClientConfig {
  maxMessageBytes: number;
  connectTimeoutMs: number;
  tls: ClientTlsOptions | undefined;
  registry: Registry;
}

/** Validates {@link ClientOptions}. @throws {TransportError} `TRANSPORT_BAD_OPTION` naming the option. */
export function clientConfig(options: ClientOptions): ClientConfig {
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
    MAX_TIMER_MS,
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
  return { maxMessageBytes, connectTimeoutMs, tls: options.tls, registry };
}

/** Validated server options (see {@link ServerOptions} for each). */
export interface ServerConfig {
  maxMessageBytes: number;
  /** Limit of connections not bound (CONTRACT 11); equals maxMessageBytes when not given. */
  unboundMaxMessageBytes: number;
  idleTimeoutMs: number;
  unboundIdleMs: number;
  /** 0 = no budget. */
  maxBufferedBytes: number;
  /** 0 = no limit. */
  maxConnections: number;
  closeTimeoutMs: number;
  options: ServerOptions;
  metrics: ServerMetrics;
  registry: Registry;
}

/**
 * Validates {@link ServerOptions} for a server on `ep`.
 * @throws {TransportError} `TRANSPORT_BAD_OPTION` naming the option.
 */
export function serverConfig(ep: Endpoint, options: ServerOptions): ServerConfig {
  checkObject("options", options);
  const maxMessageBytes = intOption(
    "maxMessageBytes",
    options.maxMessageBytes,
    DEFAULT_MAX_MESSAGE_BYTES,
    0,
    MAX_U32,
  );
  const unboundMaxMessageBytes = intOption(
    "unboundMaxMessageBytes",
    options.unboundMaxMessageBytes,
    maxMessageBytes,
    0,
    maxMessageBytes,
  );
  const idleTimeoutMs = intOption("idleTimeoutMs", options.idleTimeoutMs, 0, 0, MAX_TIMER_MS);
  const unboundIdleMs = intOption("unboundIdleMs", options.unboundIdleMs, 0, 0, MAX_TIMER_MS);
  const maxBufferedBytes = intOption(
    "maxBufferedBytes",
    options.maxBufferedBytes,
    0,
    0,
    Number.MAX_SAFE_INTEGER,
  );
  if (maxBufferedBytes !== 0 && maxBufferedBytes < maxMessageBytes) {
    throw new TransportError(
      "TRANSPORT_BAD_OPTION",
      `option maxBufferedBytes: ${maxBufferedBytes} is below maxMessageBytes ${maxMessageBytes} (one message must fit)`,
    );
  }
  const maxConnections = intOption("maxConnections", options.maxConnections, 0, 0, 0x7fff_ffff);
  const closeTimeoutMs = intOption(
    "closeTimeoutMs",
    options.closeTimeoutMs,
    DEFAULT_CLOSE_TIMEOUT_MS,
    0,
    MAX_TIMER_MS,
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
  checkType("onOversize", options.onOversize, "function");
  checkType("onTlsError", options.onTlsError, "function");
  const registry = options.registry ?? new Registry();
  return {
    maxMessageBytes,
    unboundMaxMessageBytes,
    idleTimeoutMs,
    unboundIdleMs,
    maxBufferedBytes,
    maxConnections,
    closeTimeoutMs,
    options,
    metrics: serverMetrics(registry),
    registry,
  };
}
