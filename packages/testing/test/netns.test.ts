// Network namespaces, veth pairs, tbf and the relay: real kernel objects, real processes inside
// them. Root only (CI is root): the file fails at once, saying so, when it is not.
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import type { ChildHandle, StarTopology } from "../src/index.js";
import {
  createStarTopology,
  devCounters,
  isAlive,
  killAllChildren,
  listNamespaces,
  NETNS_PREFIX,
  relayLeafPort,
  requireRoot,
  runNetCommand,
  spawnBin,
  startRelay,
  waitUntil,
} from "../src/index.js";

const TOOL = fileURLToPath(new URL("./fixtures/ns-tool.mjs", import.meta.url));
const OWNER = fileURLToPath(new URL("./fixtures/ns-owner.mjs", import.meta.url));
const DIST_INDEX = fileURLToPath(new URL("../dist/index.js", import.meta.url));

beforeAll(() => requireRoot("packages/testing/test/netns.test.ts"));

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
  await killAllChildren();
});
afterAll(killAllChildren);

async function star(link: string): Promise<StarTopology> {
  const t = await createStarTopology({ leaves: ["client", "server"], link });
  cleanups.push(() => t.close());
  return t;
}

/** Runs the tool in `netns` until its "done" line. */
async function runClient(netns: string, args: string[]): Promise<Record<string, unknown>> {
  const c = await spawnBin(TOOL, args, {
    netns,
    ready: (l) => l.json?.msg === "done" || l.json?.msg === "error",
    timeoutMs: 60_000,
  });
  expect(c.readyLine.json?.msg, c.output()).toBe("done");
  return c.readyLine.json!;
}

async function server(t: StarTopology, mode: "echo" | "sink"): Promise<{ h: ChildHandle; port: number }> {
  const leaf = t.leaf("server");
  const h = await spawnBin(TOOL, [mode, leaf.address], { netns: leaf.netns });
  return { h, port: h.readyLine.json!.port as number };
}

function rootLinks(): string {
  return execFileSync("ip", ["-o", "link", "show"], { encoding: "utf8" });
}

describe("netns: root check", () => {
  test("a non-root caller gets TESTING_NOT_ROOT naming what needed root", () => {
    // a real non-root process: node dropping to uid 65534 before asking
    const script = `process.setuid(65534); const m = await import(${JSON.stringify(DIST_INDEX)});
      try { await m.createStarTopology({ leaves: ["a"] }); } catch (e) { console.log(e.code + " " + e.message); }`;
    const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" });
    expect(out).toMatch(
      /^TESTING_NOT_ROOT a star topology of network namespaces needs root \(uid 0; this process runs as uid 65534\)/,
    );
  });
});

describe("netns: a star of namespaces", () => {
  test("bytes cross the veths between two namespaces at their real addresses (no relay)", async () => {
    const t = await star("none");
    expect(t.plan.relayed).toEqual([]);
    const srv = t.leaf("server");
    const cli = t.leaf("client");
    expect(srv.address).toMatch(/^198\.1[89]\./);
    const { h, port } = await server(t, "echo");
    const before = await devCounters(srv.netns, srv.dev);
    const r = await runClient(cli.netns, ["ping", srv.address, String(port), "20"]);
    expect((r.rtts as number[]).length).toBe(20);
    // the server saw the client's own address: routed by the hub, no proxy in between
    const conn = await h.waitFor((l) => l.json?.msg === "connection");
    expect(conn.json).toMatchObject({ remoteAddress: cli.address, localAddress: srv.address });
    const after = await devCounters(srv.netns, srv.dev);
    expect(after.rxBytes - before.rxBytes).toBeGreaterThanOrEqual(20 * 64);
    expect(after.txBytes - before.txBytes).toBeGreaterThanOrEqual(20 * 64);
  });

  test("the relay adds its delay in each direction: every round trip is at least 2 x (delay - jitter)", async () => {
    const t = await star("delay=6ms jitter=1ms seed=7");
    expect(t.plan.relayed).toEqual(["server"]);
    const srv = t.leaf("server");
    const relay = await startRelay({ netns: t.plan.hub.netns, link: t.plan.link });
    cleanups.push(() => relay.close());
    const { h, port } = await server(t, "echo");
    await relayLeafPort(relay, srv, port);
    const r = await runClient(t.leaf("client").netns, ["ping", srv.address, String(port), "15"]);
    const rtts = r.rtts as number[];
    expect(rtts.length).toBe(15);
    expect(Math.min(...rtts)).toBeGreaterThanOrEqual(2 * (6 - 1));
    // the client dialled the server's address; the server sees the relay in the hub
    const conn = await h.waitFor((l) => l.json?.msg === "connection");
    expect(conn.json).toMatchObject({ remoteAddress: srv.hubAddress, localAddress: srv.address });
    const [fwd] = await relay.stats();
    expect(fwd!.listen).toBe(`${srv.address}:${port}`);
    expect(fwd!.stats.bytesUp).toBe(15 * 64);
    expect(fwd!.stats.bytesDown).toBe(15 * 64);
    expect(fwd!.stats.link.delayed).toBeGreaterThanOrEqual(30);
  });

  test("stalls pause the stream for stall_time and are counted", async () => {
    const t = await star("stall=30% stall_time=40ms seed=3");
    const srv = t.leaf("server");
    const relay = await startRelay({ netns: t.plan.hub.netns, link: t.plan.link });
    cleanups.push(() => relay.close());
    const { port } = await server(t, "echo");
    await relayLeafPort(relay, srv, port);
    const r = await runClient(t.leaf("client").netns, ["ping", srv.address, String(port), "20"]);
    const [fwd] = await relay.stats();
    expect(fwd!.stats.link.stalls).toBeGreaterThan(0);
    expect(Math.max(...(r.rtts as number[]))).toBeGreaterThanOrEqual(40);
  });

  test("tbf limits throughput far below the veth's line rate", async () => {
    const t = await star("rate=4mbit");
    const srv = t.leaf("server");
    const qdisc = await runNetCommand("tc", ["-n", srv.netns, "qdisc", "show", "dev", srv.dev]);
    expect(qdisc).toMatch(/tbf .*rate 4Mbit/);
    const { port } = await server(t, "sink");
    const bytes = 1 << 20;
    const r = await runClient(t.leaf("client").netns, ["blast", srv.address, String(port), String(bytes)]);
    expect(r.bytes).toBe(bytes);
    // 4 Mbit/s is 500 kB/s; an unshaped veth moves hundreds of MB/s. Load only slows it further.
    expect(r.bytesPerSec as number).toBeLessThan(1.5 * 500_000);
  });

  test("close removes every namespace, veth and process it made; a failed build removes its part", async () => {
    const t = await createStarTopology({ leaves: ["client", "server"], link: "rate=1gbit delay=1ms" });
    const names = [t.plan.hub.netns, ...t.plan.leaves.map((l) => l.netns)];
    const relay = await startRelay({ netns: t.plan.hub.netns, link: t.plan.link });
    const { h } = await server(t, "echo");
    expect(await listNamespaces()).toEqual(expect.arrayContaining(names));
    await t.close();
    const left = await listNamespaces();
    for (const n of names) expect(left).not.toContain(n);
    await waitUntil(() => !isAlive(h.pid) && !isAlive(relay.child.pid), {
      what: "processes in the namespaces gone",
    });
    // the veths lived only inside the namespaces: none ever showed up here
    expect(rootLinks()).not.toMatch(/to-client|to-server/);

    const mine = (l: string[]) => l.filter((n) => n.startsWith(`${NETNS_PREFIX}${process.pid}-`));
    const before = mine(await listNamespaces());
    await expect(createStarTopology({ leaves: ["client", "Bad Role"] })).rejects.toMatchObject({
      code: "TESTING_BAD_OPTION",
    });
    expect(mine(await listNamespaces())).toEqual(before);
  });

  test("after SIGKILL of the run that made them, the next start removes its namespaces and processes", async () => {
    const owner = await spawnBin(OWNER, ["own", TOOL], { timeoutMs: 60_000 });
    const { namespaces, pids } = owner.readyLine.json as { namespaces: string[]; pids: number[] };
    expect(namespaces).toHaveLength(3);
    await owner.kill("SIGKILL");
    // A crash leaves the namespaces and the server running inside one. Not asserted: another test
    // process starting now (CI runs packages side by side) may sweep them first, which is the
    // behaviour under test too; without the sweep they stay and the checks below fail.
    const again = await spawnBin(OWNER, ["sweep"], { timeoutMs: 60_000 });
    await again.exited;
    const left = await listNamespaces();
    for (const n of namespaces) expect(left).not.toContain(n);
    expect(left).not.toContain(again.readyLine.json!.probe);
    await waitUntil(() => pids.every((p) => !isAlive(p)), { what: "the dead run's processes gone" });
    expect(rootLinks()).not.toMatch(/to-client|to-server/);
  });
});
