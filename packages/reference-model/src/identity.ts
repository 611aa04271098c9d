/**
 * Weight identities (CONTRACT 6.1 `drafter_identity`, `markov_identity`): SHA-256 over a
 * canonical byte string of a set of tensors. Canonical order: tensor names sorted by their
 * UTF-8 bytes; for each tensor, `u32 LE name length ‖ name ‖ u32 LE dtype length ‖ dtype ‖
 * u32 LE rank ‖ u64 LE each dim ‖ u64 LE byte length ‖ raw little-endian bytes`, preceded once
 * by the domain tag (e.g. "tapwire/drafter/v1") as `u32 LE length ‖ tag`.
 */
import { createHash } from "node:crypto";
import type { SafetensorsTensor } from "./safetensors.js";

function u32(n: number): Uint8Array {
  const b = new Uint8Array(4);
  new DataView(b.buffer).setUint32(0, n, true);
  return b;
}

function u64(n: number): Uint8Array {
  const b = new Uint8Array(8);
  new DataView(b.buffer).setBigUint64(0, BigInt(n), true);
  return b;
}

function compareBytes(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/**
 * SHA-256 identity of the tensors whose names pass `filter` (all when absent), under `domain`.
 * Returns 32 bytes.
 */
export function tensorsIdentity(
  tensors: Map<string, SafetensorsTensor>,
  domain: string,
  filter: (name: string) => boolean = () => true,
): Uint8Array {
  const h = createHash("sha256");
  const tag = Buffer.from(domain, "utf8");
  h.update(u32(tag.length)).update(tag);
  const names = [...tensors.keys()].filter(filter).sort(compareBytes);
  for (const name of names) {
    const t = tensors.get(name)!;
    const nb = Buffer.from(name, "utf8");
    const db = Buffer.from(t.dtype, "utf8");
    h.update(u32(nb.length)).update(nb).update(u32(db.length)).update(db).update(u32(t.shape.length));
    for (const d of t.shape) h.update(u64(d));
    h.update(u64(t.data.length)).update(t.data);
  }
  return new Uint8Array(h.digest());
}
