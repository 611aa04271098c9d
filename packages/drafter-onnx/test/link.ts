/** A raw drafter-link client of one connection (CONTRACT 6, 7) for the end-to-end tests. */
import type { RpcClient } from "@tapwire/transport";
import { makeClient } from "@tapwire/transport";
import {
  APP_HEADER_SIZE,
  checkReplyValues,
  decodeHelloReply,
  decodeStepReply,
  encodeHello,
  FrameStatus,
  frame,
  HelloFlag,
  Op,
  type ReqEntry,
  RowDtype,
  rowsOffsetFor,
  type SampleMeta,
  SampleMode,
  type StepReplyViews,
  splitFrame,
  stepRequestBodySize,
  validateSampled,
  writeStepPrefix,
} from "@tapwire/wire";
import type { Drafter } from "@tapwire/worker";

/** One entry of {@link Link.step}: its rows are sent with RESYNC (the whole window). */
export interface LinkEntry {
  slot: number;
  anchorPos: number;
  anchorToken: number;
  rows: Uint8Array;
  nOut?: number;
}

export class Link {
  private readonly client: RpcClient;
  private readonly buf = new Uint8Array(1 << 22);
  private seq = 0;
  private sampled = false;
  private geo: Pick<Drafter, "window" | "numSpec" | "vocabSize" | "numTaps" | "hidden">;
  readonly session = 1 + Math.floor(Math.random() * 0xfffffff0);

  constructor(
    endpoint: string,
    geo: Pick<Drafter, "window" | "numSpec" | "vocabSize" | "numTaps" | "hidden">,
  ) {
    this.client = makeClient(endpoint, {});
    this.geo = geo;
  }

  async connect(): Promise<this> {
    await this.client.connect(5000);
    return this;
  }

  private async send(msg: Uint8Array) {
    const n = await this.client.request(msg, this.buf, 30_000);
    const { header, body } = splitFrame(this.buf, n);
    return { status: header.status, body: body.slice() };
  }

  /** HELLO with the given identities; resolves the status and the HelloReply. */
  async hello(ids: { drafterIdentity: Uint8Array; markovIdentity: Uint8Array }, sampled: boolean) {
    this.sampled = sampled;
    const g = this.geo;
    const body = encodeHello({
      drafterIdentity: ids.drafterIdentity,
      markovIdentity: ids.markovIdentity,
      window: g.window,
      numSpec: g.numSpec,
      sampleMode: sampled ? SampleMode.TOP32 : SampleMode.GREEDY,
      rowDtype: RowDtype.BF16,
      numTaps: g.numTaps,
      hidden: g.hidden,
      rowBytes: g.numTaps * g.hidden * 2,
      vocabSize: g.vocabSize,
      maxSlots: 64,
      maxRowsPerStep: 1024,
      helloFlags: HelloFlag.WANT_MARGIN,
      auth: new Uint8Array(32),
      clientName: "drafter-onnx-test",
    });
    const a = await this.send(frame({ op: Op.HELLO, seq: ++this.seq, session: this.session }, body));
    return { status: a.status, reply: a.body.length === 128 ? decodeHelloReply(a.body) : null };
  }

  /** One STEP: every entry NEED_DRAFT | RESYNC with its rows; the reply is checked like a client would (6.3, 8). */
  async step(
    list: LinkEntry[],
    meta: SampleMeta[] | null = null,
  ): Promise<{ status: number; views: StepReplyViews | null }> {
    const rb = this.geo.numTaps * this.geo.hidden * 2;
    const entries: ReqEntry[] = list.map((e) => ({
      slot: e.slot,
      generation: 1,
      anchorPos: e.anchorPos,
      anchorToken: e.anchorToken,
      rowStart: e.anchorPos - e.rows.length / rb,
      nRows: e.rows.length / rb,
      nOut: e.nOut ?? 0,
      flags: 1 | 2,
    }));
    const sampled = this.sampled;
    const sampleMeta = sampled ? (meta ?? list.map(() => ({ seed: 1, topK: 8, tempMilli: 0 }))) : null;
    let nRows = 0;
    for (const e of entries) nRows += e.nRows;
    const buf = new Uint8Array(APP_HEADER_SIZE + stepRequestBodySize(entries.length, nRows, rb, sampled));
    let off = APP_HEADER_SIZE + rowsOffsetFor(entries.length, sampled);
    for (const e of list) {
      buf.set(e.rows, off);
      off += e.rows.length;
    }
    const stepId = ++this.seq;
    const len = writeStepPrefix(buf, {
      seq: stepId,
      session: this.session,
      stepId,
      entries,
      sampleMeta,
      nRows,
      rowBytes: rb,
    });
    const a = await this.send(buf.subarray(0, len));
    if (a.status !== FrameStatus.OK) return { status: a.status, views: null };
    const views = decodeStepReply(a.body, {
      nReq: entries.length,
      numSpec: this.geo.numSpec,
      margin: true,
      sampled,
    });
    const ctx = {
      stepId,
      vocabSize: this.geo.vocabSize,
      window: this.geo.window,
      numSpec: this.geo.numSpec,
      entries,
      sampleMeta,
    };
    checkReplyValues(views, ctx);
    if (sampled) validateSampled(views, ctx);
    return { status: a.status, views };
  }

  close(): void {
    this.client.close();
  }
}
