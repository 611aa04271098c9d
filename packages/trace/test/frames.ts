// Frames built from the contract tables (CONTRACT 4, 6.1, 7.3, 7.4) by hand, not by @tapwire/wire's
// encoders: the bytes a trace must keep exactly.

/** A 24-byte header (CONTRACT 4) followed by `body`. */
export function frameOf(
  op: number,
  status: number,
  seq: number,
  session: number,
  body: Uint8Array,
): Uint8Array {
  const f = new Uint8Array(24 + body.length);
  const dv = new DataView(f.buffer);
  f.set([0x44, 0x53, 0x50, 0x4b], 0);
  dv.setUint16(4, 1, true);
  f[6] = op;
  f[7] = status;
  dv.setUint32(8, seq, true);
  dv.setUint32(12, session, true);
  dv.setUint32(16, body.length, true);
  f.set(body, 24);
  return f;
}

/** A HELLO body (CONTRACT 6.1, 160 bytes): greedy, W 16, N 4, 1 tap of 8, vocab 1000, 8 slots. */
export function helloBody(auth = 0): Uint8Array {
  const b = new Uint8Array(160);
  const dv = new DataView(b.buffer);
  b.fill(0x11, 0, 32);
  b.fill(0x22, 32, 64);
  dv.setUint16(64, 16, true); // window
  dv.setUint16(66, 4, true); // num_spec
  b[68] = 0; // greedy
  b[69] = 1; // bf16
  dv.setUint16(70, 1, true); // num_taps
  dv.setUint32(72, 8, true); // hidden
  dv.setUint32(76, 16, true); // row_bytes
  dv.setUint32(80, 1000, true); // vocab
  dv.setUint32(84, 8, true); // max_slots
  dv.setUint32(88, 64, true); // max_rows_per_step
  dv.setUint32(92, 1, true); // WANT_MARGIN
  b.fill(auth, 96, 128);
  b.set(Buffer.from("frames-test"), 128);
  return b;
}

/** A STEP body (CONTRACT 7.3) of one entry on `slot` with `nRows` rows of 16 bytes, NEED_DRAFT. */
export function stepBody(stepId: number, slot: number, anchor: number, nRows: number): Uint8Array {
  // greedy, 1 entry: rows at body offset 104 (24 + 104 = 128, a multiple of 64)
  const rowsAt = 104;
  const b = new Uint8Array(rowsAt + nRows * 16);
  const dv = new DataView(b.buffer);
  dv.setUint32(0, stepId, true);
  dv.setUint32(8, 1, true);
  dv.setUint32(12, nRows, true);
  dv.setUint32(16, slot, true);
  dv.setUint32(20, 1, true); // generation
  dv.setUint32(24, anchor, true);
  dv.setUint32(28, 7, true); // anchor token
  dv.setUint32(32, anchor - nRows, true);
  dv.setUint32(36, nRows, true);
  dv.setUint16(42, 1 | (nRows === anchor ? 2 : 0), true);
  for (let i = 0; i < nRows * 16; i++) b[rowsAt + i] = (i * 7 + stepId) & 0xff;
  return b;
}
