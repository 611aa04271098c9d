/**
 * `tapwire-worker --print-identities`: the drafter the other flags describe (the reference head
 * from `--weights`, else the one distilled from the flags; the null drafter; an ONNX model), as
 * the one JSON line an engine copies into its `RemoteDraftClient` options (CONTRACT 6.1: the
 * HELLO must carry these identities and this geometry). Nothing is bound.
 */
import type { Drafter } from "../drafter.js";
import type { ParsedFlags } from "./flags.js";

/** The JSON line (with its newline) for the drafter `build` makes from `p`. */
export async function printIdentities(
  p: ParsedFlags,
  build: (p: ParsedFlags) => Promise<Drafter>,
): Promise<string> {
  const d = await build(p);
  const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
  const line = {
    drafter: d.constructor.name,
    ...(p.weights !== undefined ? { weights: p.weights } : {}),
    ...(p.model !== undefined ? { model: p.model } : {}),
    drafterIdentity: hex(d.drafterIdentity),
    markovIdentity: hex(d.markovIdentity),
    window: d.window,
    numSpec: d.numSpec,
    numTaps: d.numTaps,
    hidden: d.hidden,
    vocabSize: d.vocabSize,
    rowBytes: d.numTaps * d.hidden * 2,
  };
  return `${JSON.stringify(line)}\n`;
}
