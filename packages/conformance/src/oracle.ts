/**
 * An oracle of the worker's window model (CONTRACT 7.1, 7.2 steps 1–6): given the entries of an
 * accepted STEP, the status and `window_rows` each entry must get. The tester runs it beside
 * the worker so that it checks values, not just "answered".
 */
import type { EntryFields } from "./frames.js";

interface SlotModel {
  gen: number;
  /** Position of the window's first row. */
  start: number;
  /** Rows held. */
  len: number;
}

/** Expected outcome of one entry. */
export interface Expected {
  status: number;
  windowRows: number;
}

function newer(a: number, b: number): boolean {
  const d = (a - b) >>> 0;
  return d !== 0 && d < 0x80000000;
}

/** The window model of one session. */
export class WindowOracle {
  private slots = new Map<number, SlotModel>();
  constructor(readonly window: number) {}

  /** Drops all slot state (new session, RESET). */
  reset(): void {
    this.slots.clear();
  }

  /** Number of slots with a non-empty window (`windows_kept` of a same-session re-HELLO). */
  get nonEmpty(): number {
    let n = 0;
    for (const s of this.slots.values()) if (s.len > 0) n++;
    return n;
  }

  /** Slots whose index is at or above `maxSlots` are dropped (a re-HELLO asking fewer slots). */
  dropFrom(maxSlots: number): void {
    for (const k of [...this.slots.keys()]) if (k >= maxSlots) this.slots.delete(k);
  }

  /** Applies an accepted STEP's entries in order and returns what each must be answered. */
  apply(entries: readonly EntryFields[]): Expected[] {
    const W = this.window;
    const out: Expected[] = [];
    for (const e of entries) {
      let s = this.slots.get(e.slot);
      // Step 1 (7.1).
      if (s !== undefined && s.gen !== e.generation >>> 0 && !newer(e.generation >>> 0, s.gen)) {
        out.push({ status: 3, windowRows: 0 });
        continue;
      }
      if (s === undefined || newer(e.generation >>> 0, s.gen)) {
        s = { gen: e.generation >>> 0, start: 0, len: 0 };
        this.slots.set(e.slot, s);
      }
      // Step 4.
      if ((e.flags & 4) !== 0) {
        s.start = 0;
        s.len = 0;
        out.push({ status: 0, windowRows: 0 });
        continue;
      }
      const n = e.nRows;
      if ((e.flags & 2) !== 0) {
        // Step 2: the window becomes the carried rows (the last W of them).
        s.start = e.rowStart + Math.max(0, n - W);
        s.len = Math.min(n, W);
      } else if (n > 0) {
        // Step 3: append when connecting, else replace; an empty window takes them either way.
        if (s.len > 0 && e.rowStart === s.start + s.len) {
          const total = s.len + n;
          const drop = Math.max(0, total - W);
          s.start += drop;
          s.len = total - drop;
        } else {
          s.start = e.rowStart + Math.max(0, n - W);
          s.len = Math.min(n, W);
        }
      }
      // Steps 5-6.
      const expected = Math.min(W, e.anchorPos);
      const held = s.len > 0 && s.start + s.len === e.anchorPos ? s.len : 0;
      const status = held === expected ? 0 : held > 0 ? 1 : 2;
      out.push({ status, windowRows: held });
    }
    return out;
  }
}
