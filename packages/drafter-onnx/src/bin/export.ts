#!/usr/bin/env node
/**
 * `tapwire-onnx-export`: exports a reference draft head (safetensors) as an ONNX model with the
 * head signature, or checks any model against it (`--check`) and prints its identities.
 * Exit codes: 0 done, 1 the input is not a usable head or model, 2 usage.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { OnnxDrafter } from "../drafter.js";
import { OnnxDrafterError } from "../errors.js";
import { exportReferenceHead } from "../export.js";

const HELP = `Usage:
  tapwire-onnx-export HEAD.safetensors -o HEAD.onnx [--window N] [--num-spec N]
  tapwire-onnx-export --check MODEL.onnx [--json]

Export: turns a @tapwire/reference-model draft head into an ONNX model with the tapwire head
signature (docs/onnx-drafter.md); its identities equal the reference drafter's.
Check: validates a model against the signature, loads it in ONNX Runtime, drafts one position,
and prints its geometry and identities (CONTRACT 6.1).

Options
  -o, --output FILE   where the exported model goes
  --window N          tapwire.window to record (default the head's)
  --num-spec N        tapwire.num_spec to record (default the head's)
  --check FILE        check FILE instead of exporting
  --json              --check: print one JSON object
  -h, --help          this text
`;

class UsageError extends Error {}

function int(name: string, v: string | undefined, lo: number, hi: number): number | undefined {
  if (v === undefined) return undefined;
  if (!/^\d+$/.test(v) || Number(v) < lo || Number(v) > hi)
    throw new UsageError(`--${name} ${v} outside ${lo}..${hi}`);
  return Number(v);
}

async function check(path: string, json: boolean): Promise<void> {
  const drafter = await OnnxDrafter.create(path);
  try {
    // One real run of position 0 (batch of one, no rows): the graph executes and its outputs fit.
    const out = {
      draftIds: new Int32Array(drafter.numSpec),
      confidence: new Float32Array(drafter.numSpec),
      margin: new Float32Array(drafter.numSpec),
      sampledMask: null,
      supportIds: null,
      proposalQ: null,
      numSpec: drafter.numSpec,
      failed: new Uint8Array(1),
    };
    await drafter.draft(
      [
        {
          index: 0,
          slot: 0,
          anchorPos: 0,
          anchorToken: 0,
          k: 1,
          rows: new Uint8Array(0),
          nRows: 0,
          sample: null,
        },
      ],
      out,
    );
    if (out.failed[0] === 1) {
      throw new OnnxDrafterError(
        "ONNX_DRAFTER_BAD_MODEL",
        "a trial draft gave no usable output (non-finite or out of range)",
      );
    }
    const i = drafter.info;
    const report = {
      model: path,
      signature: "ok",
      window: drafter.window,
      numSpec: drafter.numSpec,
      vocabSize: drafter.vocabSize,
      numTaps: drafter.numTaps,
      hidden: drafter.hidden,
      rowBytes: drafter.numTaps * drafter.hidden * 2,
      windowRows: i.windowRows,
      stateSize: i.stateSize,
      outputs:
        i.output === "top"
          ? i.hasTopKInput
            ? "top_logits/top_ids (top_k input)"
            : `top_logits/top_ids (K ${i.fixedK})`
          : "logits",
      top32: i.top32,
      drafterIdentity: Buffer.from(drafter.drafterIdentity).toString("hex"),
      markovIdentity: Buffer.from(drafter.markovIdentity).toString("hex"),
      trialDraft: { id: out.draftIds[0], confidence: out.confidence[0], margin: out.margin[0] },
    };
    if (json) {
      process.stdout.write(`${JSON.stringify(report)}\n`);
    } else {
      process.stdout.write(
        `${path}: signature OK\n` +
          `  window ${report.window}, num_spec ${report.numSpec}, vocab ${report.vocabSize}, num_taps ${report.numTaps}, hidden ${report.hidden} (row_bytes ${report.rowBytes})\n` +
          `  reads ${report.windowRows} row(s) per entry, state ${report.stateSize}, outputs ${report.outputs}, TOP32 ${report.top32 ? "yes" : "no"}\n` +
          `  drafter_identity ${report.drafterIdentity}\n` +
          `  markov_identity  ${report.markovIdentity}\n`,
      );
    }
  } finally {
    await drafter.release();
  }
}

async function main(): Promise<number> {
  const { values: v, positionals } = parseArgs({
    options: {
      output: { type: "string", short: "o" },
      window: { type: "string" },
      "num-spec": { type: "string" },
      check: { type: "string" },
      json: { type: "boolean" },
      help: { type: "boolean", short: "h" },
    },
    allowPositionals: true,
  });
  if (v.help) {
    process.stdout.write(HELP);
    return 0;
  }
  if (v.check !== undefined) {
    if (positionals.length > 0 || v.output !== undefined)
      throw new UsageError("--check takes one model and no other input");
    await check(v.check, v.json === true);
    return 0;
  }
  if (positionals.length !== 1) throw new UsageError("give one HEAD.safetensors to export");
  if (v.output === undefined) throw new UsageError("-o HEAD.onnx is required");
  const opts: { window?: number; numSpec?: number } = {};
  const w = int("window", v.window, 1, 4096);
  const n = int("num-spec", v["num-spec"], 1, 32);
  if (w !== undefined) opts.window = w;
  if (n !== undefined) opts.numSpec = n;
  let head: Uint8Array;
  try {
    head = readFileSync(positionals[0]!);
  } catch (e) {
    throw new OnnxDrafterError(
      "ONNX_DRAFTER_BAD_HEAD",
      `cannot read ${positionals[0]}: ${(e as Error).message}`,
    );
  }
  const bytes = exportReferenceHead(head, opts);
  writeFileSync(v.output, bytes);
  process.stdout.write(`wrote ${v.output} (${bytes.length} bytes)\n`);
  return 0;
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    if (
      e instanceof UsageError ||
      (e instanceof TypeError && "code" in e && String(e.code).startsWith("ERR_PARSE_ARGS"))
    ) {
      process.stderr.write(`tapwire-onnx-export: ${e.message}\n\n${HELP}`);
      process.exitCode = 2;
    } else if (e instanceof OnnxDrafterError) {
      process.stderr.write(`tapwire-onnx-export: ${e.code}: ${e.message}\n`);
      process.exitCode = 1;
    } else {
      process.stderr.write(
        `tapwire-onnx-export: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}\n`,
      );
      process.exitCode = 1;
    }
  },
);
