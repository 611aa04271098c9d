import { once } from "node:events";
import { createServer } from "node:http";
import { describe, expect, test } from "vitest";
import { parsePrometheus, promtoolCheck, sampleValue, scrape, TestingError } from "../src/index.js";

const GOOD = `# HELP tapwire_worker_steps_total STEPs
# TYPE tapwire_worker_steps_total counter
tapwire_worker_steps_total 7
# HELP tapwire_worker_step_seconds STEP time
# TYPE tapwire_worker_step_seconds histogram
tapwire_worker_step_seconds_bucket{le="0.001"} 3
tapwire_worker_step_seconds_bucket{le="+Inf"} 4
tapwire_worker_step_seconds_sum 1.5
tapwire_worker_step_seconds_count 4
# HELP tapwire_worker_drafter_info drafter
# TYPE tapwire_worker_drafter_info gauge
tapwire_worker_drafter_info{value="a \\"b\\"\\nc"} 1
`;

describe("Prometheus helpers", () => {
  test("parsePrometheus groups samples by family and sampleValue finds them by labels", () => {
    const fams = parsePrometheus(GOOD);
    expect([...fams.keys()]).toEqual([
      "tapwire_worker_steps_total",
      "tapwire_worker_step_seconds",
      "tapwire_worker_drafter_info",
    ]);
    expect(fams.get("tapwire_worker_step_seconds")!.type).toBe("histogram");
    expect(fams.get("tapwire_worker_step_seconds")!.samples).toHaveLength(4);
    expect(sampleValue(GOOD, "tapwire_worker_step_seconds_bucket", { le: "+Inf" })).toBe(4);
    expect(sampleValue(fams, "tapwire_worker_step_seconds_bucket", { le: "0.001" })).toBe(3);
    expect(sampleValue(GOOD, "tapwire_worker_drafter_info", { value: 'a "b"\nc' })).toBe(1);
    expect(sampleValue(GOOD, "nope")).toBeUndefined();
    expect(() => parsePrometheus('x{a="b} 1')).toThrow();
    expect(() => parsePrometheus("# TYPE x countr")).toThrow();
  });

  test("promtoolCheck runs the real promtool: clean text passes, lint problems are listed", () => {
    expect(promtoolCheck(GOOD)).toEqual({ ok: true, status: 0, problems: [] });
    const bad = promtoolCheck(
      "# HELP x_ms latency\n# TYPE x_ms gauge\nx_ms 1\n# HELP c c\n# TYPE c counter\nc 1\n",
    );
    expect(bad.ok).toBe(false);
    expect(bad.problems.join("\n")).toMatch(/_total/);
  });

  test("promtoolCheck throws TESTING_PROMTOOL (never skips) when promtool is missing", () => {
    const path = process.env.PATH;
    process.env.PATH = "/nonexistent";
    try {
      expect(() => promtoolCheck(GOOD)).toThrow(TestingError);
      expect(() => promtoolCheck(GOOD)).toThrow(/apt-get install -y prometheus/);
    } finally {
      process.env.PATH = path;
    }
  });

  test("scrape fetches a real endpoint", async () => {
    const srv = createServer((_req, res) => res.end(GOOD));
    srv.listen(0, "127.0.0.1");
    await once(srv, "listening");
    const { port } = srv.address() as { port: number };
    const r = await scrape(`http://127.0.0.1:${port}/metrics`);
    expect(r.status).toBe(200);
    expect(sampleValue(r.text, "tapwire_worker_steps_total")).toBe(7);
    await new Promise<void>((res) => srv.close(() => res()));
  });
});
