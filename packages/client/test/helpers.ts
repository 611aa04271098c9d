// Shared test helpers: test geometry, a capturing pino logger, and a scripted worker (a handler
// usable behind a real transport `listen` server or as an in-memory RpcClient) for replies the
// real worker never sends.
import { Writable } from "node:stream";
import { Registry } from "@tapwire/stats";
import type { RpcClient } from "@tapwire/transport";
import { TransportError } from "@tapwire/transport";
import {
  APP_HEADER_SIZE,
  beginStepReply,
  Capability,
  DYADIC_ONE,
  decodeHello,
  decodeStepRequest,
  EntryFlag,
  encodeHelloReply,
  FrameStatus,
  frame,
  type Hello,
  type HelloReply,
  Op,
  SampleMode,
  type StepReplyViews,
  type StepRequest,
  splitFrame,
  stepReplyBodySize,
} from "@tapwire/wire";
import { type Logger, pino } from "pino";
import { type RemoteDraftClient, type RemoteDraftClientOptions, STEP_OUTCOMES } from "../src/index.js";

export const GEO = {
  window: 8,
  numSpec: 4,
  numTaps: 1,
  hidden: 8,
  vocabSize: 1000,
  maxSlots: 8,
  maxRowsPerStep: 64,
} as const;
export const ROW_BYTES = GEO.numTaps * GEO.hidden * 2;

export function identity(seed: number): Uint8Array {
  const b = new Uint8Array(32);
  for (let i = 0; i < 32; i++) b[i] = (seed * 37 + i * 11) & 0xff;
  return b;
}
export const DRAFTER_ID = identity(1);
export const MARKOV_ID = identity(2);
/** The test geometry and identities as a worker drafter takes them (`new NullDrafter(DRAFTER_GEOMETRY)`). */
export const DRAFTER_GEOMETRY = {
  drafterIdentity: DRAFTER_ID,
  markovIdentity: MARKOV_ID,
  window: GEO.window,
  numSpec: GEO.numSpec,
  vocabSize: GEO.vocabSize,
  numTaps: GEO.numTaps,
  hidden: GEO.hidden,
} as const;

export function hex(b: Uint8Array): string {
  return Buffer.from(b).toString("hex");
}

/** Client options for the test geometry. */
export function clientOptions(
  endpoint: string,
  extra: Partial<RemoteDraftClientOptions> = {},
): RemoteDraftClientOptions {
  return {
    endpoint,
    ...GEO,
    drafterIdentity: DRAFTER_ID,
    markovIdentity: MARKOV_ID,
    connectTimeoutMs: 2000,
    requestTimeoutMs: 2000,
    backoffMs: 20,
    backoffMaxMs: 200,
    logger: silentLogger(),
    ...extra,
  };
}

export function silentLogger(): Logger {
  return pino({ level: "silent" });
}

/** A pino logger that keeps its lines (parsed) in `lines`. */
export function captureLogger(): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split("\n")) if (l.trim() !== "") lines.push(JSON.parse(l));
      cb();
    },
  });
  return { logger: pino({ level: "info" }, stream), lines };
}

/** Rows for positions [start, start+n) of a slot, deterministic. */
export function makeRows(slot: number, start: number, n: number, rowBytes = ROW_BYTES): Uint8Array {
  const b = new Uint8Array(n * rowBytes);
  for (let i = 0; i < n; i++) {
    for (let j = 0; j < rowBytes; j++) b[i * rowBytes + j] = (slot * 53 + (start + i) * 7 + j * 3) & 0xff;
  }
  return b;
}

export interface StepHook {
  header: { seq: number; session: number };
  req: StepRequest;
  views: StepReplyViews & { frameLength: number };
  buf: Uint8Array;
}

/**
 * A worker in a function: answers HELLO (mirroring the client's configuration and its own
 * identities), STEP (a valid reply: status OK, full windows, drafts on consumed positions, q in
 * sampled sessions), PING, STATS and RESET. Hooks let a test break any reply.
 */
export class ScriptedWorker {
  drafterIdentity = DRAFTER_ID;
  markovIdentity = MARKOV_ID;
  capabilities = Capability.TAPS_BF16 | Capability.TOP32 | Capability.MARGIN;
  helloOverride:
    | ((hello: Hello, reply: HelloReply) => { status: number; body?: Uint8Array | undefined } | null)
    | null = null;
  /** Called with the valid reply in place; may edit it, or return a whole different message (or null to close). */
  onStep: ((h: StepHook) => Uint8Array | null | undefined) | null = null;
  /** Called first with every request's header; a message (or null to close) answers instead. */
  onFrame: ((h: { op: number; seq: number; session: number }) => Uint8Array | null | undefined) | null = null;
  /** Frame status answered to the next STEPs instead of OK (one-shot per entry). */
  stepStatus: number[] = [];
  hellos: Hello[] = [];
  steps: StepRequest[] = [];
  ops: number[] = [];
  session = 0;
  #hello: Hello | null = null;
  #buf = new Uint8Array(1 << 20);

  handle = (msg: Uint8Array): Uint8Array | null => {
    const { header, body } = splitFrame(msg);
    this.ops.push(header.op);
    const echo = { op: header.op, seq: header.seq, session: header.session };
    if (this.onFrame !== null) {
      const out = this.onFrame(echo);
      if (out !== undefined) return out;
    }
    switch (header.op) {
      case Op.HELLO: {
        const hello = decodeHello(body);
        this.hellos.push(hello);
        const reply: HelloReply = {
          drafterIdentity: this.drafterIdentity,
          markovIdentity: this.markovIdentity,
          window: hello.window,
          numSpec: hello.numSpec,
          capabilities: this.capabilities,
          maxSlots: hello.maxSlots,
          maxRowsPerStep: hello.maxRowsPerStep,
          vocabSize: hello.vocabSize,
          rowBytes: hello.rowBytes,
          windowsKept: 0,
          workerName: "scripted",
        };
        const o = this.helloOverride?.(hello, reply) ?? null;
        if (o !== null) return frame({ ...echo, status: o.status }, o.body ?? new Uint8Array(0));
        this.#hello = hello;
        this.session = header.session;
        return frame({ ...echo, status: 0 }, encodeHelloReply(reply));
      }
      case Op.STEP: {
        const st = this.stepStatus.shift();
        if (st !== undefined) return frame({ ...echo, status: st });
        const h = this.#hello!;
        const sampled = h.sampleMode === SampleMode.TOP32;
        const req = decodeStepRequest(body, {
          sampled,
          rowBytes: h.rowBytes,
          maxSlots: h.maxSlots,
          maxRowsPerStep: h.maxRowsPerStep,
          numSpec: h.numSpec,
        });
        this.steps.push({
          ...req,
          rows: Uint8Array.from(req.rows),
          entries: req.entries.map((e) => ({ ...e })),
        });
        const margin = (h.helloFlags & 1) !== 0;
        const N = h.numSpec;
        const need = APP_HEADER_SIZE + stepReplyBodySize({ nReq: req.nReq, numSpec: N, margin, sampled });
        if (need > this.#buf.length) this.#buf = new Uint8Array(need);
        const v = beginStepReply(this.#buf, {
          seq: header.seq,
          session: header.session,
          stepId: req.stepId,
          nReq: req.nReq,
          numSpec: N,
          margin,
          sampled,
        });
        for (let i = 0; i < req.nReq; i++) {
          const e = req.entries[i]!;
          v.status[i] = 0;
          v.generation[i] = e.generation;
          if (e.flags & EntryFlag.RELEASE) continue;
          v.windowRows[i] = Math.min(h.window, e.anchorPos);
          if (!(e.flags & EntryFlag.NEED_DRAFT)) continue;
          const k = e.nOut === 0 ? N : Math.min(e.nOut, N);
          const meta = req.sampleMeta?.[i];
          for (let j = 0; j < k; j++) {
            const p = i * N + j;
            v.draftIds[p] = (e.anchorToken + j + 1) % h.vocabSize;
            v.confidence[p] = 0.9 - j * 0.1;
            if (v.margin) v.margin[p] = 2 - j * 0.25;
            if (meta !== undefined && meta.tempMilli > 0) {
              v.sampledMask![p] = 1;
              let rest = DYADIC_ONE;
              for (let t = 0; t < meta.topK; t++) {
                v.supportIds![p * 32 + t] = (v.draftIds[p]! + t) % h.vocabSize;
                const q = t === meta.topK - 1 ? rest : Math.floor(rest / 2);
                v.proposalQ![p * 32 + t] = q;
                rest -= q;
              }
            }
          }
        }
        const hook = this.onStep;
        if (hook !== null) {
          const out = hook({ header, req, views: v, buf: this.#buf });
          if (out !== undefined) return out;
        }
        return this.#buf.subarray(0, v.frameLength);
      }
      case Op.PING:
        return frame({ ...echo, status: 0 }, Uint8Array.from(body));
      case Op.STATS:
        return frame(
          { ...echo, status: 0 },
          new TextEncoder().encode(JSON.stringify({ steps: this.steps.length })),
        );
      case Op.RESET:
        return frame({ ...echo, status: header.session === this.session ? 0 : FrameStatus.NO_SESSION });
      default:
        return frame({ ...echo, status: FrameStatus.UNKNOWN_OP });
    }
  };
}

/** An in-memory RpcClient over a handler (for unit tests with a fake clock: no sockets, no timers). */
export class MemoryRpcClient implements RpcClient {
  readonly registry = new Registry();
  connected = false;
  connects = 0;
  failConnect: TransportError | null = null;
  readonly endpoint: string;
  readonly #handler: (msg: Uint8Array) => Uint8Array | null;
  readonly #onConnect: (() => void) | undefined;
  constructor(endpoint: string, handler: (msg: Uint8Array) => Uint8Array | null, onConnect?: () => void) {
    this.endpoint = endpoint;
    this.#handler = handler;
    this.#onConnect = onConnect;
  }
  async connect(): Promise<void> {
    this.connects++;
    this.#onConnect?.();
    if (this.failConnect !== null) throw this.failConnect;
    this.connected = true;
  }
  async request(msg: Uint8Array, replyBuf: Uint8Array): Promise<number> {
    if (!this.connected) throw new TransportError("TRANSPORT_CLOSED", "not connected");
    const out = this.#handler(Uint8Array.from(msg));
    if (out === null) {
      this.connected = false;
      throw new TransportError("TRANSPORT_CLOSED", "closed by peer");
    }
    if (out.length > replyBuf.length)
      throw new TransportError("TRANSPORT_REPLY_TOO_LARGE", "reply too large");
    replyBuf.set(out);
    return out.length;
  }
  async requestParts(parts: readonly Uint8Array[], replyBuf: Uint8Array): Promise<number> {
    return this.request(Buffer.concat(parts), replyBuf);
  }
  close(): void {
    this.connected = false;
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Polls `pred` (real time) until true or `timeoutMs` passes. */
export async function until(pred: () => boolean, timeoutMs = 10_000, what = "condition"): Promise<void> {
  const t0 = Date.now();
  while (!pred()) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

/**
 * Wraps `client.step` so that every outcome it returns is checked against the CONTRACT 9.2 table:
 * `unknownApply` exactly when the table says "applied: unknown", `ok` exactly for the ok row.
 */
export function checkOutcomesAgainstTable(client: RemoteDraftClient): RemoteDraftClient {
  const step = client.step.bind(client);
  client.step = async (call) => {
    const out = await step(call);
    const row = STEP_OUTCOMES[out.reason];
    if (row === undefined) throw new Error(`outcome ${out.reason} is not a row of CONTRACT 9.2`);
    if (out.unknownApply !== (row.applied === "unknown") || out.ok !== (out.reason === "ok")) {
      throw new Error(
        `outcome ${out.reason}: unknownApply=${out.unknownApply} ok=${out.ok} breaks CONTRACT 9.2`,
      );
    }
    return out;
  };
  return client;
}
