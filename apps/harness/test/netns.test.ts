// `--topology netns`: the engine, the worker and the encoder each in its own network namespace,
// joined through a router namespace by veth pairs, under every link profile CI runs (issue 19).
// Root only (CI is root); the file fails at once, saying so, when it is not.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isAlive, listNamespaces, requireRoot, waitUntil } from "@tapwire/testing";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { parseArgs } from "../src/index.js";
import { BIN, readReport, SMALL, startBin } from "./bin-helpers.js";

const dir = mkdtempSync(join(tmpdir(), "tapwire-harness-netns-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("--topology and --link flags", () => {
  const usage = (args: string[]) => {
    try {
      parseArgs(args);
    } catch (e) {
      return (e as { code?: string; message: string }).code === "HARNESS_USAGE" ? (e as Error).message : "";
    }
    return "accepted";
  };

  test("a bad link spec names the key; --link needs netns; unix sockets do not cross namespaces", () => {
    expect(usage(["--topology", "netns", "--link", "dealy=1ms"])).toMatch(/^--link: .*unknown key "dealy"/);
    expect(usage(["--topology", "netns", "--link", "rate=fast"])).toMatch(
      /^--link: .*rate "fast" is not a rate/,
    );
    expect(usage(["--link", "delay=1ms"])).toMatch(/--link "delay=1ms" needs --topology netns/);
    expect(usage(["--topology", "netns", "--draft-transport", "unix"])).toMatch(
      /does not cross network namespaces/,
    );
    expect(usage(["--topology", "netns", "--ec-data", "unix"])).toMatch(/does not cross network namespaces/);
    expect(usage(["--topology", "netns", "--link", "delay=0.5ms jitter=0.1ms rate=10gbit stall=0.1%"])).toBe(
      "accepted",
    );
  });

  test("a non-root operator gets exit 2 and a message saying netns needs root", async () => {
    const child = spawn(process.execPath, [BIN, "--topology", "netns", ...SMALL], {
      uid: 65534,
      gid: 65534,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let err = "";
    child.stderr.on("data", (d: Buffer) => {
      err += d.toString();
    });
    const code = await new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
    expect(code).toBe(2);
    expect(err).toMatch(/--topology netns needs root \(uid 0; this process runs as uid 65534\)/);
  });
});

describe("harness in network namespaces", () => {
  beforeAll(() => requireRoot("apps/harness/test/netns.test.ts"));

  // small runs: the four together stay well under two minutes on two busy cores
  const RUN = [...SMALL, "--topology", "netns", "--requests", "6", "--max-new-tokens", "24", "--rate", "0"];
  const profiles: Array<[name: string, link: string, relayed: boolean]> = [
    ["no impairment", "none", false],
    ["1 ms +- 0.2 ms delay", "delay=1ms jitter=0.2ms", true],
    ["1 Gbit/s", "rate=1gbit", false],
    ["stalls", "stall=5% stall_time=10ms seed=2", true],
  ];

  test.each(profiles)(
    "%s: lossless, every server at its own address, nothing left behind",
    async (_, link, relayed) => {
      const json = join(dir, `${link.replace(/\W+/g, "_")}.json`);
      const run = startBin([...RUN, "--link", link, "--json", json]);
      const { code } = await run.exited;
      const err = run.stderr.join("\n");
      expect(code, err).toBe(0);
      const r = readReport(json);
      // greedy output identical to target-only decoding, token for token
      expect(r.lossless).toMatchObject({ mode: "greedy", ok: true, mismatched: 0, checked: 6 });
      expect(r.speculation.draftsAccepted).toBeGreaterThan(0);
      expect(r.topology.kind).toBe("netns");
      const { engine, worker, encoder } = r.topology.hosts;
      expect(new Set([engine?.address, worker?.address, encoder?.address]).size).toBe(3);
      // each server bound 0.0.0.0 in its namespace and advertised its own address, as an operator
      // would; the engine dialled the advertised addresses
      const bound = (who: string, addr: string) =>
        new RegExp(
          `${who} pid \\d+ listening on tcp://${addr.replace(/\./g, "\\.")}:\\d+ \\(bound tcp://0\\.0\\.0\\.0:\\d+\\)`,
        );
      expect(err).toMatch(bound("worker", worker!.address));
      expect(err).toMatch(bound("encoder", encoder!.address));
      expect(err).toContain(`connecting to the worker at tcp://${worker!.address}:`);
      expect(r.ec.transfers).toBeGreaterThan(0);
      if (relayed) {
        // every byte to the servers crossed the relay in the router: worker, control, data, admin
        const relay = r.topology.relay!;
        expect(relay.map((f) => f.listen.split(":")[0]).sort()).toEqual(
          [worker!.address, encoder!.address, encoder!.address, encoder!.address].sort(),
        );
        expect(relay.reduce((a, f) => a + f.bytesDown, 0)).toBeGreaterThan(r.ec.bytes);
        if (link.startsWith("stall")) expect(relay.reduce((a, f) => a + f.stalls, 0)).toBeGreaterThan(0);
        else expect(r.latency.stepRtt.p50).toBeGreaterThanOrEqual(2 * (1 - 0.2));
      } else {
        expect(r.topology.relay).toBeNull();
      }
      // the supervisor removed its namespaces (named after its pid)
      const left = await listNamespaces();
      expect(left.filter((n) => n.startsWith(`twnet-${run.child.pid}-`))).toEqual([]);
      for (const h of [engine, worker, encoder]) expect(left).not.toContain(h!.netns);
    },
  );

  test("SIGKILL of the supervisor stops the run and its children; the next netns run removes the namespaces", async () => {
    const args = [...RUN, "--requests", "400", "--rate", "4", "--link", "delay=1ms"];
    const first = startBin(args);
    const started = await first.waitFor(/encoder pid (\d+) listening/, 60_000);
    const worker = Number((await first.waitFor(/worker pid (\d+) listening/))[1]);
    const encoder = Number(started[1]);
    const mine = (names: string[], pid: number) => names.filter((n) => n.startsWith(`twnet-${pid}-`));
    const left = mine(await listNamespaces(), first.child.pid!);
    expect(left).toHaveLength(4);
    first.child.kill("SIGKILL");
    await first.exited;
    // the run process sees its stdin close and stops everything it started
    await waitUntil(() => !isAlive(worker) && !isAlive(encoder), {
      timeoutMs: 30_000,
      what: "children gone",
    });
    // the namespaces stay until a netns run starts (here or, in CI, another test process)
    // the next netns run removes them before it builds its own, and SIGTERM ends it cleanly
    const next = startBin(args);
    await next.waitFor(/netns topology: engine/, 60_000);
    const now = await listNamespaces();
    for (const n of left) expect(now).not.toContain(n);
    await next.waitFor(/worker pid \d+ listening/, 60_000);
    next.child.kill("SIGTERM");
    expect((await next.exited).code).toBe(143);
    expect(mine(await listNamespaces(), next.child.pid!)).toEqual([]);
  });
});
