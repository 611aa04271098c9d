/** The dashboard checks themselves can fail (metrics.test.ts runs them on the real dashboard). */
import { parsePrometheus } from "@tapwire/testing";
import { expect, test } from "vitest";
import {
  type Dashboard,
  DS_VAR,
  loadDashboard,
  nameProblems,
  promqlProblems,
  structureProblems,
} from "./dashboard.js";

const LIVE = parsePrometheus(`# HELP tapwire_x_total x
# TYPE tapwire_x_total counter
tapwire_x_total 1
# HELP tapwire_g g
# TYPE tapwire_g gauge
tapwire_g 1
# HELP tapwire_h_seconds h
# TYPE tapwire_h_seconds histogram
tapwire_h_seconds_bucket{le="+Inf"} 1
tapwire_h_seconds_sum 1
tapwire_h_seconds_count 1
`);

function dash(exprs: string[]): Dashboard {
  return {
    uid: "u",
    title: "t",
    schemaVersion: 39,
    templating: { list: [{ name: "datasource", type: "datasource", query: "prometheus" }] },
    panels: [
      {
        id: 1,
        type: "timeseries",
        title: "p",
        gridPos: { h: 8, w: 8, x: 0, y: 0 },
        datasource: { type: "prometheus", uid: DS_VAR },
        targets: exprs.map((expr, i) => ({ expr, refId: String.fromCharCode(65 + i) })),
      },
    ],
  };
}

test("the checks accept good uses and refuse unknown names, wrong kinds and bad PromQL", () => {
  const good = dash([
    'sum(rate(tapwire_x_total{instance=~"$engine"}[$__rate_interval]))',
    "sum(tapwire_g)",
    "histogram_quantile(0.99, sum by (le) (rate(tapwire_h_seconds_bucket[$__rate_interval])))",
    "sum(rate(tapwire_h_seconds_sum[5m])) / sum(rate(tapwire_h_seconds_count[5m]))",
  ]);
  expect(structureProblems(good)).toEqual([]);
  expect(nameProblems(good, LIVE)).toEqual([]);
  expect(promqlProblems(good)).toEqual([]);
  expect(
    nameProblems(
      dash([
        "sum(rate(tapwire_missing_total[5m]))",
        "sum(rate(tapwire_g[5m]))",
        "sum(tapwire_x_total)",
        "sum(rate(tapwire_h_seconds_bucket[5m]))",
        "tapwire_h_seconds",
      ]),
      LIVE,
    ),
  ).toEqual([
    "p/A: tapwire_missing_total is not exposed",
    "p/B: gauge tapwire_g inside rate()",
    "p/C: counter tapwire_x_total outside rate()",
    "p/D: tapwire_h_seconds_bucket outside histogram_quantile",
    "p/E: histogram tapwire_h_seconds used bare",
  ]);
  expect(promqlProblems(dash(["sum(rate(tapwire_x_total[5m])"]))).toHaveLength(1);
  const bad = dash(["sum(tapwire_g)"]);
  bad.panels.push({ ...bad.panels[0]!, gridPos: { h: 8, w: 20, x: 10, y: 0 }, datasource: { uid: "prom" } });
  expect(structureProblems(bad)).toEqual([
    "duplicate panel id 1",
    "p: bad gridPos",
    "p: datasource is not the variable",
  ]);
});

test("the shipped dashboard covers the link and the encoder cache on every side", () => {
  const d = loadDashboard();
  expect(structureProblems(d)).toEqual([]);
  const rows = d.panels.filter((p) => p.type === "row").map((p) => p.title);
  for (const part of ["engine side", "worker side", "transport", "consumer", "producer"]) {
    expect(
      rows.some((t) => t.toLowerCase().includes(part)),
      part,
    ).toBe(true);
  }
  const exprs = d.panels.flatMap((p) => p.targets ?? []).map((t) => t.expr);
  for (const h of [
    "tapwire_client_step_rtt_seconds_bucket",
    "tapwire_worker_step_seconds_bucket",
    "tapwire_ec_consumer_read_seconds_bucket",
    "tapwire_ec_producer_grant_seconds_bucket",
  ]) {
    expect(
      exprs.some((e) => e.includes(`histogram_quantile(0.99, sum by (le) (rate(${h}`)),
      h,
    ).toBe(true);
  }
});
