/** Reports of a run: the terminal text, `--json` and `--junit` (CI systems). */
import type { CaseResult, Verdict } from "./runner.js";

/** A whole run. */
export interface RunReport {
  /** `worker`, `client`, `ec-producer` or `ec-consumer`. */
  mode: string;
  /** The endpoint under test (or listened on). */
  endpoint: string;
  /** What the tester learned or was told about the peer (geometry, capabilities, policy). */
  peer: Record<string, unknown>;
  /** When the run started (ISO 8601). */
  startedAt: string;
  /** Every case run, in order. */
  results: CaseResult[];
  /** Per verdict counts over all cases. */
  totals: Record<Verdict, number>;
}

const VERDICTS: Verdict[] = ["OK", "NON-STRICT", "INFORMATIONAL", "UNIMPLEMENTED", "FAILED"];

/** Counts per verdict. */
export function totalsOf(results: readonly CaseResult[]): Record<Verdict, number> {
  const t = Object.fromEntries(VERDICTS.map((v) => [v, 0])) as Record<Verdict, number>;
  for (const r of results) t[r.verdict]++;
  return t;
}

/** Builds the report object. */
export function makeReport(
  mode: string,
  endpoint: string,
  peer: Record<string, unknown>,
  results: CaseResult[],
  startedAt: Date,
): RunReport {
  return { mode, endpoint, peer, startedAt: startedAt.toISOString(), results, totals: totalsOf(results) };
}

/** The readable terminal report: cases grouped by section, failures with what was expected and what arrived, per-section summary. */
export function formatText(rep: RunReport, opts: { color?: boolean; verbose?: boolean } = {}): string {
  const c = opts.color === true;
  const paint = (v: Verdict, s: string): string => {
    if (!c) return s;
    const code =
      v === "OK" ? 32 : v === "FAILED" ? 31 : v === "NON-STRICT" ? 33 : v === "UNIMPLEMENTED" ? 36 : 90;
    return `\x1b[${code}m${s}\x1b[0m`;
  };
  const lines: string[] = [];
  lines.push(`tapwire-conformance ${rep.mode} ${rep.endpoint}`);
  const peer = Object.entries(rep.peer)
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(" ");
  if (peer !== "") lines.push(`peer: ${peer}`);
  const bySection = new Map<string, CaseResult[]>();
  for (const r of rep.results) {
    const list = bySection.get(r.section) ?? [];
    list.push(r);
    bySection.set(r.section, list);
  }
  const summary: string[] = [];
  for (const [sec, list] of bySection) {
    lines.push("");
    lines.push(`${rep.mode.startsWith("ec-") ? "EC-CONTRACT" : "CONTRACT"} ${sec}`);
    for (const r of list) {
      lines.push(`  ${paint(r.verdict, r.verdict.padEnd(13))} ${r.id} ${r.title}`);
      if (
        r.verdict !== "OK" &&
        (r.verdict === "FAILED" ||
          r.verdict === "NON-STRICT" ||
          opts.verbose === true ||
          r.verdict === "INFORMATIONAL" ||
          r.verdict === "UNIMPLEMENTED")
      ) {
        if (r.verdict === "FAILED" || r.verdict === "NON-STRICT") lines.push(`                ${r.cite}`);
        if (r.expected !== undefined) lines.push(`                expected: ${r.expected}`);
        if (r.got !== undefined) lines.push(`                got:      ${r.got}`);
      }
      if (opts.verbose === true) for (const n of r.notes) lines.push(`                note: ${n}`);
    }
    const t = totalsOf(list);
    summary.push(
      `  ${sec.padEnd(6)} ${String(list.length).padStart(4)} cases  ${VERDICTS.filter((v) => t[v] > 0)
        .map((v) => `${t[v]} ${v}`)
        .join(", ")}`,
    );
  }
  lines.push("");
  lines.push("Summary by section");
  lines.push(...summary);
  const t = rep.totals;
  lines.push("");
  lines.push(
    `${rep.results.length} cases: ${VERDICTS.map((v) => `${t[v]} ${v}`).join(", ")} — ${t.FAILED === 0 ? "no case FAILED" : `${t.FAILED} FAILED`}`,
  );
  return `${lines.join("\n")}\n`;
}

function xml(s: string): string {
  return (
    s
      .replace(/&/g, "&amp;")
      .replace(/</g, "&lt;")
      .replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;")
      // biome-ignore lint/suspicious/noControlCharactersInRegex: XML 1.0 forbids these characters
      .replace(/[\u0000-\u0008\u000b\u000c\u000e-\u001f]/g, "?")
  );
}

/** JUnit XML: one testsuite per section, one testcase per case; FAILED is a failure, UNIMPLEMENTED a skip. */
export function formatJunit(rep: RunReport): string {
  const bySection = new Map<string, CaseResult[]>();
  for (const r of rep.results) {
    const list = bySection.get(r.section) ?? [];
    list.push(r);
    bySection.set(r.section, list);
  }
  const out: string[] = ['<?xml version="1.0" encoding="UTF-8"?>'];
  out.push(
    `<testsuites name="tapwire-conformance ${xml(rep.mode)}" tests="${rep.results.length}" failures="${rep.totals.FAILED}" skipped="${rep.totals.UNIMPLEMENTED}">`,
  );
  for (const [sec, list] of bySection) {
    const t = totalsOf(list);
    const time = list.reduce((s, r) => s + r.ms, 0) / 1000;
    out.push(
      `  <testsuite name="${xml(`${rep.mode} ${sec}`)}" tests="${list.length}" failures="${t.FAILED}" skipped="${t.UNIMPLEMENTED}" time="${time.toFixed(3)}">`,
    );
    for (const r of list) {
      const head = `    <testcase classname="${xml(`${rep.mode}.${sec}`)}" name="${xml(`${r.id} ${r.title}`)}" time="${(r.ms / 1000).toFixed(3)}"`;
      const detail = xml(`${r.cite}\nexpected: ${r.expected ?? ""}\ngot: ${r.got ?? ""}`);
      if (r.verdict === "FAILED") {
        out.push(
          `${head}>`,
          `      <failure message="${xml(r.expected ?? "failed")}">${detail}</failure>`,
          "    </testcase>",
        );
      } else if (r.verdict === "UNIMPLEMENTED") {
        out.push(
          `${head}>`,
          `      <skipped message="${xml(r.expected ?? "unimplemented")}"/>`,
          "    </testcase>",
        );
      } else if (r.verdict === "NON-STRICT" || r.verdict === "INFORMATIONAL") {
        out.push(
          `${head}>`,
          `      <system-out>${xml(r.verdict)}: ${detail}</system-out>`,
          "    </testcase>",
        );
      } else {
        out.push(`${head}/>`);
      }
    }
    out.push("  </testsuite>");
  }
  out.push("</testsuites>");
  return `${out.join("\n")}\n`;
}
