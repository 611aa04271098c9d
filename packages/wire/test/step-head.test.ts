// decodeStepHead (STEPs received in place: only the head is at hand) must make exactly the checks
// of @tapwire/wire's decodeStepRequest on the whole body (CONTRACT 7.2, 7.3): same result, same
// error code, status and message, for valid bodies and for bodies with random bytes corrupted.

import fc from "fast-check";
import { expect, test } from "vitest";
import type { StepLimits } from "../src/index.js";
import {
  APP_HEADER_SIZE,
  decodeStepHead,
  decodeStepRequest,
  rowsOffsetFor,
  WireError,
  writeStepPrefix,
} from "../src/index.js";

function outcome(f: () => unknown): unknown {
  try {
    const r = f() as { rows?: unknown };
    return { ok: { ...r, rows: undefined } };
  } catch (e) {
    expect(e).toBeInstanceOf(WireError);
    const w = e as WireError;
    return { err: [w.code, w.status, w.message] };
  }
}

test("property: decodeStepHead(head, body_len) == decodeStepRequest(body) on valid and corrupted STEP bodies", () => {
  const entryArb = fc.record({
    slot: fc.nat(9),
    generation: fc.nat(),
    anchorPos: fc.nat(20),
    anchorToken: fc.nat(),
    rowStart: fc.nat(20),
    nRows: fc.nat(3),
    nOut: fc.nat(5),
    flags: fc.nat(7),
  });
  fc.assert(
    fc.property(
      fc.array(entryArb, { maxLength: 6 }),
      fc.boolean(),
      fc.array(fc.tuple(fc.nat(400), fc.nat(255)), { maxLength: 3 }),
      fc.record({
        maxSlots: fc.integer({ min: 1, max: 8 }),
        maxRowsPerStep: fc.nat(16),
        numSpec: fc.integer({ min: 1, max: 4 }),
      }),
      fc.integer({ min: -8, max: 8 }),
      (entries0, sampled, corrupt, lim, lenDelta) => {
        // Mostly consistent entries (row_start + n_rows == anchor_pos), some not.
        const entries = entries0.map((e, i) => (i % 2 === 0 ? { ...e, anchorPos: e.rowStart + e.nRows } : e));
        const rb = 8;
        const nRows = entries.reduce((a, e) => a + e.nRows, 0);
        const meta = sampled ? entries.map((_, i) => ({ seed: i, topK: 1 + (i % 32), tempMilli: i })) : null;
        const buf = new Uint8Array(
          APP_HEADER_SIZE + rowsOffsetFor(entries.length, sampled) + nRows * rb + 64,
        );
        const len = writeStepPrefix(buf, {
          seq: 1,
          session: 1,
          stepId: 3,
          entries,
          sampleMeta: meta,
          nRows,
          rowBytes: rb,
        });
        const headEnd = APP_HEADER_SIZE + rowsOffsetFor(entries.length, sampled);
        for (const [at, v] of corrupt) if (APP_HEADER_SIZE + at < headEnd) buf[APP_HEADER_SIZE + at] = v;
        const bodyLen = Math.max(0, len - APP_HEADER_SIZE + lenDelta);
        const body = buf.subarray(APP_HEADER_SIZE, APP_HEADER_SIZE + bodyLen);
        const limits: StepLimits = { sampled, rowBytes: rb, ...lim };
        const head = body.subarray(0, Math.min(bodyLen, headEnd - APP_HEADER_SIZE));
        expect(outcome(() => decodeStepHead(head, bodyLen, limits))).toEqual(
          outcome(() => decodeStepRequest(body, limits)),
        );
      },
    ),
    { numRuns: 2000 },
  );
});
