import { Registry } from "@tapwire/stats";
import { parsePrometheus, promtoolCheck } from "@tapwire/testing";
import { expect, test } from "vitest";
import { scrapeUpText, statsToPrometheus } from "../src/report/worker-metrics.js";

test("a STATS snapshot renders as Prometheus text promtool accepts, with every value", () => {
  const r = new Registry();
  r.counter("steps").inc(12);
  r.counter("declined_total").inc(2);
  r.gauge("slots_in_use").set(3);
  r.info("drafter").set('ref "a"\nb');
  const h = r.histogram("step_seconds", { unit: "seconds" });
  for (let i = 1; i <= 100; i++) h.observe(i * 1e-5);
  r.histogram("reply", { unit: "bytes" }).observe(4096);
  // what STATS answers: the snapshot plus fields of its own, ignored here
  const snap = { ...r.snapshot(), session_id: 7, "bad name": 1 };
  const text = scrapeUpText(1, "stats") + statsToPrometheus(snap, "tapwire_worker_");
  expect(promtoolCheck(text)).toEqual({ ok: true, status: 0, problems: [] });
  const f = parsePrometheus(text);
  expect(f.get("tapwire_worker_steps_total")!.samples[0]!.value).toBe(12);
  expect(f.get("tapwire_worker_declined_total")!.samples[0]!.value).toBe(2);
  expect(f.get("tapwire_worker_slots_in_use")!.samples[0]!.value).toBe(3);
  expect(f.get("tapwire_worker_drafter_info")!.samples[0]!.labels.value).toBe('ref "a"\nb');
  const step = f.get("tapwire_worker_step_seconds")!;
  expect(step.type).toBe("summary");
  expect(step.samples.find((s) => s.labels.quantile === "0.99")!.value).toBe(
    snap.histograms.step_seconds!.p99,
  );
  expect(step.samples.find((s) => s.name === "tapwire_worker_step_seconds_count")!.value).toBe(100);
  expect(f.has("tapwire_worker_reply_bytes")).toBe(true);
  expect(statsToPrometheus(null, "x_")).toBe("");
  expect(statsToPrometheus({ counters: { "no good": 1 } }, "x_")).toBe("");
});
