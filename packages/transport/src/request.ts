// What every client shares (CONTRACT 3): its connection state, and the one outstanding request
// with its reply buffer, timer and settlement.
import { checkRequestArgs, checkRequestState, timeoutArg } from "./check.js";
import type { ClientConfig } from "./config.js";
import { CallSite, Failure, type TransportErrorCode } from "./errors.js";
import type { ClientMetrics } from "./metrics.js";

/** Connection state of a client: one table for every scheme. */
export const State = { CLOSED: 0, CONNECTING: 1, OPEN: 2 } as const;
/** Union of the {@link State} values. */
export type State = (typeof State)[keyof typeof State];

const NO_REPLY = new Uint8Array(0);

/** Settles one request: a reply length, or a failure turned into an error in the caller's frame. */
export type Settle = (r: number | Failure) => void;

/** A settled request's reply length, or its failure thrown as an error (in the awaiting caller's frame). */
export function replyOrThrow(r: number | Failure): number {
  if (typeof r === "number") return r;
  throw r.toError();
}

/**
 * The outstanding request of a client: at most one (CONTRACT 3). `begin` arms its timer; when it
 * fires, `onTimeout` is called (counted already) and must fail the request and close the
 * connection, since a late reply must never answer a later request.
 */
export class RequestCore {
  #pending = false;
  #replyBuf: Uint8Array = NO_REPLY;
  #settle: Settle | null = null;
  #timer: NodeJS.Timeout | null = null;
  #timeoutMs = 0;
  readonly #endpoint: string;
  readonly #maxMessageBytes: number;
  readonly #connectTimeoutMs: number;
  readonly #m: ClientMetrics;
  readonly #onTimeout: () => void;

  constructor(endpoint: string, opts: ClientConfig, metrics: ClientMetrics, onTimeout: () => void) {
    this.#endpoint = endpoint;
    this.#maxMessageBytes = opts.maxMessageBytes;
    this.#connectTimeoutMs = opts.connectTimeoutMs;
    this.#m = metrics;
    this.#onTimeout = onTimeout;
  }

  /**
   * What every client's connect() shares: nothing to do when open, the attempt under way when
   * one is, a rejection for a bad timeout (`timeoutMs`, else the client's default); otherwise
   * `start` runs the attempt with that timeout and the stack of `connect`'s caller (for errors
   * detected later, in socket callbacks).
   */
  connect(
    state: State,
    underWay: Promise<void> | null,
    timeoutMs: number | undefined,
    connect: (...args: never[]) => unknown,
    start: (ms: number, site: CallSite) => Promise<void>,
  ): Promise<void> {
    if (state === State.OPEN) return Promise.resolve();
    if (underWay !== null) return underWay;
    const site = new CallSite(connect);
    let ms: number;
    try {
      ms = timeoutArg("connect timeoutMs", timeoutMs ?? this.#connectTimeoutMs);
    } catch (e) {
      return Promise.reject(e);
    }
    return start(ms, site);
  }

  /** A request is outstanding. */
  get pending(): boolean {
    return this.#pending;
  }

  /** The outstanding request's reply buffer (empty when none). */
  get replyBuf(): Uint8Array {
    return this.#replyBuf;
  }

  /** The outstanding request's timeout, for messages. */
  get timeoutMs(): number {
    return this.#timeoutMs;
  }

  /**
   * Checks a request (its arguments, its timeout, then the client's state: one outstanding at
   * most, `open`, the size limit) and returns its byte count; {@link begin} then arms its timer
   * with that timeout. Throws in the caller's frame, so stacks name the caller.
   */
  admit(
    msg: Uint8Array | null,
    parts: readonly Uint8Array[],
    replyBuf: Uint8Array,
    timeoutMs: number,
    open: boolean,
    closeReason: string,
  ): number {
    const total = checkRequestArgs(msg, parts, replyBuf);
    const ms = timeoutArg("request timeoutMs", timeoutMs);
    checkRequestState(this.#endpoint, this.#pending, open, closeReason, total, this.#maxMessageBytes);
    this.#timeoutMs = ms;
    return total;
  }

  /** Starts the request just admitted, whose reply goes into `replyBuf`; the caller then writes it. */
  begin(replyBuf: Uint8Array): Promise<number | Failure> {
    const ms = this.#timeoutMs;
    const p = new Promise<number | Failure>((settle) => {
      this.#settle = settle;
    });
    this.#pending = true;
    this.#replyBuf = replyBuf;
    this.#timer = setTimeout(this.#fire, ms);
    return p;
  }

  readonly #fire = (): void => {
    this.#timer = null;
    if (!this.#pending) return;
    this.#m.timeouts.inc();
    this.#onTimeout();
  };

  /** Ends the outstanding request (if any) and returns how to settle it; the caller settles it last. */
  take(): Settle | null {
    if (this.#timer !== null) {
      clearTimeout(this.#timer);
      this.#timer = null;
    }
    const settle = this.#settle;
    this.#pending = false;
    this.#settle = null;
    this.#replyBuf = NO_REPLY;
    return settle;
  }

  /** Settles a taken request with its reply of `n` bytes (`wireBytes` on the wire), counted. */
  reply(settle: Settle, n: number, wireBytes: number): void {
    this.#m.requests.inc();
    this.#m.bytesIn.inc(wireBytes);
    settle(n);
  }

  /** Settles a taken request (if any) with a failure, counted unless it is a timeout (counted by the timer). */
  failure(settle: Settle | null, code: TransportErrorCode, why: string, cause: unknown): void {
    if (settle === null) return;
    if (code !== "TRANSPORT_TIMEOUT") this.#m.errors.inc();
    settle(new Failure(code, why, cause));
  }
}
