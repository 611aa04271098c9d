import { TestingError, TestingErrorCode } from "./errors.js";

/**
 * An impaired link between two network namespaces, parsed from a spec string such as
 * `"delay=0.5ms jitter=0.1ms rate=10gbit stall=0.1%"` by {@link parseLinkSpec}.
 *
 * `rate` (and `burst`) become a `tc qdisc ... tbf` on both ends of every veth; the rest is done by
 * the relay ({@link startRelay}) in the router namespace, per chunk of each TCP stream:
 * - `delay`: added **one way, in each direction** (so the round trip grows by twice `delay`); a
 *   lower bound, since timers never fire early and have a 1 ms granularity.
 * - `jitter`: each chunk's delay is `delay ± jitter` (uniform), never reordering a stream.
 * - `stall`: the probability per chunk that the stream pauses for `stall_time` before it.
 * - `relay=on|off`: whether the relay is in the path at all; on by default exactly when one of
 *   the three above is set (`relay=on` alone: the relay's own cost, a same-path baseline).
 */
export interface LinkSpec {
  /** One-way delay added in each direction, ms (`delay=`, default 0). */
  readonly delayMs: number;
  /** Uniform jitter around {@link LinkSpec.delayMs}, ms (`jitter=`, default 0, at most the delay). */
  readonly jitterMs: number;
  /** tbf rate on each veth, bits per second (`rate=`), or null for no shaping. */
  readonly rateBitsPerSec: number | null;
  /** tbf bucket size in bytes (`burst=`); null picks 1 ms at `rate`, within [16 KiB, 16 MiB]. */
  readonly burstBytes: number | null;
  /** Probability in [0, 1] that a chunk starts a stall (`stall=0.1%`, default 0). */
  readonly stallProbability: number;
  /** Length of one stall, ms (`stall_time=`, default {@link DEFAULT_STALL_MS}). */
  readonly stallMs: number;
  /** Seed of the relay's jitter and stall draws (`seed=`, default 1): runs are repeatable. */
  readonly seed: number;
  /** Whether connections to servers pass the relay (`relay=`; default: delay, jitter or stall set). */
  readonly relay: boolean;
}

/** Length of a stall when the spec names none (`stall_time=`), ms. */
export const DEFAULT_STALL_MS = 20;

/** A link with no impairment (`"none"` or `""`). */
export const LINK_NONE: LinkSpec = Object.freeze({
  delayMs: 0,
  jitterMs: 0,
  rateBitsPerSec: null,
  burstBytes: null,
  stallProbability: 0,
  stallMs: DEFAULT_STALL_MS,
  seed: 1,
  relay: false,
});

/** The keys a link spec accepts, in documentation order. */
export const LINK_SPEC_KEYS = [
  "delay",
  "jitter",
  "rate",
  "burst",
  "stall",
  "stall_time",
  "seed",
  "relay",
] as const;

const MAX_TIME_MS = 10_000;
const MIN_RATE = 8_000;
const MAX_RATE = 100e9;
const MIN_BURST = 1_600;
const MAX_BURST = 64 << 20;

const TIME_UNITS: Record<string, number> = { us: 0.001, ms: 1, s: 1000 };
const RATE_UNITS: Record<string, number> = { bit: 1, kbit: 1e3, mbit: 1e6, gbit: 1e9, tbit: 1e12 };
// tc's byte units: k/m are binary.
const SIZE_UNITS: Record<string, number> = { b: 1, kb: 1024, mb: 1 << 20 };

function unitValue(value: string, units: Record<string, number>): number | null {
  const m = /^(\d+(?:\.\d+)?|\.\d+)([a-z%]*)$/i.exec(value);
  if (m === null) return null;
  const scale = units[m[2]!.toLowerCase()];
  if (scale === undefined) return null;
  return Number(m[1]) * scale;
}

/**
 * Parses a link spec: space-separated `key=value` pairs, each key at most once, or `"none"` / `""`
 * for {@link LINK_NONE}. Keys: `delay`, `jitter`, `stall_time` (times: `us`, `ms`, `s`), `rate`
 * (`bit`, `kbit`, `mbit`, `gbit`, `tbit`, decimal as in tc), `burst` (`b`, `kb`, `mb`, binary as in
 * tc), `stall` (a percentage, `0.1%`), `seed` (an integer).
 *
 * @throws TestingError `TESTING_BAD_OPTION` naming the bad key and value (unknown, repeated,
 *   malformed, out of range, `jitter` above `delay`).
 */
export function parseLinkSpec(text: string): LinkSpec {
  if (typeof text !== "string") {
    throw new TestingError(TestingErrorCode.BAD_OPTION, "link spec must be a string");
  }
  const trimmed = text.trim();
  if (trimmed === "" || trimmed === "none") return LINK_NONE;
  const bad = (why: string) =>
    new TestingError(TestingErrorCode.BAD_OPTION, `link spec ${JSON.stringify(text)}: ${why}`);
  const seen = new Set<string>();
  let relay: boolean | null = null;
  const out = { ...LINK_NONE } as { -readonly [K in keyof LinkSpec]: LinkSpec[K] };
  for (const token of trimmed.split(/\s+/)) {
    const eq = token.indexOf("=");
    if (eq <= 0) throw bad(`${JSON.stringify(token)} is not key=value`);
    const key = token.slice(0, eq);
    const value = token.slice(eq + 1);
    if (!(LINK_SPEC_KEYS as readonly string[]).includes(key)) {
      throw bad(`unknown key ${JSON.stringify(key)} (known: ${LINK_SPEC_KEYS.join(", ")})`);
    }
    if (seen.has(key)) throw bad(`key ${key} given twice`);
    seen.add(key);
    const time = (): number => {
      const v = unitValue(value, TIME_UNITS);
      if (v === null) throw bad(`${key} ${JSON.stringify(value)} is not a time (e.g. 500us, 0.5ms, 1s)`);
      if (v > MAX_TIME_MS) throw bad(`${key} ${value} is above ${MAX_TIME_MS / 1000} s`);
      return v;
    };
    switch (key) {
      case "delay":
        out.delayMs = time();
        break;
      case "jitter":
        out.jitterMs = time();
        break;
      case "stall_time":
        out.stallMs = time();
        if (out.stallMs <= 0) throw bad(`stall_time ${value} must be above 0`);
        break;
      case "rate": {
        const v = unitValue(value, RATE_UNITS);
        if (v === null) throw bad(`rate ${JSON.stringify(value)} is not a rate (e.g. 10mbit, 1gbit)`);
        if (v < MIN_RATE || v > MAX_RATE) throw bad(`rate ${value} is not in [8kbit, 100gbit]`);
        out.rateBitsPerSec = v;
        break;
      }
      case "burst": {
        const v = unitValue(value, SIZE_UNITS);
        if (v === null || !Number.isInteger(v)) {
          throw bad(`burst ${JSON.stringify(value)} is not a whole size (e.g. 64kb, 1mb, 20000b)`);
        }
        if (v < MIN_BURST || v > MAX_BURST) throw bad(`burst ${value} is not in [1600b, 64mb]`);
        out.burstBytes = v;
        break;
      }
      case "stall": {
        const m = /^(\d+(?:\.\d+)?|\.\d+)%$/.exec(value);
        if (m === null) throw bad(`stall ${JSON.stringify(value)} is not a percentage (e.g. 0.1%)`);
        const p = Number(m[1]) / 100;
        if (p > 1) throw bad(`stall ${value} is above 100%`);
        out.stallProbability = p;
        break;
      }
      case "relay":
        if (value !== "on" && value !== "off") throw bad(`relay ${JSON.stringify(value)} is not on or off`);
        relay = value === "on";
        break;
      case "seed": {
        if (!/^\d{1,9}$/.test(value))
          throw bad(`seed ${JSON.stringify(value)} is not an integer in [0, 999999999]`);
        out.seed = Number(value);
        break;
      }
    }
  }
  if (out.jitterMs > out.delayMs) {
    throw bad(`jitter ${out.jitterMs} ms is above delay ${out.delayMs} ms (a delay never goes negative)`);
  }
  if (out.burstBytes !== null && out.rateBitsPerSec === null) throw bad("burst needs a rate");
  const impaired = out.delayMs > 0 || out.jitterMs > 0 || out.stallProbability > 0;
  if (relay === false && impaired) throw bad("relay=off cannot add delay, jitter or stalls");
  out.relay = relay ?? impaired;
  return Object.freeze(out);
}

/** The spec back as a string {@link parseLinkSpec} reads (keys that differ from none only). */
export function formatLinkSpec(spec: LinkSpec): string {
  const parts: string[] = [];
  if (spec.delayMs > 0) parts.push(`delay=${spec.delayMs}ms`);
  if (spec.jitterMs > 0) parts.push(`jitter=${spec.jitterMs}ms`);
  if (spec.rateBitsPerSec !== null) parts.push(`rate=${spec.rateBitsPerSec}bit`);
  if (spec.burstBytes !== null) parts.push(`burst=${spec.burstBytes}b`);
  if (spec.stallProbability > 0) parts.push(`stall=${spec.stallProbability * 100}%`);
  if (spec.stallMs !== DEFAULT_STALL_MS) parts.push(`stall_time=${spec.stallMs}ms`);
  if (spec.seed !== 1) parts.push(`seed=${spec.seed}`);
  if (spec.relay && !(spec.delayMs > 0 || spec.jitterMs > 0 || spec.stallProbability > 0))
    parts.push("relay=on");
  return parts.length === 0 ? "none" : parts.join(" ");
}

/** True when connections pass a relay: the spec asks for delay, jitter or stalls, or says `relay=on`. */
export function linkNeedsRelay(spec: LinkSpec): boolean {
  return spec.relay;
}

/** The tbf bucket of a shaped link, bytes: the spec's `burst`, or 1 ms at `rate` within [16 KiB, 16 MiB]. */
export function tbfBurstBytes(spec: LinkSpec): number {
  if (spec.burstBytes !== null) return spec.burstBytes;
  const rate = spec.rateBitsPerSec ?? 0;
  return Math.min(16 << 20, Math.max(16 << 10, Math.ceil(rate / 8 / 1000)));
}
