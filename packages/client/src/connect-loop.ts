import type { RpcClient } from "@tapwire/transport";
import type { Hello, HelloReply } from "@tapwire/wire";
import {
  checkHelloReply,
  decodeHelloReply,
  encodeHello,
  FATAL_FRAME_STATUS,
  FrameStatus,
  frame,
  HELLO_REPLY_BODY_SIZE,
  helloAuth,
  Op,
  splitFrame,
  WireError,
} from "@tapwire/wire";
import type { Clock } from "./clock.js";
import { clampDelay } from "./clock.js";
import { ClientError } from "./errors.js";
import { echoProblem, statusName } from "./outcomes.js";

/** What the background connect loop drives (the client; CONTRACT 9.1). */
export interface ConnectLoopHost {
  /** False once the client is closed or disabled: the loop ends. */
  live(): boolean;
  /** True while a connection is installed: the loop sleeps until woken. */
  connected(): boolean;
  /** Clock time (ms) of the next attempt. */
  nextAttempt(): number;
  /** One connect + HELLO attempt; true when a ready connection was installed. */
  attempt(): Promise<boolean>;
  /** After an attempt that installed nothing while the client is still live: schedule the backoff. */
  attemptFailed(): void;
  /** A bug escaped an attempt (not a connection failure). */
  crashed(e: unknown): void;
}

/**
 * The background loop that owns connect + HELLO (CONTRACT 9.1): it sleeps while a connection is
 * installed, waits until the next attempt is due, and attempts; the client wakes it whenever its
 * state changes (a drop, a new session, close).
 */
export class ConnectLoop {
  readonly #clock: Clock;
  #wakeFn: (() => void) | null = null;

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  /** Ends the current sleep at once (the loop re-reads the client's state). */
  wake(): void {
    const f = this.#wakeFn;
    this.#wakeFn = null;
    f?.();
  }

  #sleep(ms: number | null): Promise<void> {
    return new Promise((resolve) => {
      const timer = ms === null ? null : this.#clock.setTimeout(() => this.wake(), clampDelay(ms));
      this.#wakeFn = () => {
        if (timer !== null) this.#clock.clearTimeout(timer);
        resolve();
      };
    });
  }

  /** Runs until the host is no longer live; never rejects. */
  async run(host: ConnectLoopHost): Promise<void> {
    try {
      while (host.live()) {
        if (host.connected()) {
          await this.#sleep(null);
          continue;
        }
        const delay = host.nextAttempt() - this.#clock.now();
        if (delay > 0) {
          await this.#sleep(delay);
          continue;
        }
        const ok = await host.attempt();
        if (!ok && host.live() && !host.connected()) host.attemptFailed();
      }
    } catch (e) {
      // a bug, not a connection failure: never leave it unhandled
      host.crashed(e);
    }
  }
}

/** The outcome of one HELLO exchange (CONTRACT 6.1, 6.2). */
export type HelloResult =
  | { readonly kind: "ok"; readonly reply: HelloReply }
  /** A fatal status or a mismatching OK reply: the client disables (9.3). */
  | { readonly kind: "fatal"; readonly reason: string }
  /** STALE_SEQ: the worker holds a newer seq for this session; only a new session can succeed (6.2). */
  | { readonly kind: "stale_seq" };

/** The arguments of {@link helloExchange}. */
export interface HelloArgs {
  readonly hello: Hello;
  readonly session: number;
  readonly seq: number;
  readonly token: string | Uint8Array | null;
  readonly timeoutMs: number;
  readonly replyBuf: Uint8Array;
}

/**
 * One HELLO on a connected transport client (CONTRACT 6.1). Resolves `ok`, `fatal` or `stale_seq`;
 * rejects for anything a retry with backoff may fix (transport errors, a bad echo, BUSY,
 * INTERNAL, NO_SESSION).
 */
export async function helloExchange(cli: RpcClient, a: HelloArgs): Promise<HelloResult> {
  const hello = a.hello;
  hello.auth = a.token === null ? new Uint8Array(32) : helloAuth(a.token, a.session, a.seq);
  const msg = frame({ op: Op.HELLO, seq: a.seq, session: a.session }, encodeHello(hello));
  const n = await cli.request(msg, a.replyBuf, a.timeoutMs);
  const { header: h, body } = splitFrame(a.replyBuf, n);
  const echo = echoProblem(h, Op.HELLO, a.seq, a.session);
  if (echo !== null) throw new WireError("WIRE_BAD_REPLY", `HELLO ${echo}`);
  if (h.status === FrameStatus.STALE_SEQ) return { kind: "stale_seq" };
  if (h.status !== FrameStatus.OK) {
    const name = statusName(h.status);
    if (FATAL_FRAME_STATUS.has(h.status)) {
      let detail = "";
      if (body.length === HELLO_REPLY_BODY_SIZE) {
        // IDENTITY_MISMATCH / CONFIG_MISMATCH carry the worker's HelloReply (CONTRACT 6.1)
        const rep = decodeHelloReply(body);
        detail = `: ${checkHelloReply(hello, rep) ?? "worker refused an identical configuration"}`;
      }
      return { kind: "fatal", reason: `HELLO refused: ${name}${detail}` };
    }
    throw new ClientError("CLIENT_REFUSED", `HELLO refused: ${name}`, { status: h.status });
  }
  const reply = decodeHelloReply(body);
  const mismatch = checkHelloReply(hello, reply);
  if (mismatch !== null) return { kind: "fatal", reason: `HELLO reply mismatch: ${mismatch}` };
  return { kind: "ok", reply };
}
