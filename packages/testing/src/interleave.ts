/**
 * Runs every one of `variants` at least `atLeast` times, interleaved so that background load hits
 * them alike: in rotating order, forwards then backwards, so that each variant runs in every slot
 * and after every other one equally often (a benchmark's fixed order charges a slot's cost, such
 * as the caches the previous variant left, to whichever variant sits in it). Sequential: each
 * variant's promise settles before the next starts. Returns how many times each ran: `atLeast`
 * rounded up to whole rotations (a multiple of twice the variant count).
 */
export async function interleaved(
  variants: readonly (() => Promise<unknown>)[],
  atLeast: number,
): Promise<number> {
  const nv = variants.length;
  if (nv === 0) return 0;
  const rounds = Math.ceil(Math.max(0, atLeast) / (2 * nv)) * 2 * nv;
  for (let i = 0; i < rounds; i++) {
    const r = i % nv;
    const back = Math.floor(i / nv) % 2 === 1;
    for (let j = 0; j < nv; j++) await variants[back ? (r + nv - j) % nv : (r + j) % nv]!();
  }
  return rounds;
}
