import { isIP } from "node:net";
import type { NetworkInterfaceInfo } from "node:os";
import { networkInterfaces } from "node:os";
import { StatsError, StatsErrorCode } from "./errors.js";

/**
 * The one rule for the address a tapwire server tells its peers to connect to (issue 19): every
 * bin that announces where it listens (`tapwire-ec-producer` in each grant's agent metadata,
 * `tapwire-worker` in its `listening` line and to discovery) resolves it here.
 *
 * 1. `--advertise HOST[:PORT]` given: that host (and that port, if given).
 * 2. Otherwise the bind address, unless it is a wildcard (`0.0.0.0`, `::`, `*`, empty).
 * 3. A wildcard without `--advertise`: the first address of the first non-loopback interface that
 *    is up (`os.networkInterfaces`, which lists only interfaces that are up and running; IPv4 for
 *    `0.0.0.0`, IPv4 before IPv6 otherwise, never link-local IPv6), reported as `source:
 *    "interface"` so the bin logs it; none: `STATS_NO_ADVERTISE`, a usage error naming
 *    `--advertise`.
 */

/** A parsed `--advertise HOST[:PORT]` (IPv6 hosts without brackets). */
export interface AdvertiseAddress {
  /** Host name or IP address peers connect to. */
  host: string;
  /** Port peers connect to, 1..65535; absent: the bound port. */
  port?: number;
}

/** Where an advertised address came from (see {@link advertiseEndpoint}). */
export type AdvertiseSource = "advertise" | "bind" | "interface";

/** What {@link advertiseEndpoint} resolved. */
export interface Advertised {
  /** The endpoint to announce: the bound one with the advertised host (and port). */
  endpoint: string;
  /** The bound endpoint it came from. */
  bind: string;
  /** The advertised host ("" for a path endpoint such as `unix://`, which is announced as bound). */
  host: string;
  /** `advertise`: the flag; `bind`: the bind address itself; `interface`: picked from a wildcard. */
  source: AdvertiseSource;
  /** With `source: "interface"`: the interface's name. */
  interfaceName?: string;
}

/** Options of {@link advertiseEndpoint}. */
export interface AdvertiseOptions {
  /** The `--advertise` value (a string to parse or a parsed address); absent: the rule's default. */
  advertise?: string | AdvertiseAddress;
  /** The interface table (default `os.networkInterfaces`; tests pass their own). */
  interfaces?: () => NodeJS.Dict<NetworkInterfaceInfo[]>;
}

const HOSTNAME_RE =
  /^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;

/** True for a host that means "every interface": `0.0.0.0`, `::` (with or without brackets), `*`, empty. */
export function isWildcardHost(host: string): boolean {
  const h = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
  return h === "" || h === "*" || h === "0.0.0.0" || h === "::" || h === "0:0:0:0:0:0:0:0";
}

/**
 * Parses `--advertise HOST[:PORT]`: `10.0.0.5`, `10.0.0.5:5601`, `encoder.example`, `[fd00::5]:5601`,
 * `fd00::5`. A wildcard host, a bad host or a port outside 1..65535 throws `STATS_BAD_ADVERTISE`
 * naming `--advertise`.
 */
export function parseAdvertise(text: string): AdvertiseAddress {
  const bad = (why: string): never => {
    throw new StatsError(
      StatsErrorCode.BAD_ADVERTISE,
      `--advertise ${JSON.stringify(text)}: ${why}; expected HOST[:PORT] (e.g. 10.0.0.5 or [fd00::5]:5601)`,
    );
  };
  if (typeof text !== "string" || text.length === 0) return bad("empty");
  let host: string;
  let port: string | undefined;
  const v6 = /^\[([^\]]*)\](?::([0-9]{1,5}))?$/.exec(text);
  if (v6 !== null) {
    host = v6[1]!;
    port = v6[2];
    if (isIP(host) !== 6) return bad(`bad IPv6 address ${JSON.stringify(host)}`);
  } else if (isIP(text) === 6) {
    host = text;
  } else {
    const m = /^([^:[\]]*)(?::([0-9]{1,5}))?$/.exec(text);
    if (m === null) return bad("not HOST[:PORT]");
    host = m[1]!;
    port = m[2];
    if (/^[0-9.]+$/.test(host) ? isIP(host) !== 4 : !HOSTNAME_RE.test(host))
      return bad(`bad host ${JSON.stringify(host)}`);
  }
  if (isWildcardHost(host)) return bad("a wildcard is no address a peer can connect to");
  if (port === undefined) return { host };
  const n = Number(port);
  if (n < 1 || n > 65535) return bad(`port ${n} outside [1, 65535]`);
  return { host, port: n };
}

/** `[::1]` for IPv6 hosts, as endpoints spell them. */
function spell(host: string): string {
  return host.includes(":") ? `[${host}]` : host;
}

/** The first non-loopback address of an interface that is up: IPv4 first (only IPv4 when `v4Only`). */
function pickInterface(
  table: NodeJS.Dict<NetworkInterfaceInfo[]>,
  v4Only: boolean,
): { address: string; name: string } | null {
  for (const family of v4Only ? ["IPv4"] : ["IPv4", "IPv6"]) {
    for (const [name, addrs] of Object.entries(table)) {
      for (const a of addrs ?? []) {
        if (a.internal || a.family !== family) continue;
        if (family === "IPv6" && /^fe80:/i.test(a.address)) continue; // link-local needs a scope id
        return { address: a.address, name };
      }
    }
  }
  return null;
}

/**
 * Resolves the endpoint to announce for the bound endpoint `bind` (`scheme://host:port`, e.g.
 * `tls://0.0.0.0:5601` or `tcp://[::]:7878`) by the rule above. Path endpoints (`unix://`,
 * `ipc://`, `zmq+ipc://`, `inproc://`) are announced as bound. Throws `STATS_BAD_ADVERTISE` for a
 * bad `advertise`, `STATS_NO_ADVERTISE` for a wildcard bind with no usable interface (both usage
 * errors naming `--advertise`).
 */
export function advertiseEndpoint(bind: string, options: AdvertiseOptions = {}): Advertised {
  const m = /^([a-z][a-z0-9+.-]*):\/\/(\[[^\]]*\]|[^:/[\]]*):([0-9]{1,5})$/.exec(bind);
  if (m === null) return { endpoint: bind, bind, host: "", source: "bind" };
  const [, scheme, rawHost, boundPort] = m as unknown as [string, string, string, string];
  const adv = typeof options.advertise === "string" ? parseAdvertise(options.advertise) : options.advertise;
  const at = (host: string, port: number | string) => `${scheme}://${spell(host)}:${port}`;
  if (adv !== undefined) {
    return { endpoint: at(adv.host, adv.port ?? boundPort), bind, host: adv.host, source: "advertise" };
  }
  const host = rawHost.startsWith("[") ? rawHost.slice(1, -1) : rawHost;
  if (!isWildcardHost(host)) return { endpoint: bind, bind, host, source: "bind" };
  const picked = pickInterface((options.interfaces ?? networkInterfaces)(), host === "0.0.0.0");
  if (picked === null) {
    throw new StatsError(
      StatsErrorCode.NO_ADVERTISE,
      `bound to the wildcard ${bind} and no non-loopback interface is up to announce: give --advertise HOST[:PORT]`,
    );
  }
  return {
    endpoint: at(picked.address, boundPort),
    bind,
    host: picked.address,
    source: "interface",
    interfaceName: picked.name,
  };
}
