import { isIP } from "node:net";
import { StatsError, StatsErrorCode } from "./errors.js";

/** Default of every `--metrics-listen` flag: loopback only. */
export const DEFAULT_METRICS_LISTEN = "tcp://127.0.0.1:9464";

/** A parsed `--metrics-listen` address (IPv6 hosts without brackets, ready for `listen()`). */
export interface MetricsListen {
  /** Host or IP address to bind. */
  host: string;
  /** Port to bind, 0..65535 (0 picks a free one). */
  port: number;
}

const HOSTNAME_RE =
  /^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;

/**
 * Parses a metrics listen address `tcp://HOST:PORT` (`tcp://127.0.0.1:9464`, `tcp://[::1]:9464`,
 * `tcp://localhost:0`). Anything else (another scheme, a path, a missing or out-of-range port)
 * throws `StatsError` `STATS_BAD_LISTEN` with a one-line message that a CLI can print before
 * exiting 2.
 */
export function parseMetricsListen(s: string): MetricsListen {
  const bad = (why: string): never => {
    throw new StatsError(
      StatsErrorCode.BAD_LISTEN,
      `metrics listen address ${JSON.stringify(s)} ${why}; expected tcp://HOST:PORT (e.g. ${DEFAULT_METRICS_LISTEN})`,
    );
  };
  if (typeof s !== "string") return bad("is not a string");
  const m = /^tcp:\/\/(\[[^\]]*\]|[^:/[\]]*):([0-9]{1,5})$/.exec(s);
  if (m === null) {
    if (!s.startsWith("tcp://")) return bad("has no tcp:// scheme");
    return bad("is not HOST:PORT");
  }
  let host = m[1] as string;
  if (host.startsWith("[")) {
    host = host.slice(1, -1);
    if (isIP(host) !== 6) return bad(`has a bad IPv6 address ${JSON.stringify(host)}`);
  } else if (/^[0-9.]+$/.test(host) ? isIP(host) !== 4 : !HOSTNAME_RE.test(host)) {
    return bad(`has a bad host ${JSON.stringify(host)}`);
  }
  const port = Number(m[2]);
  if (port > 65535) return bad(`has port ${port} outside [0, 65535]`);
  return { host, port };
}
