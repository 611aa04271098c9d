import { describe, expect, test } from "vitest";
import {
  budgetFromCurve,
  DEFAULTS,
  FAULT_DEFAULTS,
  helpText,
  metricsListenOf,
  parseArgs,
  SAMPLE_DEFAULTS,
} from "../src/cli/cli.js";
import { HarnessError } from "../src/errors.js";

function cfg(args: string[]) {
  const r = parseArgs(args);
  if (r.help) throw new Error("unexpected help");
  return r.config;
}

function usageError(args: string[]): string {
  try {
    parseArgs(args);
  } catch (e) {
    expect(e).toBeInstanceOf(HarnessError);
    expect((e as HarnessError).code).toBe("HARNESS_USAGE");
    return (e as Error).message;
  }
  throw new Error(`no error for ${args.join(" ")}`);
}

describe("flags", () => {
  test("defaults, both value syntaxes, row shorthand, booleans", () => {
    expect(cfg([])).toEqual({ ...DEFAULTS });
    const c = cfg([
      "--slots",
      "4",
      "--num-spec=6",
      "--row",
      "3x4096",
      "--draft-transport",
      "zmq",
      "--faults",
      "--json",
      "out.json",
    ]);
    expect(c.slots).toBe(4);
    expect(c.numSpec).toBe(6);
    expect(c.numTaps).toBe(3);
    expect(c.hidden).toBe(4096);
    expect(c.draftTransport).toBe("zmq");
    expect(c.faults).toBe(true);
    expect(c.json).toBe("out.json");
    expect(cfg(["--budget", "12"]).budget).toBe(12);
    expect(cfg(["--budget", "auto"]).budget).toBeNull();
    expect(cfg(["--load-curve", "1:4, 8:16"]).loadCurve).toEqual([
      { batch: 1, tokens: 4 },
      { batch: 8, tokens: 16 },
    ]);
    expect(cfg(["--metrics-port", "9464"]).metricsPort).toBe(9464);
    expect(metricsListenOf(cfg(["--metrics-port", "9464"]))).toBe("tcp://127.0.0.1:9464");
    expect(cfg(["--metrics-listen", "tcp://[::1]:0"]).metricsListen).toBe("tcp://[::1]:0");
    expect(metricsListenOf(cfg(["--metrics-listen", "tcp://0.0.0.0:1", "--metrics-port", "2"]))).toBe(
      "tcp://0.0.0.0:1",
    );
    expect(metricsListenOf(cfg([]))).toBeNull();
  });

  test("--sample changes only the defaults that were not given", () => {
    const c = cfg(["--sample", "--requests", "50"]);
    expect(c.sample).toBe(true);
    expect(c.requests).toBe(50);
    expect(c.maxNewTokens).toBe(SAMPLE_DEFAULTS.maxNewTokens);
    expect(c.slots).toBe(SAMPLE_DEFAULTS.slots);
  });

  test("--faults changes its defaults, leaving given flags and --sample's own alone", () => {
    const f = cfg(["--faults", "--rate", "9"]);
    expect(f.rate).toBe(9);
    expect(f.stepTimeoutMs).toBe(FAULT_DEFAULTS.stepTimeoutMs);
    expect(f.mediaPool).toBe(FAULT_DEFAULTS.mediaPool);
    const both = cfg(["--faults", "--sample"]);
    expect(both.rate).toBe(SAMPLE_DEFAULTS.rate);
    expect(both.mediaPool).toBe(SAMPLE_DEFAULTS.mediaPool);
    expect(both.stepTimeoutMs).toBe(FAULT_DEFAULTS.stepTimeoutMs);
  });

  test("every bad input is refused naming the flag", () => {
    expect(usageError(["--bogus"])).toMatch(/unknown flag "--bogus"/);
    expect(usageError(["--slots"])).toMatch(/--slots: missing value/);
    expect(usageError(["--slots", "0"])).toMatch(/--slots: 0 outside/);
    expect(usageError(["--slots", "2.5"])).toMatch(/--slots: expected an integer/);
    expect(usageError(["--num-spec", "33"])).toMatch(/--num-spec: 33 outside/);
    expect(usageError(["--window", "5000"])).toMatch(/--window/);
    expect(usageError(["--draft-transport", "udp"])).toMatch(
      /--draft-transport: "udp" is not one of tcp, unix, zmq, tls, shm/,
    );
    expect(usageError(["--ec-data", "zmq"])).toMatch(/--ec-data/);
    expect(usageError(["--mm-share", "1.5"])).toMatch(/--mm-share: 1.5 outside/);
    expect(usageError(["--rate", "abc"])).toMatch(/--rate: expected a number/);
    expect(usageError(["--row", "3by4"])).toMatch(/--row: expected TAPSxHIDDEN/);
    expect(usageError(["--metrics-port", "70000"])).toMatch(/--metrics-port/);
    expect(usageError(["--metrics-listen", "tcp://127.0.0.1"])).toMatch(
      /--metrics-listen: .*tcp:\/\/HOST:PORT/,
    );
    expect(usageError(["--metrics-listen", "http://x:1"])).toMatch(/--metrics-listen: .*no tcp:\/\/ scheme/);
    expect(usageError(["--budget", "0"])).toMatch(/--budget/);
    expect(usageError(["--load-curve", "8:1,4:2"])).toMatch(/batch 4 not above the previous 8/);
    expect(usageError(["--load-curve", "x"])).toMatch(/not BATCH:TOKENS/);
    expect(usageError(["--top-k", "40"])).toMatch(/--top-k/);
    expect(usageError(["--embedding-bytes", "101"])).toMatch(/--embedding-bytes/);
    expect(usageError(["--slots", "1024", "--window", "4096", "--row", "16x16384"])).toMatch(/1 GiB/);
  });

  test("--help lists every flag with its default", () => {
    expect(parseArgs(["--help"])).toEqual({ help: true });
    expect(parseArgs(["-h"])).toEqual({ help: true });
    expect(parseArgs(["--", "--help"])).toEqual({ help: true });
    const h = helpText();
    for (const f of [
      "--slots",
      "--num-spec",
      "--window",
      "--num-taps",
      "--hidden",
      "--draft-transport",
      "--ec-data",
      "--requests",
      "--rate",
      "--max-new-tokens",
      "--mm-share",
      "--sample",
      "--seed",
      "--faults",
      "--metrics-port",
      "--metrics-listen",
      "--json",
      "--budget",
      "--load-curve",
    ]) {
      expect(h).toContain(f);
    }
    expect(h).toContain("[8]"); // slots default
  });

  test("the load curve interpolates linearly and is flat outside", () => {
    const curve = [
      { batch: 1, tokens: 8 },
      { batch: 8, tokens: 22 },
    ];
    expect(budgetFromCurve(curve, 1)).toBe(8);
    expect(budgetFromCurve(curve, 4)).toBe(14);
    expect(budgetFromCurve(curve, 100)).toBe(22);
    expect(budgetFromCurve([], 3)).toBe(Number.MAX_SAFE_INTEGER);
  });
});
