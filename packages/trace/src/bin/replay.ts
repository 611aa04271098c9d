#!/usr/bin/env node
/**
 * `tapwire-replay`: replays a trace (docs/trace.md) against a worker endpoint and prints the
 * parity report. Exit 0: identical; 1: differences (unless `--allow-diff`); 2: usage; 3: the
 * replay could not run.
 */
import { writeFileSync } from "node:fs";
import { readTrace } from "../reader.js";
import type { ReplayOptions } from "../replay.js";
import { formatParityReport, replayTrace } from "../replay.js";

const HELP = `Usage: tapwire-replay --trace FILE --endpoint URL [options]

Replays a tapwire trace against a worker (HELLO from the trace, STEPs in order) and reports,
per STEP and slot, whether the drafts are identical.

  --trace FILE               the trace (tapwire-worker --trace, harness --trace, client trace option)
  --endpoint URL             worker endpoint (tcp://, unix://, tls://, zmq+tcp://, zmq+ipc://)
  --fast                     send STEPs back to back (default: the recorded pacing)
  --json                     print the report as JSON
  --out FILE                 also write the JSON report to FILE
  --allow-diff               exit 0 even when something differs
  --strict-identity          fail when the worker's identities differ from the trace's
                             (default: HELLO again with the worker's, reported as a difference)
  --confidence-tolerance X   confidence delta that counts as a difference (default 1e-4)
  --timeout-ms MS            per-request timeout (default 10000)
  --token TOKEN              shared HELLO token (default env TAPWIRE_TOKEN)
  --help                     this text
`;

class Usage extends Error {}

function parse(argv: string[]): Record<string, string | boolean> {
  const bools = new Set(["fast", "json", "allow-diff", "strict-identity", "help"]);
  const vals = new Set(["trace", "endpoint", "out", "confidence-tolerance", "timeout-ms", "token"]);
  const out: Record<string, string | boolean> = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!a.startsWith("--")) throw new Usage(`unexpected argument ${JSON.stringify(a)}`);
    const eq = a.indexOf("=");
    const name = a.slice(2, eq < 0 ? undefined : eq);
    if (bools.has(name)) {
      if (eq >= 0) throw new Usage(`--${name} takes no value`);
      out[name] = true;
    } else if (vals.has(name)) {
      const v = eq >= 0 ? a.slice(eq + 1) : argv[++i];
      if (v === undefined) throw new Usage(`--${name} needs a value`);
      if (out[name] !== undefined) throw new Usage(`--${name} given twice`);
      out[name] = v;
    } else throw new Usage(`unknown flag --${name}`);
  }
  return out;
}

async function main(): Promise<number> {
  let p: Record<string, string | boolean>;
  try {
    p = parse(process.argv.slice(2));
    if (p.help === true) {
      process.stdout.write(HELP);
      return 0;
    }
    if (typeof p.trace !== "string") throw new Usage("--trace FILE is required");
    if (typeof p.endpoint !== "string") throw new Usage("--endpoint URL is required");
    for (const [k, min] of [
      ["confidence-tolerance", 0],
      ["timeout-ms", 1],
    ] as const) {
      const v = p[k];
      if (v !== undefined && (typeof v !== "string" || !Number.isFinite(Number(v)) || Number(v) < min)) {
        throw new Usage(`--${k} ${String(v)} is not a number >= ${min}`);
      }
    }
  } catch (e) {
    if (e instanceof Usage) {
      process.stderr.write(`tapwire-replay: ${e.message} (see --help)\n`);
      return 2;
    }
    throw e;
  }
  try {
    const trace = readTrace(p.trace as string);
    const token = (p.token as string | undefined) ?? process.env.TAPWIRE_TOKEN;
    const opts: ReplayOptions = {
      endpoint: p.endpoint as string,
      fast: p.fast === true,
      adoptIdentity: p["strict-identity"] !== true,
      ...(token !== undefined && token !== "" ? { token } : {}),
      ...(p["timeout-ms"] !== undefined ? { timeoutMs: Number(p["timeout-ms"]) } : {}),
      ...(p["confidence-tolerance"] !== undefined
        ? { confidenceTolerance: Number(p["confidence-tolerance"]) }
        : {}),
    };
    const report = await replayTrace(trace, opts);
    const json = `${JSON.stringify(report, null, 2)}\n`;
    if (typeof p.out === "string") writeFileSync(p.out, json);
    process.stdout.write(p.json === true ? json : formatParityReport(report));
    return report.identical || p["allow-diff"] === true ? 0 : 1;
  } catch (e) {
    const code = (e as { code?: unknown }).code;
    process.stderr.write(
      `tapwire-replay: ${typeof code === "string" ? `${code}: ` : ""}${(e as Error).message}\n`,
    );
    return 3;
  }
}

void main().then((code) => {
  process.exitCode = code;
});
