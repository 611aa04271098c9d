/**
 * Per-slot generations and windows of tap rows (CONTRACT 7.1, 7.2).
 *
 * Each slot owns a linear buffer of up to `bufferWindows * W` rows (default 4W). The window is the run of `count` rows
 * starting at buffer row `start`; appending writes after it and, when the buffer end is reached,
 * the surviving rows are compacted to the front. The window is therefore always one contiguous
 * bf16 view, oldest row first, and the amortised cost per appended row is one copy plus at most
 * a fraction for the compactions. Buffers are allocated lazily per slot (doubling up to the maximum)
 * and dropped on RELEASE and on a reset of all slots; nothing is allocated per STEP once a slot's
 * buffer has reached the size its traffic needs.
 *
 * Receive placement (see docs/worker.md "Rows received in place"): {@link WindowStore.placeAfterWindow}
 * reserves room right after a slot's window (compacting or growing the buffer first, which keeps
 * the logical window unchanged) and returns a view the transport reads the STEP's rows into; the
 * apply step then commits them where they are ({@link WindowStore.commitPlaced}) instead of
 * copying. Every change of a slot stamps it with a new version; a placement records the version
 * it made and is valid only while the slot still has it. While a placement is outstanding
 * (`pending`), any other write to that slot first moves the window to a fresh buffer and abandons
 * the old one to the placement's reads (never to the reuse pool), so late placed bytes can never
 * land in a live window; the stale placement is then found invalid at apply time.
 *
 * Compaction off the critical path ({@link WindowStore.prepareAppends}, called by the server once a
 * reply is written, in the gap before the next STEP): a slot whose next append of as many rows
 * as its last one would reach the buffer end gets a *shadow*: the rows that will survive that
 * append (the window's last `W - n`) are copied to the front of the buffer ahead of time, while
 * the window itself stays where it is. The next append (copied or placed) then goes right after
 * the shadow and the window moves there without copying. A shadow is valid only while the slot
 * keeps the version it was made at (any change of the slot discards it), and it never overlaps
 * the window or the room a placement writes into (docs/worker.md "Compaction between STEPs").
 *
 * Private members here are TypeScript `private`, not `#` as elsewhere in the package: this is
 * the per-entry hot path, and with `#` fields the placed-STEP benchmark ran about 6 % slower on
 * Node 20 (3 µs per STEP at 64 slots, interleaved runs; docs/benchmarks/worker.md).
 */
import { copyTargetBytes } from "@tapwire/transport";

import { WorkerError } from "./errors.js";
import { intOption } from "./int-option.js";

/** Smallest per-slot buffer, in rows, before doubling. */
const MIN_CAPACITY_ROWS = 8;

/** Released row buffers kept for reuse by other slots (bounded so RELEASE still frees memory). */
const POOL_LIMIT = 4;

/** A slot's window as {@link WindowStore.debugWindow} reports it. */
export interface WindowSnapshot {
  /** Whether the slot has a generation at all (false before its first entry or after a reset). */
  known: boolean;
  /** The slot's current generation (u32, CONTRACT 7.1); meaningful only when `known`. */
  generation: number;
  /** Absolute position of the first row held. */
  firstPos: number;
  /** Rows held (`<= W`). */
  nRows: number;
  /** A copy of the rows, oldest first (`nRows * rowBytes` bytes). */
  rows: Uint8Array;
}

/** Room reserved after a slot's window by {@link WindowStore.placeAfterWindow}. */
export interface RowPlacement {
  /** Buffer row where the placed rows start (pass to {@link WindowStore.commitPlaced}). */
  row: number;
  /** The slot's version after the reservation (pass to {@link WindowStore.placementValid}). */
  version: number;
  /** Where the rows go: `nRows * rowBytes` bytes right after the window. */
  view: Uint8Array;
}

/** Outcome of the generation check of CONTRACT 7.1. */
export const GenerationCheck = { SAME: 0, RESET: 1, STALE: 2 } as const;
export type GenerationCheck = (typeof GenerationCheck)[keyof typeof GenerationCheck];

function serialNewerU32(a: number, b: number): boolean {
  // CONTRACT 2: newer(a, b) := ((a - b) mod 2^32) in [1, 2^31)
  const d = (a - b) >>> 0;
  return d !== 0 && d < 0x80000000;
}

/** Slot state of one session: generations and row windows. */
export class WindowStore {
  /** Slots of the session (HELLO `max_slots`); valid slot ids are `0 … maxSlots-1`. */
  readonly maxSlots: number;
  /** Rows per slot window, W (HELLO `window`, CONTRACT 7.1): the most rows a snapshot holds. */
  readonly window: number;
  /** Bytes of one tap row (HELLO `row_bytes` = num_taps × hidden × 2, CONTRACT 6.1). */
  readonly rowBytes: number;
  /** Rows a slot's buffer grows to: `bufferWindows * W`. */
  readonly maxBufferRows: number;
  private readonly generation: Uint32Array;
  private readonly known: Uint8Array;
  private readonly start: Uint32Array;
  private readonly count: Uint32Array;
  // Positions fit u32 (anchor_pos is u32 on the wire); Float64 avoids wrap when firstPos + count
  // is computed.
  private readonly firstPos: Float64Array;
  private readonly buffers: (Uint8Array | null)[];
  private readonly pool: Uint8Array[] = [];
  /** Per slot: stamp of its last change (see the module comment on placement). */
  private readonly version: Float64Array;
  /** Per slot: 1 while a placement may still be writing after the window. */
  private readonly pending: Uint8Array;
  private stamp = 0;
  private nonEmpty = 0;
  private allocatedBytes = 0;
  private compacted = 0;
  /** Until its first compaction, slot `s` uses its full-size buffer up to `s mod staggerRows` rows short of the end. */
  private readonly staggerRows: number;
  /** 1 once the slot's current buffer was compacted (its phase is set; it now uses every row). */
  private readonly phased: Uint8Array;
  /** Per slot: rows of the shadow at the buffer front (see the module comment). */
  private readonly shadowRows: Uint32Array;
  /** Per slot: the version the shadow was made at (valid while the slot still has it). */
  private readonly shadowVersion: Float64Array;
  /** Per slot: rows of its last append (the size {@link prepareAppends} prepares for). */
  private readonly lastRows: Uint32Array;
  private shadowed = 0;

  /**
   * @param bufferWindows a slot's buffer holds up to this many windows of rows (2..16, default
   *   4): more means fewer compactions (each copies up to W-1 rows) and more memory.
   */
  constructor(maxSlots: number, window: number, rowBytes: number, bufferWindows = 4) {
    intOption("maxSlots", maxSlots, 0, 0, Number.MAX_SAFE_INTEGER);
    intOption("window", window, 1, 1, Number.MAX_SAFE_INTEGER);
    intOption("rowBytes", rowBytes, 2, 2, Number.MAX_SAFE_INTEGER);
    intOption("bufferWindows", bufferWindows, 4, 2, 16);
    this.maxBufferRows = bufferWindows * window;
    // Slots that advance in lockstep (every running request accepts tokens every round) would
    // otherwise all reach their buffer end, and compact W-1 rows each, on the same STEP: a spike
    // of max_slots * (W-1) row copies every (bufferWindows-1) * W rounds. A slot's first
    // compaction in a buffer comes up to W rows early (by slot), after which every slot has the
    // same period, so lockstep slots stay spread over W STEPs. The first cycle still leaves at
    // least 2W + 1 usable rows.
    this.staggerRows = Math.max(1, Math.min(window, this.maxBufferRows - 2 * window));
    this.phased = new Uint8Array(maxSlots);
    this.maxSlots = maxSlots;
    this.window = window;
    this.rowBytes = rowBytes;
    this.generation = new Uint32Array(maxSlots);
    this.known = new Uint8Array(maxSlots);
    this.start = new Uint32Array(maxSlots);
    this.count = new Uint32Array(maxSlots);
    this.firstPos = new Float64Array(maxSlots);
    this.buffers = new Array<Uint8Array | null>(maxSlots).fill(null);
    this.version = new Float64Array(maxSlots);
    this.pending = new Uint8Array(maxSlots);
    this.shadowRows = new Uint32Array(maxSlots);
    this.shadowVersion = new Float64Array(maxSlots).fill(-1);
    this.lastRows = new Uint32Array(maxSlots);
  }

  /** Appends that found their survivors already moved by {@link prepareAppends} (no copy on the STEP). */
  get shadowedAppends(): number {
    return this.shadowed;
  }

  /**
   * Compaction between STEPs (see the module comment): for every slot whose next append of as
   * many rows as its last would need a compaction, copies the rows that append keeps to the
   * buffer front now, so that the STEP does not. The logical windows do not change. Returns the
   * rows copied. Slots with a placement outstanding are skipped.
   */
  prepareAppends(): number {
    const rb = this.rowBytes;
    const W = this.window;
    const full = this.maxBufferRows * rb;
    let copied = 0;
    for (let slot = 0; slot < this.maxSlots; slot++) {
      const count = this.count[slot]!;
      if (count === 0 || this.pending[slot] === 1) continue;
      if (this.shadowVersion[slot] === this.version[slot]) continue;
      const buf = this.buffers[slot];
      if (buf === null || buf === undefined || buf.byteLength !== full) continue;
      const n = this.lastRows[slot]!;
      if (n === 0 || n >= W) continue;
      const start = this.start[slot]!;
      const end = start + count;
      if ((end + n) * rb <= this.usableBytes(slot, buf)) continue;
      const k = Math.min(count, W - n);
      // The shadow [0, k) and the room after it [k, k + n) must lie before the window.
      if (k + n > start) continue;
      buf.copyWithin(0, (end - k) * rb, end * rb);
      this.shadowRows[slot] = k;
      this.shadowVersion[slot] = this.version[slot]!;
      this.compacted++;
      this.phased[slot] = 1;
      copied += k;
    }
    return copied;
  }

  /** Rows of a valid shadow usable by an append of `nRows` that keeps `keep` rows, else -1. */
  private shadowFor(slot: number, keep: number, nRows: number): number {
    if (this.shadowVersion[slot] !== this.version[slot]) return -1;
    const k = this.shadowRows[slot]!;
    return k >= keep && k + nRows <= this.start[slot]! ? k : -1;
  }

  /** Slots whose window holds at least one row (`windows_kept` of CONTRACT 6.1). */
  get windowsHeld(): number {
    return this.nonEmpty;
  }

  /** Windows moved to the front of their full-size buffer so far (each copies at most W-1 rows). */
  get compactions(): number {
    return this.compacted;
  }

  /** Bytes of `buf` the slot may fill before compacting (see `staggerRows`). */
  private usableBytes(slot: number, buf: Uint8Array): number {
    const full = this.maxBufferRows * this.rowBytes;
    if (buf.byteLength !== full || this.phased[slot] === 1) return buf.byteLength;
    return full - (slot % this.staggerRows) * this.rowBytes;
  }

  /** Bytes currently allocated for row buffers (including the reuse pool). */
  get bytesAllocated(): number {
    return this.allocatedBytes;
  }

  /** CONTRACT 7.1: compare an entry's generation with the slot's; a newer one resets the slot. */
  checkGeneration(slot: number, generation: number): GenerationCheck {
    if (this.known[slot] === 0) {
      this.known[slot] = 1;
      this.generation[slot] = generation;
      this.clearWindow(slot);
      this.bump(slot);
      return GenerationCheck.RESET;
    }
    const cur = this.generation[slot]!;
    if (cur === generation) return GenerationCheck.SAME;
    if (serialNewerU32(generation, cur)) {
      this.generation[slot] = generation;
      this.clearWindow(slot);
      this.bump(slot);
      return GenerationCheck.RESET;
    }
    return GenerationCheck.STALE;
  }

  /** Would {@link checkGeneration} answer STALE? (No state change.) */
  isStale(slot: number, generation: number): boolean {
    if (this.known[slot] === 0) return false;
    const cur = this.generation[slot]!;
    return cur !== generation && !serialNewerU32(generation, cur);
  }

  /**
   * CONTRACT 7.2 steps 2 and 3: apply `nRows` carried rows starting at position `rowStart`.
   * With `resync`, or when the rows do not connect to the window's end, they replace the window
   * (the last `W` of them); otherwise they are appended and the oldest rows beyond `W` dropped.
   */
  applyRows(
    slot: number,
    rowStart: number,
    nRows: number,
    src: Uint8Array,
    srcOffset: number,
    resync: boolean,
  ): void {
    if (this.pending[slot] === 1) this.detach(slot);
    const count = this.count[slot]!;
    const connects = count === 0 ? rowStart === 0 : this.firstPos[slot]! + count === rowStart;
    // Before the bump: a shadow is valid only at the version it was made at.
    const shadow =
      nRows > 0 && nRows < this.window
        ? this.shadowFor(slot, Math.min(count, this.window - nRows), nRows)
        : -1;
    this.bump(slot);
    if (nRows > 0) this.lastRows[slot] = nRows;
    if (resync || !connects || count === 0) {
      // An empty window takes the rows as they come: appending to nothing is replacing.
      this.replace(slot, rowStart, nRows, src, srcOffset);
    } else if (nRows > 0) {
      this.append(slot, nRows, src, srcOffset, shadow);
    }
  }

  /**
   * Receive placement: room for `nRows` (`<= W`) rows right after the slot's window, where the
   * transport reads them; the buffer is compacted or grown first when its end is too close (the
   * logical window is unchanged, so a STEP answered non-OK afterwards still changes nothing,
   * CONTRACT 7.2). An outstanding placement of another frame on this slot is abandoned (see the
   * module comment). Throws only when an allocation fails.
   */
  placeAfterWindow(slot: number, nRows: number): RowPlacement {
    if (!Number.isInteger(nRows) || nRows < 1 || nRows > this.window) {
      throw new WorkerError("WORKER_BAD_OPTION", `placement of ${nRows} rows outside 1..${this.window}`);
    }
    if (this.pending[slot] === 1) this.detach(slot);
    const rb = this.rowBytes;
    const count = this.count[slot]!;
    let start = this.start[slot]!;
    let buf = this.buffers[slot] ?? null;
    let row = start + count;
    if (buf === null || (start + count + nRows) * rb > this.usableBytes(slot, buf)) {
      // A valid shadow holds the rows this append keeps: place after it, the window untouched
      // (commitPlaced moves the window there; a cancelled placement leaves it as it was).
      const shadow = buf === null ? -1 : this.shadowFor(slot, Math.min(count, this.window - nRows), nRows);
      if (shadow >= 0) {
        row = shadow;
      } else {
        buf = this.ensureCapacity(slot, count + nRows, count);
        start = 0;
        this.start[slot] = 0;
        row = count;
      }
    }
    buf = buf!;
    this.bump(slot);
    this.pending[slot] = 1;
    return { row, version: this.version[slot]!, view: buf.subarray(row * rb, (row + nRows) * rb) };
  }

  /** Is the placement that returned `version` still valid (the slot unchanged since)? */
  placementValid(slot: number, version: number): boolean {
    return this.version[slot] === version;
  }

  /** A valid placement whose frame was not applied: the slot has no placement outstanding. */
  cancelPlacement(slot: number, version: number): void {
    if (this.version[slot] === version) this.pending[slot] = 0;
  }

  /**
   * CONTRACT 7.2 steps 2 and 3 for rows placed at buffer row `row` by a placement that is still
   * valid (check {@link placementValid} before the frame's generation check): the same outcome as
   * {@link applyRows}, without copying (`nRows <= W`).
   */
  commitPlaced(slot: number, rowStart: number, nRows: number, row: number, resync: boolean): void {
    this.pending[slot] = 0;
    this.bump(slot);
    if (nRows > 0) this.lastRows[slot] = nRows;
    const count = this.count[slot]!;
    const connects = count === 0 ? rowStart === 0 : this.firstPos[slot]! + count === rowStart;
    if (resync || !connects || count === 0) {
      this.clearWindow(slot);
      if (nRows === 0) return;
      this.start[slot] = row;
      this.count[slot] = nRows;
      this.firstPos[slot] = rowStart;
      this.nonEmpty++;
      return;
    }
    const total = count + nRows;
    const keep = Math.min(total, this.window);
    const dropped = total - keep;
    if (row !== this.start[slot]! + count) {
      // Placed after a shadow (placeAfterWindow): the kept rows sit right before `row`.
      this.shadowed++;
      this.start[slot] = row - (keep - nRows);
      this.count[slot] = keep;
      this.firstPos[slot] = this.firstPos[slot]! + dropped;
      return;
    }
    // Appended: the rows sit right after the window (nothing moved since the placement).
    this.start[slot] = this.start[slot]! + dropped;
    this.count[slot] = keep;
    this.firstPos[slot] = this.firstPos[slot]! + dropped;
  }

  /**
   * A placement found invalid at apply time: its rows may have been clobbered or moved away, so
   * the slot is treated as having lost its window (CONTRACT 7.2 step 5 then answers NEED_RESYNC).
   */
  dropWindow(slot: number): void {
    this.bump(slot);
    this.clearWindow(slot);
  }

  /** CONTRACT 7.2 step 4: drop the window and its memory, keep the generation. */
  release(slot: number): void {
    this.bump(slot);
    this.clearWindow(slot);
    const buf = this.buffers[slot];
    if (buf !== null && buf !== undefined) {
      this.buffers[slot] = null;
      if (this.pending[slot] === 1) {
        // A placement may still write into it: never hand it to another slot.
        this.pending[slot] = 0;
        this.allocatedBytes -= buf.byteLength;
      } else {
        this.giveBack(buf);
      }
    }
  }

  /** Drop every window and every generation and free the row memory (new session, RESET). */
  resetAll(): void {
    this.known.fill(0);
    this.generation.fill(0);
    this.start.fill(0);
    this.count.fill(0);
    this.firstPos.fill(0);
    this.buffers.fill(null);
    this.pool.length = 0;
    // Buffers are dropped, not pooled: outstanding placements write into garbage.
    this.version.fill(++this.stamp);
    this.pending.fill(0);
    this.nonEmpty = 0;
    this.allocatedBytes = 0;
  }

  /** Drop the state of slots `>= from` (a re-HELLO that lowered `max_slots`). */
  dropFrom(from: number): void {
    for (let s = from; s < this.maxSlots; s++) {
      this.release(s);
      this.known[s] = 0;
      this.generation[s] = 0;
    }
  }

  /**
   * CONTRACT 7.2 step 5: the rows of a window that ends at `anchorPos` (0 when the window ends
   * elsewhere).
   */
  heldAt(slot: number, anchorPos: number): number {
    const count = this.count[slot]!;
    if (count === 0) return 0;
    return this.firstPos[slot]! + count === anchorPos ? count : 0;
  }

  /** A view of the slot's last `nRows` rows (oldest first); valid until the slot changes. */
  rowsView(slot: number, nRows: number): Uint8Array {
    const buf = this.buffers[slot];
    if (buf === null || buf === undefined || nRows === 0) return EMPTY;
    const end = (this.start[slot]! + this.count[slot]!) * this.rowBytes;
    return buf.subarray(end - nRows * this.rowBytes, end);
  }

  /** Test hook: a copy of the slot's state. */
  debugWindow(slot: number): WindowSnapshot {
    const n = this.count[slot]!;
    return {
      known: this.known[slot] === 1,
      generation: this.generation[slot]!,
      firstPos: n === 0 ? 0 : this.firstPos[slot]!,
      nRows: n,
      rows: this.rowsView(slot, n).slice(),
    };
  }

  private bump(slot: number): void {
    this.version[slot] = ++this.stamp;
  }

  /**
   * Moves the slot's window to a fresh buffer and abandons the current one to an outstanding
   * placement (not pooled), so that the placement's late bytes cannot land in a live window.
   */
  private detach(slot: number): void {
    this.pending[slot] = 0;
    this.bump(slot);
    const cur = this.buffers[slot] ?? null;
    if (cur === null) return;
    const rb = this.rowBytes;
    const next = this.takeBuffer(cur.byteLength);
    const s = this.start[slot]! * rb;
    const n = this.count[slot]! * rb;
    if (n > 0) next.set(cur.subarray(s, s + n), 0);
    this.start[slot] = 0;
    this.buffers[slot] = next;
    this.allocatedBytes -= cur.byteLength;
  }

  private clearWindow(slot: number): void {
    if (this.count[slot]! > 0) this.nonEmpty--;
    this.count[slot] = 0;
    this.start[slot] = 0;
    this.firstPos[slot] = 0;
  }

  private replace(slot: number, rowStart: number, nRows: number, src: Uint8Array, srcOffset: number): void {
    this.clearWindow(slot);
    if (nRows === 0) return;
    const keep = Math.min(nRows, this.window);
    const skip = nRows - keep;
    const buf = this.ensureCapacity(slot, keep, 0);
    const rb = this.rowBytes;
    buf.set(src.subarray(srcOffset + skip * rb, srcOffset + nRows * rb), 0);
    this.start[slot] = 0;
    this.count[slot] = keep;
    this.firstPos[slot] = rowStart + skip;
    this.nonEmpty++;
  }

  private append(slot: number, nRows: number, src: Uint8Array, srcOffset: number, shadow: number): void {
    const W = this.window;
    const rb = this.rowBytes;
    if (nRows >= W) {
      const end = this.firstPos[slot]! + this.count[slot]!;
      this.replace(slot, end, nRows, src, srcOffset);
      return;
    }
    let start = this.start[slot]!;
    let count = this.count[slot]!;
    // Drop the oldest rows that the new ones push beyond W.
    const keep = Math.min(count, W - nRows);
    const dropped = count - keep;
    start += dropped;
    count = keep;
    this.firstPos[slot] = this.firstPos[slot]! + dropped;
    this.start[slot] = start;
    let buf = this.buffers[slot]!;
    if ((start + count + nRows) * rb > this.usableBytes(slot, buf)) {
      if (shadow >= 0) {
        // prepareAppends already moved the kept rows to [shadow - count, shadow).
        this.shadowed++;
        start = shadow - count;
      } else {
        buf = this.ensureCapacity(slot, count + nRows, count);
        start = 0;
      }
    }
    buf.set(src.subarray(srcOffset, srcOffset + nRows * rb), (start + count) * rb);
    this.start[slot] = start;
    this.count[slot] = count + nRows;
  }

  /**
   * The slot's buffer with room for `needRows` rows from buffer row 0, with the `keepRows` rows
   * of the current window (from buffer row `start[slot]`) moved to its front.
   */
  private ensureCapacity(slot: number, needRows: number, keepRows: number): Uint8Array {
    const rb = this.rowBytes;
    const maxRows = this.maxBufferRows;
    const cur = this.buffers[slot] ?? null;
    // A full-size buffer (at least 2W rows) always suffices: callers need at most W rows from
    // row 0, and W rows of room keep compactions to at most one extra copy per appended row.
    // Smaller buffers grow (doubling) when their end is reached rather than compact.
    if (
      cur !== null &&
      (cur.byteLength >= maxRows * rb || (keepRows === 0 && cur.byteLength >= needRows * rb))
    ) {
      const s = this.start[slot]! * rb;
      if (keepRows > 0 && s > 0) {
        cur.copyWithin(0, s, s + keepRows * rb);
        this.compacted++;
        this.phased[slot] = 1;
      }
      return cur;
    }
    let rows =
      cur === null ? Math.min(maxRows, MIN_CAPACITY_ROWS) : Math.min(maxRows, (cur.byteLength / rb) * 2);
    while (rows < needRows * 2 && rows < maxRows) rows = Math.min(maxRows, rows * 2);
    const next = this.takeBuffer(rows * rb);
    if (cur !== null) {
      if (keepRows > 0) {
        const s = this.start[slot]! * rb;
        next.set(cur.subarray(s, s + keepRows * rb), 0);
      }
      this.giveBack(cur);
    }
    this.buffers[slot] = next;
    this.phased[slot] = 0;
    return next;
  }

  private takeBuffer(bytes: number): Uint8Array {
    for (let i = 0; i < this.pool.length; i++) {
      const b = this.pool[i]!;
      if (b.byteLength >= bytes) {
        this.pool[i] = this.pool[this.pool.length - 1]!;
        this.pool.pop();
        return b;
      }
    }
    this.allocatedBytes += bytes;
    // Page-aligned once the shm transport has loaded koffi (@tapwire/transport copyTargetBytes):
    // its row copies from the mapping then run at full speed on AMD Zen.
    return copyTargetBytes(bytes);
  }

  private giveBack(buf: Uint8Array): void {
    if (this.pool.length < POOL_LIMIT && buf.byteLength === this.maxBufferRows * this.rowBytes) {
      this.pool.push(buf);
    } else {
      this.allocatedBytes -= buf.byteLength;
    }
  }
}

const EMPTY = new Uint8Array(0);
