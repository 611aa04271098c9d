/** Checks of docs/dashboards/tapwire.json against live expositions (used by metrics.test.ts). */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { PromFamily } from "@tapwire/testing";

/** Grafana's reference to the dashboard's data-source variable (not a JS template). */
// biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana variable syntax
export const DS_VAR = "${datasource}";

export const DASHBOARD = join(import.meta.dirname, "..", "..", "..", "docs", "dashboards", "tapwire.json");

interface Target {
  expr: string;
  refId: string;
  datasource?: { uid?: string };
}
interface Panel {
  id: number;
  type: string;
  title: string;
  gridPos: { h: number; w: number; x: number; y: number };
  datasource?: { type?: string; uid?: string };
  targets?: Target[];
}
export interface Dashboard {
  uid: string;
  title: string;
  schemaVersion: number;
  panels: Panel[];
  templating: { list: Array<{ name: string; type: string; query: unknown; definition?: string }> };
}

export function loadDashboard(): Dashboard {
  return JSON.parse(readFileSync(DASHBOARD, "utf8")) as Dashboard;
}

/** Every PromQL expression of the dashboard: panel targets and template variable queries. */
export function expressions(d: Dashboard): Array<{ where: string; expr: string }> {
  const out: Array<{ where: string; expr: string }> = [];
  for (const p of d.panels)
    for (const t of p.targets ?? []) out.push({ where: `${p.title}/${t.refId}`, expr: t.expr });
  for (const v of d.templating.list) {
    if (v.type === "query") {
      const m = /^label_values\((.+), *instance\)$/.exec(v.definition ?? "");
      if (m) out.push({ where: `variable ${v.name}`, expr: m[1]! });
    }
  }
  return out;
}

/** Structural problems (ids, grid, datasource, refIds), one line each. */
export function structureProblems(d: Dashboard): string[] {
  const problems: string[] = [];
  const ids = new Set<number>();
  if (!d.uid || !d.title) problems.push("no uid or title");
  if (
    !d.templating.list.some(
      (v) => v.name === "datasource" && v.type === "datasource" && v.query === "prometheus",
    )
  ) {
    problems.push("no prometheus datasource variable");
  }
  for (const p of d.panels) {
    if (ids.has(p.id)) problems.push(`duplicate panel id ${p.id}`);
    ids.add(p.id);
    const g = p.gridPos;
    if (!(g.w >= 1 && g.x >= 0 && g.x + g.w <= 24 && g.h >= 1 && g.y >= 0))
      problems.push(`${p.title}: bad gridPos`);
    if (p.type === "row") continue;
    if (p.datasource?.uid !== DS_VAR) problems.push(`${p.title}: datasource is not the variable`);
    if (!p.targets || p.targets.length === 0) problems.push(`${p.title}: no targets`);
    const refs = new Set((p.targets ?? []).map((t) => t.refId));
    if (refs.size !== (p.targets ?? []).length) problems.push(`${p.title}: duplicate refId`);
  }
  return problems;
}

/**
 * Metric names the expressions use that the expositions do not have, or use as the wrong kind:
 * `rate()` only over counters and histogram `_bucket` / `_sum` / `_count` series,
 * `histogram_quantile` only over histograms, anything else (sums of levels) only over gauges.
 */
export function nameProblems(d: Dashboard, families: ReadonlyMap<string, PromFamily>): string[] {
  const problems: string[] = [];
  const typeOf = (name: string): { family: string; type: string; part: string } | null => {
    const f = families.get(name);
    if (f) return { family: name, type: f.type, part: "" };
    const m = /^(.+)_(bucket|sum|count)$/.exec(name);
    const h = m ? families.get(m[1]!) : undefined;
    return m && h && h.type === "histogram" ? { family: m[1]!, type: "histogram", part: m[2]! } : null;
  };
  for (const { where, expr } of expressions(d)) {
    for (const m of expr.matchAll(/\b(tapwire_[a-zA-Z0-9_]+)/g)) {
      const name = m[1]!;
      const t = typeOf(name);
      if (t === null) {
        problems.push(`${where}: ${name} is not exposed`);
        continue;
      }
      const before = expr.slice(0, m.index);
      const inRate = /rate\($/.test(before);
      const inQuantile = /histogram_quantile\([^,]+, *sum by \(le\) \(rate\($/.test(before);
      if (t.part === "bucket" && !inQuantile) problems.push(`${where}: ${name} outside histogram_quantile`);
      else if (t.part !== "" && !inRate) problems.push(`${where}: ${name} outside rate()`);
      else if (t.part === "" && t.type === "counter" && !inRate && !where.startsWith("variable"))
        problems.push(`${where}: counter ${name} outside rate()`);
      else if (t.part === "" && t.type === "gauge" && inRate)
        problems.push(`${where}: gauge ${name} inside rate()`);
      else if (t.part === "" && t.type === "histogram")
        problems.push(`${where}: histogram ${name} used bare`);
    }
  }
  return problems;
}

/**
 * PromQL syntax of every expression, checked by the real `promtool check rules` (each becomes a
 * recording rule, with the dashboard's variables replaced by values).
 */
export function promqlProblems(d: Dashboard): string[] {
  const dir = mkdtempSync(join(tmpdir(), "tapwire-dashboard-"));
  try {
    const rules = expressions(d)
      .filter((e) => !e.where.startsWith("variable"))
      .map((e, i) => {
        const expr = e.expr.replaceAll("$__rate_interval", "5m").replace(/\$(engine|worker|producer)/g, ".*");
        return `      - record: tapwire:dashboard_check_${i}\n        expr: ${JSON.stringify(expr)}`;
      });
    const file = join(dir, "rules.yml");
    writeFileSync(file, `groups:\n  - name: tapwire-dashboard\n    rules:\n${rules.join("\n")}\n`);
    const r = spawnSync("promtool", ["check", "rules", file], { encoding: "utf8", timeout: 30_000 });
    if (r.error) throw new Error(`promtool did not run (${r.error.message}); apt-get install -y prometheus`);
    return r.status === 0 ? [] : [`${r.stdout}${r.stderr}`.trim()];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
