import type { Counter, Histogram, Registry } from "@tapwire/stats";
import { BUCKETS } from "@tapwire/stats";
import { TOP_K_MAX } from "@tapwire/wire";
import type { DraftBatchEntry, Drafter, DraftOutput } from "./drafter.js";

const EMPTY = new Uint8Array(0);

/** One STEP's consumed entries waiting for a drafter call (CONTRACT 12.1 "Batching"). */
interface Job {
  readonly batch: readonly DraftBatchEntry[];
  readonly out: DraftOutput;
  /** `performance.now()` when queued. */
  readonly queuedAt: number;
  resolve(): void;
  reject(e: unknown): void;
}

/** @internal The batcher's metrics (names in docs/worker.md "Shared workers"). */
interface BatcherMetrics {
  readonly calls: Counter;
  readonly entries: Counter;
  readonly merged: Counter;
  readonly batchEntries: Histogram;
  readonly batchSteps: Histogram;
  readonly queueTime: Histogram;
}

function batcherMetrics(r: Registry): BatcherMetrics {
  return {
    calls: r.counter("drafter_calls", "batched drafter calls"),
    entries: r.counter("entries_drafted", "entries handed to the drafter"),
    merged: r.counter(
      "drafter_calls_merged",
      "drafter calls that drafted the entries of more than one STEP (CONTRACT 12.1)",
    ),
    batchEntries: r.histogram("batch_entries", {
      help: "entries per drafter call (CONTRACT 12.1 cross-session batching)",
      unit: "none",
      buckets: BUCKETS.COUNT,
    }),
    batchSteps: r.histogram("batch_steps", {
      help: "STEPs per drafter call (CONTRACT 12.1 cross-session batching)",
      unit: "none",
      buckets: BUCKETS.COUNT,
    }),
    queueTime: r.histogram("batch_queue_seconds", {
      help: "time a STEP's entries waited for a drafter call (0 when drafted at once)",
      unit: "seconds",
      buckets: BUCKETS.STEP_RTT_SECONDS,
    }),
  };
}

/** Grows a typed array to at least `n` elements (doubling), keeping nothing: scratch only. */
function atLeast<T extends Int32Array | Float32Array | Uint32Array | Uint8Array>(
  a: T,
  n: number,
  make: (n: number) => T,
): T {
  if (a.length >= n) return a;
  let c = Math.max(64, a.length);
  while (c < n) c *= 2;
  return make(c);
}

/**
 * @internal Cross-session batching of a shared worker (CONTRACT 12.1 "Batching"). A STEP's
 * consumed entries are handed to {@link submit}: when no drafter call is running they are drafted
 * at once, alone, straight into the STEP's reply (the unshared path: no copy); otherwise they are
 * queued, and the next call drafts every queued STEP together, oldest first, at most
 * `maxBatchEntries` entries (a STEP is never split; one larger than the bound goes alone). The
 * merged call writes into scratch outputs at merged entry indices, copied back into each STEP's
 * reply afterwards, so every reply holds exactly what drafting it alone writes (drafting is a
 * function of each entry's window, anchor token and sample meta only).
 *
 * A synchronous drafter never "runs" while a frame arrives, so after a synchronous call the
 * batcher stays busy until the event loop's check phase (`setImmediate`): the STEPs read from the
 * sockets in that turn are queued and drafted together in one call.
 *
 * Fairness: a session has at most one STEP queued here (the worker serialises each session's
 * frames, sessions.ts), so a session flooding STEPs over many connections adds one STEP per call
 * and can never starve another.
 */
export class Batcher {
  readonly #drafter: Drafter;
  readonly #maxEntries: number;
  readonly #m: BatcherMetrics;
  readonly #queue: Job[] = [];
  #head = 0;
  #busy = false;
  // Scratch of a merged call, grown on demand and then reused.
  #ids = new Int32Array(0);
  #conf = new Float32Array(0);
  #margin = new Float32Array(0);
  #mask = new Uint8Array(0);
  #support = new Int32Array(0);
  #q = new Uint32Array(0);
  #failed = new Uint8Array(0);
  readonly #pool: DraftBatchEntry[] = [];
  readonly #merged: DraftBatchEntry[] = [];
  readonly #jobs: Job[] = [];

  constructor(drafter: Drafter, maxBatchEntries: number, registry: Registry) {
    this.#drafter = drafter;
    this.#maxEntries = maxBatchEntries === 0 ? Number.POSITIVE_INFINITY : maxBatchEntries;
    this.#m = batcherMetrics(registry);
  }

  /** STEPs waiting for a drafter call. */
  get queued(): number {
    return this.#queue.length - this.#head;
  }

  /**
   * Drafts `batch` into `out` (the {@link Drafter.draft} contract): at once when no call runs,
   * else in the next call with the other queued STEPs. Throws (or rejects) when the call that
   * drafted it threw.
   */
  submit(batch: readonly DraftBatchEntry[], out: DraftOutput): void | Promise<void> {
    if (!this.#busy && this.queued === 0) return this.#solo(batch, out);
    return new Promise<void>((resolve, reject) => {
      this.#queue.push({ batch, out, queuedAt: performance.now(), resolve, reject });
    });
  }

  #count(entries: number, steps: number): void {
    const m = this.#m;
    m.calls.inc();
    m.entries.inc(entries);
    m.batchEntries.observe(entries);
    m.batchSteps.observe(steps);
    if (steps > 1) m.merged.inc();
  }

  /** A call with one STEP, written straight into its reply. */
  #solo(batch: readonly DraftBatchEntry[], out: DraftOutput): void | Promise<void> {
    this.#busy = true;
    this.#count(batch.length, 1);
    this.#m.queueTime.observe(0);
    let r: void | Promise<void>;
    try {
      r = this.#drafter.draft(batch, out);
    } catch (e) {
      this.#afterSync();
      throw e;
    }
    if (r instanceof Promise) {
      return r.then(
        () => this.#next(),
        (e: unknown) => {
          this.#next();
          throw e;
        },
      );
    }
    this.#afterSync();
  }

  /** After a synchronous call: stay busy for this event-loop turn so its arrivals batch. */
  #afterSync(): void {
    setImmediate(() => this.#next());
  }

  /** Starts the next call with the queued STEPs, or goes idle. */
  #next(): void {
    if (this.queued === 0) {
      this.#busy = false;
      this.#queue.length = 0;
      this.#head = 0;
      return;
    }
    const jobs = this.#jobs;
    jobs.length = 0;
    let entries = 0;
    const now = performance.now();
    while (this.#head < this.#queue.length) {
      const j = this.#queue[this.#head]!;
      if (jobs.length > 0 && entries + j.batch.length > this.#maxEntries) break;
      jobs.push(j);
      entries += j.batch.length;
      this.#head++;
      this.#m.queueTime.observe((now - j.queuedAt) / 1000);
    }
    if (this.#head === this.#queue.length) {
      this.#queue.length = 0;
      this.#head = 0;
    }
    this.#count(entries, jobs.length);
    if (jobs.length === 1) {
      this.#runOne(jobs[0]!);
      return;
    }
    this.#runMerged(jobs.slice(), entries);
  }

  #runOne(j: Job): void {
    let r: void | Promise<void>;
    try {
      r = this.#drafter.draft(j.batch, j.out);
    } catch (e) {
      j.reject(e);
      this.#afterSync();
      return;
    }
    if (r instanceof Promise) {
      r.then(
        () => {
          j.resolve();
          this.#next();
        },
        (e: unknown) => {
          j.reject(e);
          this.#next();
        },
      );
      return;
    }
    j.resolve();
    this.#afterSync();
  }

  /** One drafter call over several STEPs: merged indices into scratch, copied back after. */
  #runMerged(jobs: Job[], entries: number): void {
    const N = this.#drafter.numSpec;
    let margin = false;
    let sampled = false;
    for (const j of jobs) {
      if (j.out.margin !== null) margin = true;
      if (j.out.sampledMask !== null) sampled = true;
    }
    const out = this.#scratch(entries, N, margin, sampled);
    const merged = this.#merged;
    merged.length = 0;
    let mi = 0;
    for (const j of jobs) {
      for (const e of j.batch) {
        let m = this.#pool[mi];
        if (m === undefined) {
          m = { index: 0, slot: 0, anchorPos: 0, anchorToken: 0, k: 0, rows: EMPTY, nRows: 0, sample: null };
          this.#pool.push(m);
        }
        m.index = mi;
        m.slot = e.slot;
        m.anchorPos = e.anchorPos;
        m.anchorToken = e.anchorToken;
        m.k = e.k;
        m.rows = e.rows;
        m.nRows = e.nRows;
        m.sample = e.sample;
        merged.push(m);
        mi++;
      }
    }
    const done = (err: unknown, failed: boolean): void => {
      let base = 0;
      for (const j of jobs) {
        if (failed) j.reject(err);
        else {
          try {
            this.#copyBack(j, base, out);
            j.resolve();
          } catch (e) {
            j.reject(e);
          }
        }
        base += j.batch.length;
      }
      // No view of a session's windows outlives the call (a dropped session's memory returns).
      for (const m of merged) m.rows = EMPTY;
    };
    let r: void | Promise<void>;
    try {
      r = this.#drafter.draft(merged, out);
    } catch (e) {
      done(e, true);
      this.#afterSync();
      return;
    }
    if (r instanceof Promise) {
      r.then(
        () => {
          done(null, false);
          this.#next();
        },
        (e: unknown) => {
          done(e, true);
          this.#next();
        },
      );
      return;
    }
    done(null, false);
    this.#afterSync();
  }

  /** The zeroed scratch outputs of a merged call of `n` entries. */
  #scratch(n: number, N: number, margin: boolean, sampled: boolean): DraftOutput {
    const p = n * N;
    this.#ids = atLeast(this.#ids, p, (c) => new Int32Array(c));
    this.#conf = atLeast(this.#conf, p, (c) => new Float32Array(c));
    this.#failed = atLeast(this.#failed, n, (c) => new Uint8Array(c));
    this.#ids.fill(0, 0, p);
    this.#conf.fill(0, 0, p);
    this.#failed.fill(0, 0, n);
    if (margin) {
      this.#margin = atLeast(this.#margin, p, (c) => new Float32Array(c));
      this.#margin.fill(0, 0, p);
    }
    if (sampled) {
      this.#mask = atLeast(this.#mask, p, (c) => new Uint8Array(c));
      this.#support = atLeast(this.#support, p * TOP_K_MAX, (c) => new Int32Array(c));
      this.#q = atLeast(this.#q, p * TOP_K_MAX, (c) => new Uint32Array(c));
      this.#mask.fill(0, 0, p);
      this.#support.fill(0, 0, p * TOP_K_MAX);
      this.#q.fill(0, 0, p * TOP_K_MAX);
    }
    return {
      draftIds: this.#ids,
      confidence: this.#conf,
      margin: margin ? this.#margin : null,
      sampledMask: sampled ? this.#mask : null,
      supportIds: sampled ? this.#support : null,
      proposalQ: sampled ? this.#q : null,
      numSpec: N,
      failed: this.#failed,
    };
  }

  /** A STEP's values from the merged scratch (from merged index `base` on) into its reply. */
  #copyBack(j: Job, base: number, from: DraftOutput): void {
    const N = from.numSpec;
    const to = j.out;
    for (let b = 0; b < j.batch.length; b++) {
      const mi = base + b;
      const ix = j.batch[b]!.index;
      const s = mi * N;
      const d = ix * N;
      to.draftIds.set(from.draftIds.subarray(s, s + N), d);
      to.confidence.set(from.confidence.subarray(s, s + N), d);
      if (to.margin !== null && from.margin !== null) to.margin.set(from.margin.subarray(s, s + N), d);
      if (to.sampledMask !== null && from.sampledMask !== null) {
        to.sampledMask.set(from.sampledMask.subarray(s, s + N), d);
        const s32 = s * TOP_K_MAX;
        const d32 = d * TOP_K_MAX;
        to.supportIds!.set(from.supportIds!.subarray(s32, s32 + N * TOP_K_MAX), d32);
        to.proposalQ!.set(from.proposalQ!.subarray(s32, s32 + N * TOP_K_MAX), d32);
      }
      if (to.failed !== undefined && from.failed![mi] === 1) to.failed[ix] = 1;
    }
  }
}
