import { spawnSync } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promtoolCheck, scrape, spawnBin } from "@tapwire/testing";
import { expect, it } from "vitest";
import {
  ConsumerConnector,
  DATA_SERVER_DEFAULTS,
  EC_PRODUCER_DEFAULTS,
  EcAdminClient,
  HEARTBEAT_DEFAULTS,
  PRODUCER_DEFAULTS,
  PRODUCER_HEARTBEAT,
} from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import { PRODUCER_BIN, until } from "./helpers/proc.js";

it("tapwire-ec-producer: rejects a bad option with exit code 2 naming it", () => {
  const r = spawnSync(process.execPath, [PRODUCER_BIN, "--num-blocks", "zero"], {
    encoding: "utf8",
    timeout: 20_000,
  });
  expect(r.status).toBe(2);
  expect(r.stderr).toMatch(/--num-blocks: not a number: zero/);
  const r2 = spawnSync(process.execPath, [PRODUCER_BIN, "--block-bytes", "0"], {
    encoding: "utf8",
    timeout: 20_000,
  });
  expect(r2.status).toBe(2);
  expect(r2.stderr).toMatch(/--block-bytes: expected an integer/); // issue 19: the flag, not the option name
});

it("tapwire-ec-producer: prepopulates from a file, logs stats periodically, exits 0 on SIGINT", async () => {
  const file = join(tmpdir(), `ec-prepop-${process.pid}.txt`);
  writeFileSync(file, "# mm_hash nbytes\nimg-a 1000\nimg-b 70000\n");
  try {
    const child = await spawnBin(PRODUCER_BIN, ["--prepopulate-file", file, "--stats-interval-ms", "50"]);
    const listening = child.readyLine.json!;
    expect(listening["entries"]).toBe(2);
    expect(String(listening["control"])).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    expect(String(listening["data"])).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    await child.waitFor((l) => l.json?.["msg"] === "stats", 10_000);
    const admin = new EcAdminClient(String(listening["admin"]));
    expect(await admin.request("ping")).toEqual({ op: "pong" });
    expect(await admin.encode("img-c", 5000)).toBe("ready");
    expect(await admin.encode("img-c", 5000)).toBe("exists");
    expect(await admin.check()).toBeNull();
    admin.close();
    const exit = await child.kill("SIGINT");
    expect(exit.code).toBe(0);
    const closed = child.json.find((j) => j["msg"] === "closed")!;
    expect((closed["stats"] as { encodes: number }).encodes).toBe(3);
  } finally {
    rmSync(file, { force: true });
  }
});

it("tapwire-ec-producer --help states the defaults it runs with (one table for both)", () => {
  const r = spawnSync(process.execPath, [PRODUCER_BIN, "--help"], { encoding: "utf8", timeout: 20_000 });
  expect(r.status).toBe(0);
  const line = (flag: string) =>
    r.stdout.split("\n").find((l) => l.trimStart().startsWith(`--${flag} `)) ?? "";
  expect(line("num-blocks")).toContain(`(default ${EC_PRODUCER_DEFAULTS.numBlocks})`);
  expect(line("block-bytes")).toContain(`(default ${EC_PRODUCER_DEFAULTS.blockBytes})`);
  expect(line("admin")).toContain(`(default ${EC_PRODUCER_DEFAULTS.admin})`);
  expect(line("max-data-connections")).toContain(`(default ${DATA_SERVER_DEFAULTS.maxConnections})`);
  expect(line("data-idle-timeout-ms")).toContain(`(default ${DATA_SERVER_DEFAULTS.idleTimeoutMs})`);
  expect(line("pin-lease-ms")).toContain(`(default ${PRODUCER_DEFAULTS.pinLeaseMs})`);
  expect(line("max-pinned-fraction")).toContain(`(default ${PRODUCER_DEFAULTS.maxPinnedFraction})`);
  expect(line("heartbeat-ivl-ms")).toContain(`(default ${PRODUCER_HEARTBEAT.intervalMs})`);
  expect(line("heartbeat-timeout-ms")).toContain(`(default ${HEARTBEAT_DEFAULTS.timeoutMs})`);
});

it("tapwire-ec-producer: usage errors exit 2 with one line on stderr", () => {
  for (const args of [
    ["--bogus"],
    ["--metrics-listen", "http://x"],
    ["--log-level", "loud"],
    ["--num-blocks", "-1x"],
    ["--admin", "tcp://0.0.0.0:0"],
    ["--curve-keys", "/nonexistent/keys.json", "--curve-allow", "/nonexistent"],
    ["stray"],
  ]) {
    const r = spawnSync(process.execPath, [PRODUCER_BIN, ...args], { encoding: "utf8", timeout: 20_000 });
    expect(r.status, args.join(" ")).toBe(2);
    expect(r.stderr.trimEnd().split("\n"), args.join(" ")).toHaveLength(1);
    expect(r.stderr).toMatch(/^tapwire-ec-producer: /);
  }
});

it("tapwire-ec-producer: a negative number is a value, an unknown flag is named (the worker's parser rule)", () => {
  const cases: [string[], RegExp][] = [
    [["--num-blocks", "-1"], /--num-blocks: expected an integer in \[1, \d+\], got -1/],
    [["--num-blocks=-1"], /--num-blocks: .*got -1/],
    [["--bogus"], /unknown flag --bogus/],
    [["--bogus=1"], /unknown flag --bogus/],
    [["-x"], /unknown flag -x/],
    [["--num-blocks"], /--num-blocks needs a value/],
    [["--help=yes"], /--help takes no value/],
    [["--num-blocks", "4", "--num-blocks", "8"], /--num-blocks given twice/],
  ];
  for (const [args, re] of cases) {
    const r = spawnSync(process.execPath, [PRODUCER_BIN, ...args], { encoding: "utf8", timeout: 20_000 });
    expect(r.status, args.join(" ")).toBe(2);
    expect(r.stderr.trimEnd().split("\n"), args.join(" ")).toHaveLength(1);
    expect(r.stderr, args.join(" ")).toMatch(re);
    // node:util parseArgs' wording, which this bin no longer shows
    expect(r.stderr, args.join(" ")).not.toMatch(/ambiguous|To specify a positional argument/);
  }
});

it("tapwire-ec-producer --metrics-listen: Prometheus text (promtool-clean), /healthz, /readyz; one pid; closing before closed", async () => {
  const child = await spawnBin(PRODUCER_BIN, [
    "--metrics-listen",
    "tcp://127.0.0.1:0",
    "--prepopulate",
    "img:1000",
  ]);
  const listening = child.readyLine;
  // pid once, from pino's base (issue 15: the listening line repeated it)
  expect(listening.text.match(/"pid":/g)).toHaveLength(1);
  const base = `http://${String(listening.json!["metrics"]).slice("tcp://".length)}`;
  expect(base).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
  expect(await scrape(`${base}/healthz`)).toEqual({ status: 200, text: "ok\n" });
  expect(await scrape(`${base}/readyz`)).toEqual({ status: 200, text: "ready\n" });
  // a transfer so the histograms have samples
  const conn = await ConsumerConnector.create({
    numBlocks: 16,
    blockBytes: EC_PRODUCER_DEFAULTS.blockBytes,
    compatibility: String(listening.json!["compatibilityHash"]),
  });
  const d = new Driver(conn).start();
  expect(await d.fetch("img", String(listening.json!["control"]), 1000)).toBe("loaded");
  d.stop();
  await conn.close();
  const m = await until(async () => {
    const s = await scrape(`${base}/metrics`);
    return /tapwire_ec_producer_grant_seconds_count 1/.test(s.text) ? s : undefined;
  });
  expect(m.status).toBe(200);
  expect(m.text).toMatch(/tapwire_ec_producer_requests_total 1/);
  expect(m.text).toMatch(/tapwire_ec_producer_grant_seconds_bucket\{le="30"\} 1/);
  expect(m.text).toMatch(/tapwire_ec_data_sent_bytes_total 1000/);
  expect(m.text).toMatch(/tapwire_ec_producer_grants_refused_quota_total 0/);
  const lint = promtoolCheck(m.text);
  expect(lint.problems).toEqual([]);
  const exit = await child.kill("SIGTERM");
  expect(exit.code).toBe(0);
  const msgs = child.json.map((j) => j["msg"]);
  expect(msgs.indexOf("closing")).toBeGreaterThan(-1);
  expect(msgs.indexOf("closing")).toBeLessThan(msgs.indexOf("closed"));
});
