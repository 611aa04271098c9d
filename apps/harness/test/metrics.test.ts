/**
 * The harness's metrics and health endpoint (issue 15 item 1), driven in-process through the
 * run hooks so that each check meets the phase it is about: /healthz and /readyz while starting,
 * /readyz and the worker's metrics while decoding, all of it through the real promtool.
 */
import { parsePrometheus, promtoolCheck, sampleValue } from "@tapwire/testing";
import { expect, test } from "vitest";
import { parseArgs } from "../src/cli/cli.js";
import { runHarness } from "../src/run.js";
import { loadDashboard, nameProblems, promqlProblems, structureProblems } from "./dashboard.js";

test("--metrics-listen: /healthz up at once, /readyz 503 while starting and 200 while decoding; /metrics has the worker's metrics and passes promtool; the dashboard's names are all live", async () => {
  const parsed = parseArgs([
    "--row",
    "2x512",
    "--requests",
    "6",
    "--mm-share",
    "0.5",
    "--progress",
    "off",
    "--metrics-listen",
    "tcp://127.0.0.1:0",
    // vLLM's own prefix has a colon, which promtool's lint flags (vllm-metrics.test.ts covers it)
    "--metrics-engine-prefix",
    "vllm_",
  ]);
  if (parsed.help) throw new Error("help");
  let base = "";
  let encoderUrl = "";
  const seen: Record<string, { status: number; body: string }> = {};
  const get = async (path: string) => {
    const r = await fetch(`${base}${path}`);
    return { status: r.status, body: await r.text() };
  };
  const { report, exitCode } = await runHarness(parsed.config, {
    log: () => {},
    onMetrics: async (port) => {
      base = `http://127.0.0.1:${port}`;
      seen["startHealth"] = await get("/healthz");
      seen["startReady"] = await get("/readyz");
    },
    onEncoderMetrics: (url) => {
      encoderUrl = url;
    },
    onDecoding: async () => {
      seen["decodeReady"] = await get("/readyz");
      seen["metrics"] = await get("/metrics");
    },
    onDecoded: async () => {
      // every metric has moved by now (EC sessions register theirs on first use)
      seen["end"] = await get("/metrics");
      const r = await fetch(encoderUrl);
      seen["encoder"] = { status: r.status, body: await r.text() };
    },
  });
  // what this test is about is the endpoint; the run itself is checked by the e2e tests
  expect(report.lossless.ok).toBe(true);
  expect(exitCode).toBeLessThanOrEqual(1);
  expect(seen["startHealth"]).toEqual({ status: 200, body: "ok\n" });
  expect(seen["startReady"]!.status).toBe(503);
  expect(seen["startReady"]!.body).toMatch(/^not ready: starting/);
  expect(seen["decodeReady"]).toEqual({ status: 200, body: "ready\n" });
  const text = seen["metrics"]!.body;
  expect(seen["metrics"]!.status).toBe(200);
  const fams = parsePrometheus(text);
  const names = [...fams.keys()];
  // the harness's own, its client's and its encoder-cache consumer's, and the worker's
  expect(names).toContain("tapwire_harness_step_rtt_seconds");
  expect(fams.get("tapwire_harness_step_rtt_seconds")!.type).toBe("histogram");
  expect(names.some((n) => n.startsWith("tapwire_client_"))).toBe(true);
  expect(names.some((n) => n.startsWith("tapwire_ec_"))).toBe(true);
  const up = fams.get("tapwire_harness_worker_scrape_up")!.samples[0]!;
  expect(up.value).toBe(1);
  expect(["endpoint", "stats"]).toContain(up.labels.source);
  expect(names.filter((n) => n.startsWith("tapwire_worker_")).length).toBeGreaterThan(3);
  expect(sampleValue(fams, "tapwire_harness_worker_scrape_up")).toBe(1);
  expect(promtoolCheck(text)).toEqual({ ok: true, status: 0, problems: [] });
  // the encoder's own endpoint (announced, not merged: its tapwire_ec_ names clash with the consumer's)
  expect(seen["encoder"]!.status).toBe(200);
  expect(promtoolCheck(seen["encoder"]!.body)).toEqual({ ok: true, status: 0, problems: [] });
  expect(promtoolCheck(seen["end"]!.body)).toEqual({ ok: true, status: 0, problems: [] });

  // docs/dashboards/tapwire.json: every name it uses is exposed, as the kind it uses it as, and
  // every expression parses (promtool check rules)
  const dashboard = loadDashboard();
  const live = new Map([...parsePrometheus(seen["encoder"]!.body), ...parsePrometheus(seen["end"]!.body)]);
  expect(structureProblems(dashboard)).toEqual([]);
  expect(nameProblems(dashboard, live)).toEqual([]);
  expect(promqlProblems(dashboard)).toEqual([]);

  // the endpoint closes with the run
  await expect(fetch(`${base}/healthz`)).rejects.toThrow();
});
