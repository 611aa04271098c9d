/**
 * The continuous-batching scheduler: requests arrive over time, wait in FIFO order for one of `S`
 * slots, run until done, and free their slot for the next request, which takes it with a new,
 * newer generation (CONTRACT 7.1: rank 0 never sends an older generation for a slot than one it
 * sent before; generations are u32 serial numbers, so they may wrap).
 */
import { serialAdd } from "@tapwire/wire";
import { HarnessError, HarnessErrorCode } from "../errors.js";

/** CONTRACT 2 serial arithmetic on u32, from `@tapwire/wire`. */
export { serialAdd, serialNewer } from "@tapwire/wire";

/** A request holding a slot. */
export interface Placement<R> {
  req: R;
  slot: number;
  generation: number;
}

/** Options of {@link SlotScheduler}. */
export interface SlotSchedulerOptions {
  /** Number of slots S (1..2^20). */
  slots: number;
  /**
   * The generation a slot had before its first request (its first request gets this + 1).
   * Default 0 for every slot; the harness starts near 2^32 so that runs cross the wrap.
   */
  initialGeneration?: (slot: number) => number;
}

/** Slot assignment with FIFO admission and per-slot generations. */
export class SlotScheduler<R> {
  readonly slots: number;
  private readonly gen: Uint32Array;
  private readonly holder: Array<Placement<R> | null>;
  private readonly free: number[] = [];
  private readonly queue: R[] = [];
  private qHead = 0;
  private admittedCount = 0;

  constructor(options: SlotSchedulerOptions) {
    const { slots } = options;
    if (!Number.isInteger(slots) || slots < 1 || slots > 2 ** 20) {
      throw new HarnessError(HarnessErrorCode.USAGE, `slots: ${slots} is not an integer in 1..2^20`);
    }
    this.slots = slots;
    this.gen = new Uint32Array(slots);
    this.holder = new Array<Placement<R> | null>(slots).fill(null);
    for (let s = 0; s < slots; s++) {
      this.gen[s] = (options.initialGeneration?.(s) ?? 0) >>> 0;
    }
    // lowest free slot first: pop() from the end of a descending list
    for (let s = slots - 1; s >= 0; s--) this.free.push(s);
  }

  /** Queues a request that is ready to run (arrived, media loaded). */
  submit(req: R): void {
    this.queue.push(req);
  }

  /** Requests waiting for a slot. */
  get queued(): number {
    return this.queue.length - this.qHead;
  }

  /** Requests holding a slot. */
  get runningCount(): number {
    return this.slots - this.free.length;
  }

  /** Requests admitted so far. */
  get admitted(): number {
    return this.admittedCount;
  }

  /** The current generation of a slot (that of its running request, or its last one). */
  generation(slot: number): number {
    return this.gen[slot] as number;
  }

  /** The placement holding `slot`, or null when it is free. */
  at(slot: number): Placement<R> | null {
    return this.holder[slot] ?? null;
  }

  /** Every running placement, in slot order. */
  running(): Placement<R>[] {
    const out: Placement<R>[] = [];
    for (const p of this.holder) if (p) out.push(p);
    return out;
  }

  /**
   * Moves queued requests into free slots (FIFO, lowest free slot first); each admitted request
   * gets its slot's next generation. Returns the new placements.
   */
  admit(): Placement<R>[] {
    const out: Placement<R>[] = [];
    while (this.free.length > 0 && this.qHead < this.queue.length) {
      const req = this.queue[this.qHead] as R;
      this.qHead++;
      const slot = this.free.pop() as number;
      const generation = serialAdd(this.gen[slot] as number, 1);
      this.gen[slot] = generation;
      const p: Placement<R> = { req, slot, generation };
      this.holder[slot] = p;
      out.push(p);
      this.admittedCount++;
    }
    if (this.qHead > 1024 && this.qHead * 2 > this.queue.length) {
      this.queue.splice(0, this.qHead);
      this.qHead = 0;
    }
    return out;
  }

  /** Frees a slot whose request finished; the slot's generation is kept for its next request. */
  release(slot: number): Placement<R> {
    const p = this.holder[slot];
    if (!p) throw new HarnessError(HarnessErrorCode.INTERNAL, `release of free slot ${slot}`);
    this.holder[slot] = null;
    // keep lowest-first order for the next admission
    let i = this.free.length;
    this.free.push(slot);
    while (i > 0 && (this.free[i - 1] as number) < slot) {
      this.free[i] = this.free[i - 1] as number;
      i--;
    }
    this.free[i] = slot;
    return p;
  }
}

/** Requests ordered by arrival time, released once their time has come. */
export class ArrivalQueue<R extends { arrivalMs: number }> {
  private readonly items: R[];
  private next = 0;

  constructor(requests: readonly R[]) {
    this.items = [...requests].sort((a, b) => a.arrivalMs - b.arrivalMs);
  }

  /** Requests whose arrival time is at or before `nowMs`, in arrival order (each returned once). */
  due(nowMs: number): R[] {
    const out: R[] = [];
    while (this.next < this.items.length && (this.items[this.next] as R).arrivalMs <= nowMs) {
      out.push(this.items[this.next] as R);
      this.next++;
    }
    return out;
  }

  /** Arrival time of the next request not yet due, or null when all have arrived. */
  nextArrivalMs(): number | null {
    const r = this.items[this.next];
    return r ? r.arrivalMs : null;
  }

  /** Requests not yet arrived. */
  get remaining(): number {
    return this.items.length - this.next;
  }
}
