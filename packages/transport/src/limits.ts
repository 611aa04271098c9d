// CONTRACT 11 "Memory and connections (1.1)": the receive budget and the connection cap shared by
// every connection of one server (stream and ZeroMQ alike). Per-connection limits (the bound and
// unbound message limits, the unbound idle timer) live with the connection.
import type { ServerMetrics } from "./metrics.js";

/** What the limits need to know of a connection (a stream `Conn` or a ZeroMQ `Peer`). */
export interface Limited {
  readonly bound: boolean;
  /** Date.now() of the accept or of the last whole message. */
  readonly lastActive: number;
  /** A handler runs (or its reply is being written): not evicted. */
  readonly isBusy: boolean;
  /** Closes it to make room for a new connection. */
  evict(): void;
}

/**
 * Receive budget (`maxBufferedBytes`) and connection admission (`maxConnections`, at most half
 * unbound) of one server. Waiters (bound connections paused for budget) are woken in FIFO order.
 */
export class ServerLimits<C extends Limited> {
  readonly #maxBuffered: number;
  readonly #maxConnections: number;
  readonly #maxUnbound: number;
  readonly #m: ServerMetrics;
  #used = 0;
  readonly #waiters: (() => boolean)[] = [];
  /** Connections counted against `maxConnections` (closed ones leave at once, not on 'close'). */
  #held = 0;
  readonly #unbound = new Set<C>();
  /** Frees buffers that connections keep but do not use now (calls {@link uncharge}). */
  reclaim: (() => void) | null = null;
  /**
   * The bound connection to evict when `maxConnections` is reached and no unbound one can go
   * (null: none, refuse). Only the ZeroMQ server sets it: a ROUTER never hears that a peer went
   * away, so without it vanished bound peers would fill `maxConnections` for good.
   */
  boundVictim: (() => C | null) | null = null;

  constructor(maxBufferedBytes: number, maxConnections: number, metrics: ServerMetrics) {
    this.#maxBuffered = maxBufferedBytes;
    this.#maxConnections = maxConnections;
    this.#maxUnbound = Math.max(1, Math.floor(maxConnections / 2));
    this.#m = metrics;
  }

  /** Whether a budget is configured (accounting is skipped otherwise). */
  get budgeted(): boolean {
    return this.#maxBuffered > 0;
  }

  /** Bytes charged now. */
  get used(): number {
    return this.#used;
  }

  /**
   * Charges `n` bytes when they fit the budget (after reclaiming idle buffers if needed).
   * Always succeeds without a budget.
   */
  tryCharge(n: number): boolean {
    if (this.#maxBuffered === 0) return true;
    if (this.#used + n > this.#maxBuffered) {
      this.reclaim?.();
      if (this.#used + n > this.#maxBuffered) return false;
    }
    this.#used += n;
    this.#m.bufferedBytes.set(this.#used);
    return true;
  }

  /** Charges `n` bytes even above the budget (bytes that are in memory already). */
  force(n: number): void {
    this.#used += n;
    this.#m.bufferedBytes.set(this.#used);
  }

  /** Some connection waits for budget: kept buffers should be given back as soon as idle. */
  get hasWaiters(): boolean {
    return this.#waiters.length > 0;
  }

  /** Whether connections must keep `lastActive` up to date (maxConnections is on). */
  get tracksIdle(): boolean {
    return this.#maxConnections > 0;
  }

  /** Returns `n` charged bytes without waking waiters (from inside a reclaim). */
  uncharge(n: number): void {
    this.#used -= n;
    this.#m.bufferedBytes.set(this.#used);
  }

  /** Returns `n` charged bytes and wakes waiters that now fit. */
  release(n: number): void {
    if (n <= 0 || this.#maxBuffered === 0) return;
    this.#used -= n;
    this.#m.bufferedBytes.set(this.#used);
    this.#wake();
  }

  /**
   * Queues `retry` until budget is released: it is called (in FIFO order) and returns true once
   * it could go on (it charged what it needed, or it was closed meanwhile).
   */
  wait(retry: () => boolean): void {
    this.#m.budgetWaits.inc();
    this.#waiters.push(retry);
  }

  #wake(): void {
    while (this.#waiters.length > 0) {
      const retry = this.#waiters[0] as () => boolean;
      if (!retry()) return;
      this.#waiters.shift();
    }
  }

  /** Number of unbound connections held now. */
  get unbound(): number {
    return this.#unbound.size;
  }

  /**
   * Admits a new connection (it starts unbound): true when there is room, after evicting the
   * unbound connection idle longest if the new one would pass `maxConnections` or the unbound
   * half; with none, at `maxConnections` (below the unbound half), the bound connection
   * {@link boundVictim} names, if set; false (counted) when nothing can be evicted.
   */
  admit(): boolean {
    const max = this.#maxConnections;
    if (max > 0 && (this.#held >= max || this.unbound >= this.#maxUnbound)) {
      let victim: C | null = null;
      for (const c of this.#unbound) {
        if (!c.isBusy && (victim === null || c.lastActive < victim.lastActive)) victim = c;
      }
      if (victim !== null) {
        this.#m.connectionsEvicted.inc();
        victim.evict();
      } else {
        const bound = this.unbound < this.#maxUnbound ? (this.boundVictim?.() ?? null) : null;
        if (bound === null) {
          this.#m.connectionsRefused.inc();
          return false;
        }
        this.#m.boundEvicted.inc();
        bound.evict();
      }
    }
    this.#held++;
    return true;
  }

  /** `next` takes the place of the admitted `prev` (a TLS handshake that became a connection). */
  replace(prev: C, next: C): void {
    this.#unbound.delete(prev);
    this.#unbound.add(next);
  }

  /** Starts tracking an admitted connection (unbound). */
  track(c: C): void {
    this.#unbound.add(c);
    this.#m.unbound.set(this.unbound);
  }

  /** The connection was bound or unbound. */
  setBound(c: C, bound: boolean): void {
    if (bound) this.#unbound.delete(c);
    else this.#unbound.add(c);
    this.#m.unbound.set(this.unbound);
  }

  /** The connection is closed (call once per admitted connection; null: admitted, never tracked). */
  untrack(c: C | null): void {
    if (c !== null) this.#unbound.delete(c);
    this.#held--;
    this.#m.unbound.set(this.unbound);
  }
}
