import { badOption } from "./errors.js";

/** A pino-compatible logger (the bins pass theirs); default silent. */
export interface DiscoveryLogger {
  /** Informational line. */
  info(obj: object, msg: string): void;
  /** Something degraded (etcd lost, a record ignored). */
  warn(obj: object, msg: string): void;
  /** Something failed. */
  error(obj: object, msg: string): void;
}

/** A logger that writes nothing. */
export const silentLogger: DiscoveryLogger = { info() {}, warn() {}, error() {} };

/**
 * The etcd client URLs of `etcd://host:port[,host:port…]` (plain gRPC over HTTP/2, as
 * `http://host:port`); `http://` and `https://` URLs (comma-separated) are passed through.
 *
 * @throws DiscoveryError `DISCOVERY_BAD_OPTION` for anything else.
 */
export function etcdHosts(url: string, name = "etcd"): string[] {
  if (typeof url !== "string" || url.length === 0) throw badOption(name, "an etcd://host:port URL", url);
  const m = /^etcd:\/\/(.+)$/.exec(url);
  const parts = m !== null ? m[1]!.split(",") : url.split(",");
  const hosts: string[] = [];
  for (const p of parts) {
    const s = p.trim().replace(/\/+$/, "");
    if (m !== null) {
      if (!/^[A-Za-z0-9.\-_]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$/.test(s)) {
        throw badOption(name, "etcd://host:port[,host:port…]", url);
      }
      hosts.push(`http://${s}`);
    } else {
      if (!/^https?:\/\/[^/]+$/.test(s)) throw badOption(name, "an etcd://host:port URL", url);
      hosts.push(s);
    }
  }
  return hosts;
}

/** Checks a key prefix: starts and ends with "/". */
export function checkPrefix(prefix: unknown, name = "prefix"): string {
  if (typeof prefix !== "string" || !prefix.startsWith("/") || !prefix.endsWith("/") || prefix.length > 256) {
    throw badOption(name, 'a key prefix starting and ending with "/"', prefix);
  }
  return prefix;
}

/** Checks a positive finite number. */
export function positive(name: string, v: unknown, dflt: number): number {
  const x = v ?? dflt;
  if (typeof x !== "number" || !Number.isFinite(x) || x <= 0) throw badOption(name, "a positive number", x);
  return x;
}
