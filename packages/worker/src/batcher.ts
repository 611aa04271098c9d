import type { Counter, Histogram, Registry } from "@tapwire/stats";
import { BUCKETS } from "@tapwire/stats";
import { TOP_K_MAX } from "@tapwire/wire";
import type { DraftBatchEntry, Drafter, DraftOutput } from "./drafter.js";

const EMPTY = new Uint8Array(0);

/** One STEP's consumed entries waiting for a drafter call (CONTRACT 12.1 "Batching"). */
interface Job {
  readonly port: Port;
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
  readonly callTime: Histogram;
  readonly gathers: Counter;
  readonly gatherTimeouts: Counter;
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
    callTime: r.histogram("batch_call_seconds", {
      help: "wall time of one drafter call of the shared worker (CONTRACT 12.1 batching)",
      unit: "seconds",
      buckets: BUCKETS.STEP_RTT_SECONDS,
    }),
    gathers: r.counter(
      "batch_gathers",
      "drafter calls held back for STEPs of sessions the previous call answered (batch gather)",
    ),
    gatherTimeouts: r.counter(
      "batch_gather_timeouts",
      "batch gathers ended by their bound before every awaited session's STEP arrived",
    ),
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
 * @internal What a STEP runner drafts through on a shared worker: one session's door into the
 * {@link SharedBatcher} (step.ts calls `submit`; sessions.ts holds one per held session).
 */
export interface Batcher {
  /** Drafts `batch` into `out` (the {@link Drafter.draft} contract), batched with other sessions. */
  submit(batch: readonly DraftBatchEntry[], out: DraftOutput): void | Promise<void>;
  /** The session will send no STEP soon (closed or dropped): never gather for it. */
  leave(): void;
}

/** A session's door as the batcher holds it: its place in {@link Awaited} (-1: not awaited). */
interface Port extends Batcher {
  at: number;
}

/**
 * The sessions a batch gather awaits. A call clears and refills it, and every STEP deletes its
 * session from it: a `Set` would allocate a new table on each `clear` (V8), on the unshared path
 * too, so each port holds its own index into one reused array (removal swaps in the last).
 */
class Awaited {
  readonly #list: Port[] = [];
  #n = 0;

  get size(): number {
    return this.#n;
  }

  add(p: Port): void {
    if (p.at >= 0) return;
    p.at = this.#n;
    this.#list[this.#n++] = p;
  }

  /** Removes `p`; false when it was not awaited. */
  delete(p: Port): boolean {
    const i = p.at;
    if (i < 0) return false;
    const last = this.#list[--this.#n]!;
    this.#list[i] = last;
    last.at = i;
    p.at = -1;
    return true;
  }

  clear(): void {
    for (let i = 0; i < this.#n; i++) this.#list[i]!.at = -1;
    this.#n = 0;
  }
}

/** Default bound of a batch gather (µs; `--batch-gather-us`, docs/worker.md "Batch gather"). */
export const DEFAULT_BATCH_GATHER_US = 2000;

/** Weight of the newest call in the running mean of call times (the gather's adaptive bound). */
const CALL_EWMA = 0.2;

/**
 * Solo calls tallied before their observations are folded into the batch histograms (at the
 * latest when this many are pending, else at the next scrape: `Registry.beforeRead`).
 */
export const SOLO_TALLY = 256;

/**
 * Consecutive calls of one session alone after which a synchronous call no longer holds the
 * event-loop turn (a lone session's own next STEP cannot arrive in that turn).
 */
export const LONE_RUN = 8;

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
 * sockets in that turn are queued and drafted together in one call. Not after {@link LONE_RUN}
 * calls in a row of one session alone: nothing else is sending, and that session's next STEP
 * cannot come before its reply, so holding the turn would only tax the unshared path; the first
 * STEP of another session ends the run.
 *
 * Batch gather (docs/worker.md "Batch gather"): closed-loop sessions send their next STEP soon
 * after their reply. The sessions a call answered are *awaited* until their next STEP arrives (or
 * they {@link Batcher.leave}). A call is held back while any awaited session is still missing,
 * at most `min(gatherUs, mean call time)` from the moment it could have started (one event-loop
 * turn when that is below a timer's 1 ms), so that the
 * sessions meet in one call instead of splitting into groups that alternate. A STEP arriving when
 * nothing runs and no other session is awaited (a lone session) is drafted at once: the gather
 * never delays it. `gatherUs` 0 turns gathering off.
 *
 * Fairness: a session has at most one STEP queued here (the worker serialises each session's
 * frames, sessions.ts), so a session flooding STEPs over many connections adds one STEP per call
 * and can never starve another; a gather delays a queued STEP by at most its bound, once per call.
 */
export class SharedBatcher {
  readonly #drafter: Drafter;
  readonly #maxEntries: number;
  readonly #gatherMs: number;
  readonly #m: BatcherMetrics;
  readonly #queue: Job[] = [];
  #head = 0;
  /** A drafter call runs (or a synchronous call's event-loop turn is not over). */
  #busy = false;
  /** Sessions answered by the last call whose next STEP has not arrived (the gather awaits them). */
  readonly #awaited = new Awaited();
  /** Cancels the pending gather's timer (null: no gather pending). */
  #gather: (() => void) | null = null;
  /** Running mean of drafter call wall times, ms (0 before the first call). */
  #callMs = 0;
  #callStart = 0;
  /** The session of the last calls when they were all one session's alone (null: not so). */
  #lonePort: Port | null = null;
  /** How many calls in a row drafted {@link #lonePort} alone. */
  #loneRun = 0;
  // Scratch of a merged call, grown on demand and then reused.
  #ids = new Int32Array(0);
  #conf = new Float32Array(0);
  #margin = new Float32Array(0);
  #mask = new Uint8Array(0);
  #support = new Int32Array(0);
  #q = new Uint32Array(0);
  #failed = new Uint8Array(0);
  // Solo calls not yet observed (folded by #fold): their entries and call seconds; each was one
  // STEP that waited 0 s. Keeps a lone session's call to field writes; by itself within the
  // bench's noise (docs/benchmarks/worker.md "What the shared path allocated, and the fix").
  readonly #soloEntries = new Uint32Array(SOLO_TALLY);
  readonly #soloCallS = new Float64Array(SOLO_TALLY);
  #soloPending = 0;
  readonly #pool: DraftBatchEntry[] = [];
  readonly #merged: DraftBatchEntry[] = [];
  readonly #jobs: Job[] = [];

  /**
   * `gatherUs`: bound of a batch gather in µs (0: never gather; default
   * {@link DEFAULT_BATCH_GATHER_US}).
   */
  constructor(
    drafter: Drafter,
    maxBatchEntries: number,
    registry: Registry,
    gatherUs = DEFAULT_BATCH_GATHER_US,
  ) {
    this.#drafter = drafter;
    this.#maxEntries = maxBatchEntries === 0 ? Number.POSITIVE_INFINITY : maxBatchEntries;
    this.#gatherMs = gatherUs / 1000;
    this.#m = batcherMetrics(registry);
    registry.beforeRead(() => this.#fold());
  }

  /** STEPs waiting for a drafter call. */
  get queued(): number {
    return this.#queue.length - this.#head;
  }

  /** Sessions the batch gather awaits (tests, STATS totals). */
  get awaited(): number {
    return this.#awaited.size;
  }

  /** A new session's door (one per held session, sessions.ts). */
  port(): Batcher {
    const port: Port = {
      at: -1,
      submit: (batch, out) => this.#submit(port, batch, out),
      leave: () => this.#leave(port),
    };
    return port;
  }

  /**
   * Drafts `batch` into `out` (the {@link Drafter.draft} contract): at once when no call runs and
   * no other session is awaited, else in the next call with the other queued STEPs. Throws (or
   * rejects) when the call that drafted it threw.
   */
  #submit(port: Port, batch: readonly DraftBatchEntry[], out: DraftOutput): void | Promise<void> {
    this.#awaited.delete(port);
    if (!this.#busy && this.queued === 0 && (this.#awaited.size === 0 || this.#gatherMs === 0)) {
      this.#awaited.clear();
      return this.#solo(port, batch, out);
    }
    return this.#enqueue(port, batch, out);
  }

  /** Queues a STEP for the next call (its own method: the solo path creates no closure). */
  #enqueue(port: Port, batch: readonly DraftBatchEntry[], out: DraftOutput): Promise<void> {
    const p = new Promise<void>((resolve, reject) => {
      this.#queue.push({ port, batch, out, queuedAt: performance.now(), resolve, reject });
    });
    if (!this.#busy) {
      if (this.#gather === null) this.#next();
      else if (this.#gatherDone()) this.#endGather(false);
    }
    return p;
  }

  #leave(port: Port): void {
    if (!this.#awaited.delete(port)) return;
    if (this.#gather !== null && this.#gatherDone()) this.#endGather(false);
  }

  /** Entries of the queued STEPs. */
  #queuedEntries(): number {
    let n = 0;
    for (let i = this.#head; i < this.#queue.length; i++) n += this.#queue[i]!.batch.length;
    return n;
  }

  /** A gather has nothing more to wait for: no session awaited, or the next call is full. */
  #gatherDone(): boolean {
    return this.#awaited.size === 0 || this.#queuedEntries() >= this.#maxEntries;
  }

  /** The gather's bound, ms: `gatherUs`, and never more than a mean call (0: do not gather). */
  #gatherBound(): number {
    return Math.min(this.#gatherMs, this.#callMs);
  }

  #endGather(timedOut: boolean): void {
    if (this.#gather !== null) this.#gather();
    this.#gather = null;
    if (timedOut) this.#m.gatherTimeouts.inc();
    // Sessions still missing are no longer awaited: a gather waits for them once.
    this.#awaited.clear();
    this.#next();
  }

  /** Counts a drafter call of `entries` entries (solo calls too: their histograms are tallied). */
  #countCall(entries: number): void {
    this.#m.calls.inc();
    this.#m.entries.inc(entries);
  }

  #count(entries: number, steps: number): void {
    const m = this.#m;
    this.#countCall(entries);
    m.batchEntries.observe(entries);
    m.batchSteps.observe(steps);
    if (steps > 1) m.merged.inc();
  }

  /**
   * A call with one STEP, written straight into its reply. Counted like any call, but its
   * histogram observations are tallied ({@link SOLO_TALLY}) and folded in later.
   */
  #solo(port: Port, batch: readonly DraftBatchEntry[], out: DraftOutput): void | Promise<void> {
    this.#busy = true;
    this.#countCall(batch.length);
    this.#callStart = performance.now();
    let r: void | Promise<void>;
    try {
      r = this.#drafter.draft(batch, out);
    } catch (e) {
      this.#soloCalled(port, batch.length);
      this.#afterSync();
      throw e;
    }
    if (r instanceof Promise) return this.#soloLater(r, port, batch.length);
    this.#soloCalled(port, batch.length);
    this.#afterSync();
  }

  /** An asynchronous solo call's end (its own method: the synchronous path creates no closure). */
  #soloLater(r: Promise<void>, port: Port, entries: number): Promise<void> {
    return r.then(
      () => {
        this.#soloCalled(port, entries);
        this.#next();
      },
      (e: unknown) => {
        this.#soloCalled(port, entries);
        this.#next();
        throw e;
      },
    );
  }

  /** A solo call of `entries` entries ended: tallied, then {@link #called}. */
  #soloCalled(port: Port, entries: number): void {
    const ms = performance.now() - this.#callStart;
    const i = this.#soloPending;
    this.#soloEntries[i] = entries;
    this.#soloCallS[i] = ms / 1000;
    this.#soloPending = i + 1;
    if (i + 1 === SOLO_TALLY) this.#fold();
    this.#called(port, null, ms);
  }

  /** The wall time of the call that just ended (ms), observed in `batch_call_seconds`. */
  #timed(): number {
    const ms = performance.now() - this.#callStart;
    this.#m.callTime.observe(ms / 1000);
    return ms;
  }

  /** Observes the tallied solo calls: `batch_steps` 1 and `batch_queue_seconds` 0 each. */
  #fold(): void {
    const n = this.#soloPending;
    if (n === 0) return;
    this.#soloPending = 0;
    const m = this.#m;
    for (let i = 0; i < n; i++) {
      m.batchEntries.observe(this.#soloEntries[i]!);
      m.batchSteps.observe(1);
      m.queueTime.observe(0);
      m.callTime.observe(this.#soloCallS[i]!);
    }
  }

  /**
   * A call of `ms` ended: its time joins the running mean, and the sessions it answered (`port`,
   * or the ports of `jobs`) are the ones the next gather awaits.
   */
  #called(port: Port | null, jobs: readonly Job[] | null, ms: number): void {
    this.#callMs = this.#callMs === 0 ? ms : this.#callMs + CALL_EWMA * (ms - this.#callMs);
    this.#awaited.clear();
    if (port !== null) this.#awaited.add(port);
    if (jobs !== null) for (const j of jobs) this.#awaited.add(j.port);
    const one = port ?? (jobs !== null && jobs.length === 1 ? jobs[0]!.port : null);
    if (one !== null && one === this.#lonePort) this.#loneRun++;
    else {
      this.#lonePort = one;
      this.#loneRun = one === null ? 0 : 1;
    }
    // Those that already sent their next STEP (queued during the call) are not awaited.
    for (let i = this.#head; i < this.#queue.length; i++) this.#awaited.delete(this.#queue[i]!.port);
  }

  /**
   * After a synchronous call: stay busy for this event-loop turn so its arrivals batch, unless one
   * session has been drafted alone {@link LONE_RUN} times in a row and nothing is queued.
   */
  #afterSync(): void {
    if (this.#loneRun >= LONE_RUN && this.queued === 0) {
      this.#next();
      return;
    }
    setImmediate(() => this.#next());
  }

  /**
   * Starts the next call with the queued STEPs, or gathers first (sessions the last call answered
   * are still missing: wait at most the gather bound), or goes idle.
   */
  #next(): void {
    if (this.queued === 0) {
      this.#busy = false;
      this.#queue.length = 0;
      this.#head = 0;
      return;
    }
    if (this.#gather === null && this.#gatherMs > 0 && !this.#gatherDone()) {
      const bound = this.#gatherBound();
      if (bound > 0) {
        this.#busy = false;
        this.#m.gathers.inc();
        const fire = (): void => {
          this.#gather = null;
          this.#endGather(true);
        };
        // Timers tick in whole ms: a bound below 1 ms (a cheap drafter) gathers for one
        // event-loop turn instead, so the wait stays near the bound, not a timer tick.
        if (bound < 1) {
          const h = setImmediate(fire);
          this.#gather = () => clearImmediate(h);
        } else {
          const t = setTimeout(fire, bound);
          this.#gather = () => clearTimeout(t);
        }
        return;
      }
    }
    if (this.#gather !== null) {
      this.#gather();
      this.#gather = null;
    }
    this.#busy = true;
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
    this.#callStart = performance.now();
    let r: void | Promise<void>;
    try {
      r = this.#drafter.draft(j.batch, j.out);
    } catch (e) {
      this.#called(j.port, null, this.#timed());
      j.reject(e);
      this.#afterSync();
      return;
    }
    if (r instanceof Promise) {
      r.then(
        () => {
          this.#called(j.port, null, this.#timed());
          j.resolve();
          this.#next();
        },
        (e: unknown) => {
          this.#called(j.port, null, this.#timed());
          j.reject(e);
          this.#next();
        },
      );
      return;
    }
    this.#called(j.port, null, this.#timed());
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
    this.#callStart = performance.now();
    let r: void | Promise<void>;
    try {
      r = this.#drafter.draft(merged, out);
    } catch (e) {
      this.#called(null, jobs, this.#timed());
      done(e, true);
      this.#afterSync();
      return;
    }
    if (r instanceof Promise) {
      r.then(
        () => {
          this.#called(null, jobs, this.#timed());
          done(null, false);
          this.#next();
        },
        (e: unknown) => {
          this.#called(null, jobs, this.#timed());
          done(e, true);
          this.#next();
        },
      );
      return;
    }
    this.#called(null, jobs, this.#timed());
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
