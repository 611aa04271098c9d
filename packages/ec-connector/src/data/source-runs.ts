/**
 * docs/ec-protocol.md 3.4 "Shared region": where a read's bytes were copied from. A shared-region
 * SHM_CHUNK names an offset of the producer's region; nothing in the chunk says which blocks those
 * are, so the reader records each chunk's `[offset, length]` in byte order (adjacent ones merged)
 * and the consumer, once it holds the ack, checks them against the ack's `src_block_indices`
 * (`sourceRunsMatch`): bytes from any other place are never promoted, with the CRC check off too.
 */

/** A read's recorded source runs: flat `[offset, length, ...]`, maximal (adjacent chunks merged). */
export interface SourceRuns {
  /** `[offset, length]` pairs of the producer's region, in the item's byte order. */
  runs: number[];
  /** More runs than the item has blocks: they cannot match, recording stopped (memory bounded). */
  overflow: boolean;
}

/**
 * Records a chunk of `length` bytes at region `offset` after those recorded: merged into the last
 * run when it continues it. At most `maxRuns` runs (an item of `nbytes` in blocks of `blockBytes`
 * has at most `ceil(nbytes / blockBytes)`); past that `overflow` is set and nothing more is kept.
 */
export function recordSourceRun(s: SourceRuns, offset: number, length: number, maxRuns: number): void {
  if (s.overflow) return;
  const r = s.runs;
  const n = r.length;
  if (n > 0 && r[n - 2]! + r[n - 1]! === offset) {
    r[n - 1] = r[n - 1]! + length;
    return;
  }
  if (n / 2 >= maxRuns) {
    s.overflow = true;
    r.length = 0;
    return;
  }
  r.push(offset, length);
}

/**
 * True when `runs` (from {@link recordSourceRun}) are exactly the bytes of an item of `nbytes` held
 * in `blocks` (in order) of `blockBytes` each: byte `i` at `blocks[i / blockBytes] * blockBytes +
 * i % blockBytes`. An overflowed record never matches.
 */
export function sourceRunsMatch(
  s: Readonly<SourceRuns>,
  blocks: readonly number[],
  blockBytes: number,
  nbytes: number,
): boolean {
  if (s.overflow) return false;
  const r = s.runs;
  let k = 0; // index into r
  let left = nbytes;
  for (let i = 0; i < blocks.length && left > 0; ) {
    // The maximal run of consecutive blocks from blocks[i].
    let j = i + 1;
    while (j < blocks.length && blocks[j] === blocks[j - 1]! + 1) j++;
    const len = Math.min((j - i) * blockBytes, left);
    if (k + 1 >= r.length || r[k] !== blocks[i]! * blockBytes || r[k + 1] !== len) return false;
    k += 2;
    left -= len;
    i = j;
  }
  return left === 0 && k === r.length;
}
