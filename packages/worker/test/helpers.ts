import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ClientOptions, RpcClient } from "@tapwire/transport";
import { makeClient } from "@tapwire/transport";
import type { Hello, ReqEntry, SampleMeta, StepReplyViews } from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  checkReplyValues,
  decodeHelloReply,
  decodeStepReply,
  encodeHello,
  FrameStatus,
  frame,
  HelloFlag,
  helloAuth,
  Op,
  RowDtype,
  rowsOffsetFor,
  SampleMode,
  splitFrame,
  stepRequestBodySize,
  validateSampled,
  writeStepPrefix,
} from "@tapwire/wire";
import type { Drafter } from "../src/index.js";
import { NullDrafter } from "../src/index.js";

/** Small geometry for protocol tests: rows of 2 x 4 bf16 = 16 bytes. */
export const GEOM = { window: 8, numSpec: 4, vocabSize: 256, numTaps: 2, hidden: 4 } as const;
export const ROW_BYTES = GEOM.numTaps * GEOM.hidden * 2;
export const IDENT_D = new Uint8Array(32).fill(0xd1);
export const IDENT_M = new Uint8Array(32).fill(0x3a);

export function nullDrafter(over: Partial<ConstructorParameters<typeof NullDrafter>[0]> = {}): NullDrafter {
  return new NullDrafter({ ...GEOM, drafterIdentity: IDENT_D, markovIdentity: IDENT_M, ...over });
}

export function uniqueSock(tag: string): string {
  return join(tmpdir(), `tw-worker-${tag}-${process.pid}-${randomBytes(4).toString("hex")}.sock`);
}

/** A HELLO body matching `d` unless overridden. */
export function helloFor(d: Drafter, over: Partial<Hello> = {}): Hello {
  return {
    drafterIdentity: d.drafterIdentity,
    markovIdentity: d.markovIdentity,
    window: d.window,
    numSpec: d.numSpec,
    sampleMode: SampleMode.GREEDY,
    rowDtype: RowDtype.BF16,
    numTaps: d.numTaps,
    hidden: d.hidden,
    rowBytes: d.numTaps * d.hidden * 2,
    vocabSize: d.vocabSize,
    maxSlots: 16,
    maxRowsPerStep: 64,
    helloFlags: HelloFlag.WANT_MARGIN,
    auth: new Uint8Array(32),
    clientName: "test",
    ...over,
  };
}

/** A row whose bytes encode `pos` and `salt`, so windows can be compared row by row. */
export function writeRow(buf: Uint8Array, off: number, pos: number, rowBytes: number, salt = 0): void {
  for (let i = 0; i < rowBytes; i++) buf[off + i] = (pos * 31 + i * 7 + salt) & 0xff;
  buf[off] = pos & 0xff;
  buf[off + 1] = (pos >>> 8) & 0xff;
}

export function rowsBytes(start: number, n: number, rowBytes: number, salt = 0): Uint8Array {
  const out = new Uint8Array(n * rowBytes);
  for (let i = 0; i < n; i++) writeRow(out, i * rowBytes, start + i, rowBytes, salt);
  return out;
}

/** Builds a STEP frame; rows of each entry are generated from positions (rowStart..). */
export function stepFrame(p: {
  seq: number;
  session: number;
  stepId?: number;
  entries: ReqEntry[];
  sampleMeta?: SampleMeta[] | null;
  rowBytes?: number;
  salt?: number;
}): Uint8Array {
  const rb = p.rowBytes ?? ROW_BYTES;
  const sampled = p.sampleMeta !== undefined && p.sampleMeta !== null;
  let nRows = 0;
  for (const e of p.entries) nRows += e.nRows;
  const n = p.entries.length;
  const buf = new Uint8Array(APP_HEADER_SIZE + stepRequestBodySize(n, nRows, rb, sampled));
  let off = APP_HEADER_SIZE + rowsOffsetFor(n, sampled);
  for (const e of p.entries) {
    for (let r = 0; r < e.nRows; r++) {
      writeRow(buf, off, e.rowStart + r, rb, p.salt ?? 0);
      off += rb;
    }
  }
  const len = writeStepPrefix(buf, {
    seq: p.seq,
    session: p.session,
    stepId: p.stepId ?? 1,
    entries: p.entries,
    sampleMeta: p.sampleMeta ?? null,
    nRows,
    rowBytes: rb,
  });
  return buf.subarray(0, len);
}

export function entry(over: Partial<ReqEntry> & { slot: number }): ReqEntry {
  return {
    generation: 1,
    anchorPos: 0,
    anchorToken: 7,
    rowStart: 0,
    nRows: 0,
    nOut: 0,
    flags: 1,
    ...over,
  };
}

/** Offset of entry `i`'s field `off` in a STEP frame (for building malformed frames). */
export function entryFieldOffset(i: number, off: number, sampled = false, nReq = 0): number {
  return APP_HEADER_SIZE + 16 + (sampled ? 8 * nReq : 0) + 32 * i + off;
}

export interface Answer {
  op: number;
  status: number;
  seq: number;
  session: number;
  body: Uint8Array;
}

/** A raw-frame client of one connection. */
export class Raw {
  readonly client: RpcClient;
  private readonly buf = new Uint8Array(1 << 22);
  constructor(endpoint: string, options: ClientOptions = {}) {
    this.client = makeClient(endpoint, options);
  }
  async connect(): Promise<this> {
    await this.client.connect(5000);
    return this;
  }
  async send(msg: Uint8Array): Promise<Answer> {
    const n = await this.client.request(msg, this.buf, 10_000);
    const { header, body } = splitFrame(this.buf, n);
    return { ...header, body: body.slice() };
  }
  close(): void {
    this.client.close();
  }
}

/** A session on a {@link Raw} connection that checks every STEP reply like a client would. */
export class Sess {
  seq = 0;
  lastReply: StepReplyViews | null = null;
  constructor(
    readonly raw: Raw,
    readonly session: number,
    readonly drafter: Drafter,
    public hello: Hello = helloFor(drafter),
    readonly token: string | null = null,
  ) {}

  async doHello(
    over: Partial<Hello> = {},
  ): Promise<Answer & { reply: ReturnType<typeof decodeHelloReply> | null }> {
    this.seq++;
    const h = { ...this.hello, ...over };
    if (this.token !== null && over.auth === undefined)
      h.auth = helloAuth(this.token, this.session, this.seq);
    const a = await this.raw.send(
      frame({ op: Op.HELLO, seq: this.seq, session: this.session }, encodeHello(h)),
    );
    if (a.status === FrameStatus.OK) this.hello = h;
    return { ...a, reply: a.body.length === 128 ? decodeHelloReply(a.body) : null };
  }

  async step(
    entries: ReqEntry[],
    opts: { sampleMeta?: SampleMeta[] | null; stepId?: number; seq?: number } = {},
  ): Promise<Answer & { views: StepReplyViews | null }> {
    const seq = opts.seq ?? ++this.seq;
    const stepId = opts.stepId ?? seq;
    const sampled = this.hello.sampleMode === SampleMode.TOP32;
    const sampleMeta =
      opts.sampleMeta ?? (sampled ? entries.map(() => ({ seed: 1, topK: 4, tempMilli: 0 })) : null);
    const a = await this.raw.send(
      stepFrame({ seq, session: this.session, stepId, entries, sampleMeta, rowBytes: this.hello.rowBytes }),
    );
    if (a.status !== FrameStatus.OK) return { ...a, views: null };
    const views = decodeStepReply(a.body, {
      nReq: entries.length,
      numSpec: this.hello.numSpec,
      margin: (this.hello.helloFlags & HelloFlag.WANT_MARGIN) !== 0,
      sampled,
    });
    const ctx = {
      stepId,
      vocabSize: this.hello.vocabSize,
      window: this.hello.window,
      numSpec: this.hello.numSpec,
      entries,
      sampleMeta,
    };
    // CONTRACT 6.3, 7.4, 8: every reply a test sees passes the client's checks.
    checkReplyValues(views, ctx);
    if (sampled) validateSampled(views, ctx);
    this.lastReply = views;
    return { ...a, views };
  }

  async simple(op: number, body?: Uint8Array): Promise<Answer> {
    this.seq++;
    return this.raw.send(frame({ op, seq: this.seq, session: this.session }, body));
  }
}

/**
 * A same-session re-HELLO of `s` on another connection `raw` (CONTRACT 6.2, 1.1: STEP and RESET
 * only on a connection bound by an OK HELLO); the session's other connections stay bound.
 */
export async function helloOn(raw: Raw, s: Sess): Promise<void> {
  const a = await raw.send(frame({ op: Op.HELLO, seq: ++s.seq, session: s.session }, encodeHello(s.hello)));
  if (a.status !== FrameStatus.OK) throw new Error(`re-HELLO on another connection: status ${a.status}`);
}
