import { createHash } from "node:crypto";

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/** 32-bit seed words derived from the mm_hash (SHA-256, first 8 bytes). */
function seedOf(mmHash: string): [number, number] {
  const d = createHash("sha256").update(mmHash, "utf8").digest();
  return [d.readUInt32LE(0), d.readUInt32LE(4)];
}

/** Word `i` of the stream: a counter-based mix (murmur3 finaliser), so any offset is computable. */
function word(s0: number, s1: number, i: number): number {
  let h = (Math.imul(i, 0x9e3779b1) ^ s0) >>> 0;
  h = (h + s1) >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * Writes bytes `[offset, offset + out.length)` of the deterministic synthetic embedding of `mmHash`
 * into `out`. The stream depends only on `mmHash` (a prefix of a longer embedding equals the shorter
 * one), so a producer can fill block by block and a consumer can recompute any slice.
 */
export function writeSyntheticEmbedding(mmHash: string, out: Uint8Array, offset = 0): void {
  const [s0, s1] = seedOf(mmHash);
  let pos = offset;
  let i = 0;
  // Unaligned head, byte by byte.
  while (i < out.length && (pos & 3) !== 0) {
    out[i++] = (word(s0, s1, pos >>> 2) >>> ((pos & 3) * 8)) & 0xff;
    pos++;
  }
  const words = (out.length - i) >>> 2;
  if (words > 0) {
    const base = out.byteOffset + i;
    const w0 = pos >>> 2;
    if ((base & 3) === 0 && LITTLE_ENDIAN) {
      const u32 = new Uint32Array(out.buffer, base, words);
      for (let k = 0; k < words; k++) u32[k] = word(s0, s1, w0 + k);
    } else {
      const dv = new DataView(out.buffer, base, words * 4);
      for (let k = 0; k < words; k++) dv.setUint32(k * 4, word(s0, s1, w0 + k), true);
    }
    i += words * 4;
    pos += words * 4;
  }
  while (i < out.length) {
    out[i++] = (word(s0, s1, pos >>> 2) >>> ((pos & 3) * 8)) & 0xff;
    pos++;
  }
}

/**
 * The deterministic synthetic encoder of `tapwire-ec-producer`: the `nbytes`-byte embedding of
 * `mmHash` (little-endian words of a counter-based hash seeded by SHA-256(mmHash)). An engine can
 * recompute it locally as a fallback and tests compare transferred bytes with it.
 */
export function syntheticEmbedding(mmHash: string, nbytes: number): Uint8Array {
  const out = new Uint8Array(nbytes);
  writeSyntheticEmbedding(mmHash, out, 0);
  return out;
}
