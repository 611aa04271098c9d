// SpecDecodeMetrics (issue 24): vLLM's spec-decode counters and their exposition, read back with
// the project's Prometheus parser and checked by the real promtool.
import { parsePrometheus, promtoolCheck } from "@tapwire/testing";
import { expect, test } from "vitest";
import { SpecDecodeMetrics } from "../src/index.js";

test("per verification: drafts, draft tokens, accepted, accepted per position (positions 0..accepted-1)", () => {
  const m = new SpecDecodeMetrics({ numSpec: 4 });
  m.observe(4, 2);
  m.observe(3, 3);
  m.observe(2, 0);
  m.observe(0, 0); // no drafts: counts nothing
  m.generated(9);
  const s = m.snapshot();
  expect(s).toMatchObject({ numDrafts: 3, numDraftTokens: 9, numAcceptedTokens: 5, generationTokens: 9 });
  expect(s.acceptedPerPosition).toEqual([2, 2, 1, 0]);
  expect(s.acceptanceRate).toBeCloseTo(5 / 9, 12);
  expect(s.acceptanceLength).toBeCloseTo(1 + 5 / 3, 12);
  expect(s.acceptanceByPosition).toEqual([2 / 3, 2 / 3, 1 / 3, 0]);
  const fams = parsePrometheus(m.exposition());
  const pos = fams.get("vllm:spec_decode_num_accepted_tokens_per_pos_total")!;
  expect(pos.type).toBe("counter");
  expect(pos.samples.map((x) => [x.labels.position, x.labels.engine, x.value])).toEqual([
    ["0", "0", 2],
    ["1", "0", 2],
    ["2", "0", 1],
    ["3", "0", 0],
  ]);
  expect(fams.get("vllm:spec_decode_num_drafts_total")!.samples[0]!.value).toBe(3);
  expect(fams.get("vllm:generation_tokens_total")!.samples[0]!.value).toBe(9);
});

test("a prefix without a colon passes promtool clean; options are validated", () => {
  const m = new SpecDecodeMetrics({ numSpec: 2, prefix: "engine_", labels: { model_name: 'a"b' } });
  m.observe(2, 1);
  const text = m.exposition();
  expect(text).toContain(
    'engine_spec_decode_num_accepted_tokens_per_pos_total{model_name="a\\"b",position="0"} 1',
  );
  expect(promtoolCheck(text)).toEqual({ ok: true, status: 0, problems: [] });
  expect(() => new SpecDecodeMetrics({ numSpec: 0 })).toThrow(/option numSpec/);
  expect(() => new SpecDecodeMetrics({ numSpec: 4, prefix: "bad-prefix" })).toThrow(/option prefix/);
  expect(() => new SpecDecodeMetrics({ numSpec: 4, labels: { position: "x" } })).toThrow(/option labels/);
});
