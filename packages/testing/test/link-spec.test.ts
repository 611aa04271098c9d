// Link specs (the --link flag of the netns topology) and the fault proxy's link impairment on
// loopback. No root needed.
import { connect } from "node:net";
import { afterEach, describe, expect, test } from "vitest";
import type { LinkImpairment } from "../src/index.js";
import {
  DEFAULT_STALL_MS,
  formatLinkSpec,
  LINK_NONE,
  linkNeedsRelay,
  parseLinkSpec,
  startEchoServer,
  startFaultProxy,
  tbfBurstBytes,
} from "../src/index.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

describe("parseLinkSpec", () => {
  test("reads the issue's example and every unit", () => {
    expect(parseLinkSpec("delay=0.5ms jitter=0.1ms rate=10gbit stall=0.1%")).toEqual({
      delayMs: 0.5,
      jitterMs: 0.1,
      rateBitsPerSec: 10e9,
      burstBytes: null,
      stallProbability: 0.001,
      stallMs: DEFAULT_STALL_MS,
      seed: 1,
      relay: true,
    });
    expect(parseLinkSpec("  delay=250us   rate=8kbit burst=2kb stall_time=1s seed=42 ")).toMatchObject({
      delayMs: 0.25,
      rateBitsPerSec: 8000,
      burstBytes: 2048,
      stallMs: 1000,
      seed: 42,
    });
    expect(parseLinkSpec("rate=1mbit burst=1mb").burstBytes).toBe(1 << 20);
    expect(parseLinkSpec("delay=1s").delayMs).toBe(1000);
    expect(parseLinkSpec("")).toBe(LINK_NONE);
    expect(parseLinkSpec("none")).toBe(LINK_NONE);
  });

  test.each([
    [
      "dealy=1ms",
      /unknown key "dealy" \(known: delay, jitter, rate, burst, stall, stall_time, seed, relay\)/,
    ],
    ["relay=yes", /relay "yes" is not on or off/],
    ["delay=1ms relay=off", /relay=off cannot add delay, jitter or stalls/],
    ["delay", /"delay" is not key=value/],
    ["=1ms", /"=1ms" is not key=value/],
    ["delay=1ms delay=2ms", /key delay given twice/],
    ["delay=fast", /delay "fast" is not a time/],
    ["delay=1", /delay "1" is not a time/],
    ["delay=11s", /delay 11s is above 10 s/],
    ["jitter=1ms", /jitter 1 ms is above delay 0 ms/],
    ["delay=1ms jitter=2ms", /jitter 2 ms is above delay 1 ms/],
    ["rate=10gbps", /rate "10gbps" is not a rate/],
    ["rate=1bit", /rate 1bit is not in \[8kbit, 100gbit\]/],
    ["rate=1tbit", /rate 1tbit is not in \[8kbit, 100gbit\]/],
    ["burst=64kb", /burst needs a rate/],
    ["rate=1gbit burst=1b", /burst 1b is not in \[1600b, 64mb\]/],
    ["rate=1gbit burst=0.5b", /burst "0.5b" is not a whole size/],
    ["stall=0.1", /stall "0.1" is not a percentage/],
    ["stall=101%", /stall 101% is above 100%/],
    ["stall_time=0ms", /stall_time 0ms must be above 0/],
    ["seed=-1", /seed "-1" is not an integer/],
  ])("%s is refused, naming the key", (spec, message) => {
    let err: unknown;
    try {
      parseLinkSpec(spec);
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ code: "TESTING_BAD_OPTION" });
    expect((err as Error).message).toMatch(message);
    expect((err as Error).message).toContain(JSON.stringify(spec));
  });

  test("format round-trips; relay and burst derived from the spec", () => {
    for (const s of [
      "none",
      "delay=1ms jitter=0.2ms",
      "rate=1000000000bit",
      "stall=2% stall_time=5ms seed=9",
      "relay=on",
    ]) {
      expect(formatLinkSpec(parseLinkSpec(s))).toBe(s);
    }
    expect(linkNeedsRelay(parseLinkSpec("rate=1gbit"))).toBe(false);
    expect(linkNeedsRelay(parseLinkSpec("delay=1ms"))).toBe(true);
    expect(linkNeedsRelay(parseLinkSpec("stall=1%"))).toBe(true);
    expect(linkNeedsRelay(parseLinkSpec("relay=on"))).toBe(true);
    expect(linkNeedsRelay(parseLinkSpec("delay=0ms"))).toBe(false);
    expect(tbfBurstBytes(parseLinkSpec("rate=1gbit"))).toBe(125_000);
    expect(tbfBurstBytes(parseLinkSpec("rate=4mbit"))).toBe(16 << 10);
    expect(tbfBurstBytes(parseLinkSpec("rate=100gbit"))).toBe(12_500_000);
    expect(tbfBurstBytes(parseLinkSpec("rate=4mbit burst=3000b"))).toBe(3000);
  });
});

describe("fault proxy: link impairment", () => {
  async function rtts(impairment: LinkImpairment, n: number) {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const proxy = await startFaultProxy(echo.target, { impairment });
    cleanups.push(() => proxy.close());
    const s = connect({ host: "127.0.0.1", port: proxy.port, noDelay: true });
    cleanups.push(async () => void s.destroy());
    await new Promise((r) => s.once("connect", r));
    const out: number[] = [];
    for (let i = 0; i < n; i++) {
      const t0 = performance.now();
      const got = new Promise((r) => s.once("data", r));
      s.write(Buffer.from([i]));
      await got;
      out.push(performance.now() - t0);
    }
    return { out, proxy };
  }

  test("delay applies in each direction: round trips of at least 2 x delay", async () => {
    const { out, proxy } = await rtts(
      { delayMs: 8, jitterMs: 0, stallProbability: 0, stallMs: 20, seed: 1 },
      10,
    );
    expect(Math.min(...out)).toBeGreaterThanOrEqual(16);
    expect(proxy.stats.link).toEqual({ delayed: 20, stalls: 0 });
  });

  test("stalls with their probability, repeatable from the seed", async () => {
    const imp = { delayMs: 0, jitterMs: 0, stallProbability: 0.25, stallMs: 30, seed: 11 };
    const a = await rtts(imp, 16);
    const b = await rtts(imp, 16);
    expect(a.proxy.stats.link.stalls).toBeGreaterThan(0);
    expect(a.proxy.stats.link.stalls).toBe(b.proxy.stats.link.stalls);
    expect(Math.max(...a.out)).toBeGreaterThanOrEqual(30);
  });

  test("listens on the given host and refuses bad impairments naming the field", async () => {
    const echo = await startEchoServer();
    cleanups.push(() => echo.close());
    const p = await startFaultProxy(echo.target, { host: "127.0.0.2" });
    cleanups.push(() => p.close());
    expect(p.endpoint).toBe(`tcp://127.0.0.2:${p.port}`);
    const bad = (impairment: object) =>
      startFaultProxy(echo.target, {
        impairment: { delayMs: 1, jitterMs: 0, stallProbability: 0, stallMs: 1, seed: 1, ...impairment },
      });
    await expect(bad({ delayMs: -1 })).rejects.toThrow(/impairment: delayMs -1/);
    await expect(bad({ jitterMs: 2 })).rejects.toThrow(/impairment: jitterMs 2 is above delayMs 1/);
    await expect(bad({ stallProbability: 2 })).rejects.toThrow(/stallProbability 2 is not in \[0, 1\]/);
    await expect(startFaultProxy(echo.target, { host: "" })).rejects.toThrow(/option host/);
  });
});
