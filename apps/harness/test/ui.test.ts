/**
 * The live view (`--ui`, issue 24) in a real headless Chromium (/usr/bin/chromium driven by
 * playwright-core): `pnpm start`'s bin serves the page during the run, Server-Sent Events update
 * it at least once a second, and at the end the per-position acceptance it shows equals the
 * final JSON report. The test writes a screenshot to apps/harness/test-output/ui.png.
 */
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { chromium } from "playwright-core";
import { afterAll, expect, test } from "vitest";
import { readReport, startBin } from "./bin-helpers.js";

const dir = mkdtempSync(join(tmpdir(), "tapwire-ui-"));
const OUT = join(import.meta.dirname, "..", "test-output");
const started: Array<{ kill(sig?: NodeJS.Signals): unknown; exitCode: number | null }> = [];
afterAll(() => {
  // a failed test must not leave a lingering harness behind
  for (const c of started) if (c.exitCode === null) c.kill("SIGTERM"); // the harness stops its children
  rmSync(dir, { recursive: true, force: true });
});

test("pnpm start -- --ui: the page in headless Chromium updates live and ends with the report's numbers", async () => {
  const json = join(dir, "report.json");
  // Chromium first: launching it can take longer than the run on a loaded machine, and the view
  // lingers only while a page is open (--ui-linger-ms).
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox"] });
  const run = startBin([
    "--requests",
    "48",
    "--rate",
    "6",
    "--progress",
    "off",
    "--step-timeout-ms",
    "20000",
    "--ui",
    "--ui-listen",
    "127.0.0.1:0",
    "--ui-linger-ms",
    "120000",
    "--json",
    json,
  ]);
  started.push(run.child);
  const url = (await run.waitFor(/live view on (http:\/\/\S+)/, 60_000))[1]!;
  let shown: number[] = [];
  let lossless = "";
  try {
    const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
    // The URL is printed once the server listens; a refused first attempt under load is retried
    // (bounded), and a harness that died is named with its exit code.
    for (let i = 0; ; i++) {
      try {
        await page.goto(url);
        break;
      } catch (e) {
        if (i >= 20 || run.child.exitCode !== null)
          throw new Error(`live view ${url}: ${(e as Error).message}; harness exit ${run.child.exitCode}`);
        await new Promise((r) => setTimeout(r, 250));
      }
    }
    await page.waitForSelector("#acc-pos .acc", { timeout: 120_000 });
    // Server-Sent Events at least once a second while the run goes (2 Hz is sent)
    // (page-side code as strings: this package's tsconfig has no DOM types)
    const events = async () => Number(await page.evaluate("document.body.dataset.events ?? 0"));
    const final = async () =>
      (await page.evaluate('document.getElementById("status").dataset.final')) === "1";
    const e0 = await events();
    const t0 = Date.now();
    await page.waitForTimeout(3000);
    if (!(await final())) {
      const rate = ((await events()) - e0) / ((Date.now() - t0) / 1000);
      expect(rate).toBeGreaterThanOrEqual(1);
    }
    await page.waitForSelector('#status[data-final="1"]', { timeout: 180_000 });
    shown = (await page.evaluate(
      '[...document.querySelectorAll("#acc-pos .acc")].map((e) => Number(e.dataset.value))',
    )) as number[];
    lossless = String(await page.evaluate('document.getElementById("summary").dataset.lossless ?? ""'));
    // the charts are drawn: bars in the acceptance, depth and RTT charts
    for (const id of ["#acc-chart", "#depth-chart", "#rtt-chart", "#roundh-chart", "#round-chart"]) {
      expect(await page.$$eval(`${id} rect`, (r) => r.length), id).toBeGreaterThan(0);
    }
    mkdirSync(OUT, { recursive: true });
    const png = join(OUT, "ui.png");
    await page.screenshot({ path: png, fullPage: true });
    console.log(`live view screenshot: ${png}`);
  } finally {
    await browser.close();
  }
  // the browser is gone: the run stops lingering, writes its report and exits
  const { code } = await run.exited;
  expect(code, run.stderr.join("\n")).toBe(0);
  const report = readReport(json);
  expect(report.specDecode).toBeDefined();
  expect(shown).toEqual(report.specDecode!.acceptanceByPosition);
  expect(shown.length).toBe(4);
  expect(shown[0]!).toBeGreaterThan(0);
  expect(lossless).toBe(report.lossless.ok ? "ok" : "failed");
}, 300_000);

test("tapwire-worker --ui: a page of its own metrics, live, in headless Chromium", async () => {
  const { spawnBin } = await import("@tapwire/testing");
  const { RemoteDraftClient } = await import("@tapwire/client");
  const { createRequire } = await import("node:module");
  const req = createRequire(import.meta.url);
  const workerBin = join(dirname(req.resolve("@tapwire/worker/package.json")), "dist", "bin", "worker.js");
  const w = await spawnBin(workerBin, [
    "--drafter",
    "null",
    "--listen",
    "tcp://127.0.0.1:0",
    "--metrics-listen",
    "tcp://127.0.0.1:0",
    "--ui",
    "--log-level",
    "warn",
  ]);
  const metricsUrl = String(w.readyLine.json?.["metrics"]);
  const pageUrl = metricsUrl.replace(/\/metrics$/, "/");
  const endpoint = ((w.readyLine.json?.["endpoints"] ?? []) as string[])[0]!;
  const client = new RemoteDraftClient({
    endpoint,
    window: 16,
    numSpec: 4,
    numTaps: 3,
    hidden: 1024,
    vocabSize: 2048,
    maxSlots: 4,
    maxRowsPerStep: 64,
    drafterIdentity: new Uint8Array(32),
    markovIdentity: new Uint8Array(32),
  });
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox"] });
  try {
    expect(await client.waitReady(20_000)).toBe(true);
    const page = await browser.newPage();
    await page.goto(pageUrl);
    await page.waitForSelector("#counters tr", { timeout: 30_000 });
    for (let i = 0; i < 5; i++) await client.ping();
    // the page follows the worker's counters: the PINGs show up within a few events
    const pings = async () =>
      Number(
        await page.evaluate(
          '[...document.querySelectorAll("#counters tr")].filter((r) => /ping/.test(r.dataset.name)).map((r) => Number(r.children[1].textContent)).reduce((a, b) => a + b, 0)',
        ),
      );
    const end = Date.now() + 20_000;
    while ((await pings()) < 5 && Date.now() < end) await page.waitForTimeout(200);
    expect(await pings()).toBeGreaterThanOrEqual(5);
    mkdirSync(OUT, { recursive: true });
    await page.screenshot({ path: join(OUT, "worker-ui.png"), fullPage: true });
  } finally {
    await browser.close();
    await client.close();
    await w.kill("SIGTERM");
  }
}, 120_000);
