// Over 500 lines on purpose: one class holding the worker mode's whole state (connections,
// sessions, seq, the window oracle), which every request helper reads and moves; apart, each
// helper would take that state as arguments.
/**
 * The worker mode's context: raw connections, the tester's sessions and sequence numbers, the
 * window oracle per session, geometry discovery from a HelloReply, and request helpers that
 * validate every reply (CONTRACT 4, 6.1, 6.3, 7.4, 8) before a case sees it.
 */
import { randomInt } from "node:crypto";
import { FRAME_STATUS_NAMES, Op, REQ_STATUS_NAMES } from "@tapwire/wire";
import type { Endpoint, RawConn, Received, TlsClientOptions } from "../conn.js";
import { connect, parseEndpoint } from "../conn.js";
import { ConformanceError } from "../errors.js";
import type { EntryFields, HelloFields, HelloReplyFields, ParsedHeader, StepReplyFields } from "../frames.js";
import { frame, helloBody, helloHmac, hex, parseHeader, stepBody, u32 } from "../frames.js";
import type { Expected } from "../oracle.js";
import { WindowOracle } from "../oracle.js";
import type { CaseCheck } from "../runner.js";
import { Rng } from "../runner.js";
import { headerProblems, helloReplyProblems, stepReplyProblems } from "../validate.js";

/** Options of the worker mode (flag names as `tapwire-worker`'s). */
export interface WorkerSuiteOptions {
  /** Endpoint of the worker under test. */
  endpoint: string;
  /** Shared HELLO token of the worker (CONTRACT 6.1, 11). */
  token?: string;
  /** Geometry; anything not given is discovered from a HelloReply. */
  window?: number;
  /** num_spec N. */
  numSpec?: number;
  /** vocab_size. */
  vocab?: number;
  /** Tap vectors per row. */
  numTaps?: number;
  /** bf16 values per tap vector. */
  hidden?: number;
  /** The drafter identity, 64 hex digits. */
  drafterIdentity?: string;
  /** The Markov head identity, 64 hex digits. */
  markovIdentity?: string;
  /** Sample mode of the sessions of the general cases (default greedy; TOP32 cases always use TOP32). */
  sampleMode?: "greedy" | "top32";
  /** The worker's takeover policy (default: `refuse` with a token, else `allow`, as CONTRACT 11). */
  takeover?: "allow" | "refuse";
  /** The worker's session lease in ms (default 10000, CONTRACT 6.2); the tester waits it out under `refuse`. */
  sessionLeaseMs?: number;
  /** The worker's `unbound_idle_ms` (CONTRACT 11), when known: 11.20 checks it. */
  unboundIdleMs?: number;
  /** The worker's `max_connections` (CONTRACT 11), when known: 11.21 checks it. */
  maxConnections?: number;
  /** Reply timeout in ms (default 2000). */
  timeoutMs?: number;
  /** TLS client options for tls:// endpoints. */
  tls?: TlsClientOptions;
  /** Seed of rows, session ids and fuzz input (default 1). */
  seed?: number;
  /** shm+unix: bytes of each area of a connection's mapping (default 1 MiB; issue 23). */
  shmBytes?: number;
  /** shm+unix: the worker's `shmDir` (default `/dev/shm`). */
  shmDir?: string;
}

/** A reply as received and validated. */
export interface Reply {
  h: ParsedHeader;
  body: Uint8Array;
  bytes: Uint8Array;
  prefix: Uint8Array | null;
}

/** One of the tester's sessions: its id and the highest seq the worker holds for it. */
export class Sess {
  readonly oracle: WindowOracle;
  constructor(
    readonly id: number,
    public hi: number,
    window: number,
  ) {
    this.oracle = new WindowOracle(window);
  }
  /** The next newer seq. */
  get next(): number {
    return (this.hi + 1) >>> 0;
  }
}

/** Geometry and limits of the worker, from flags and its HelloReply. */
export interface Geometry {
  window: number;
  numSpec: number;
  vocab: number;
  numTaps: number;
  hidden: number;
  rowBytes: number;
  drafterIdentity: Uint8Array;
  markovIdentity: Uint8Array;
  capabilities: number;
  maxSlots: number;
  maxRowsPerStep: number;
}

/** A connection bound by an OK HELLO (CONTRACT 6.2), with the session shape it asked. */
export interface Bound {
  peer: Peer;
  sess: Sess;
  sampled: boolean;
  margin: boolean;
  maxSlots: number;
  maxRowsPerStep: number;
  hello: HelloFields;
  helloReply: HelloReplyFields;
}

/** Shape asked by a HELLO of {@link WorkerCtx.bound}. */
export interface ShapeOptions {
  sess?: Sess;
  sampled?: boolean;
  margin?: boolean;
  maxSlots?: number;
  maxRowsPerStep?: number;
  /** RESET after the HELLO so the case starts from empty windows (default true). */
  reset?: boolean;
}

/** Human description of a receive result. */
export function describe(r: Received): string {
  switch (r.kind) {
    case "msg": {
      const h = parseHeader(r.bytes);
      if (h === null) return `a ${r.bytes.length}-byte message (no header): ${hex(r.bytes.subarray(0, 24))}`;
      return `${FRAME_STATUS_NAMES[h.status] ?? `status ${h.status}`} (op ${h.op}, seq ${h.seq}, session ${h.session}, body ${h.bodyLen} bytes)`;
    }
    case "closed":
      return r.pending > 0
        ? `connection closed with ${r.pending} unread bytes (an incomplete message)`
        : "connection closed without a reply";
    case "timeout":
      return r.pending > 0
        ? `no whole reply: ${r.pending} bytes of an incomplete message`
        : "no reply (timeout)";
    case "bad-prefix": {
      const be = ((r.prefix[0]! << 24) | (r.prefix[1]! << 16) | (r.prefix[2]! << 8) | r.prefix[3]!) >>> 0;
      return `length prefix ${hex(r.prefix)} = ${r.length} little-endian (${be} read big-endian: the peer writes a big-endian prefix?)`;
    }
  }
}

/** Status name for messages. */
export function st(s: number): string {
  return FRAME_STATUS_NAMES[s] ?? `status ${s}`;
}

/** A raw connection with validated request/reply helpers. */
export class Peer {
  constructor(
    readonly raw: RawConn,
    private readonly ctx: WorkerCtx,
  ) {}

  /** Sends `msg` and returns what arrived (not validated). */
  async exchange(msg: Uint8Array, framed = true): Promise<Received> {
    if (framed) this.raw.send(msg);
    else this.raw.sendRaw(msg);
    return this.raw.recv(this.ctx.timeoutMs);
  }

  /**
   * Sends `msg` and requires one reply that echoes `echo` (default: the request's own op, seq
   * and session) and passes the header checks; the body is returned for the caller's checks.
   */
  async call(
    t: CaseCheck,
    msg: Uint8Array,
    what: string,
    echo?: { op: number; seq: number; session: number } | null,
    framed = true,
  ): Promise<Reply> {
    const r = await this.exchange(msg, framed);
    return this.take(t, r, what, echo === undefined ? echoOf(msg) : echo);
  }

  /** Waits for the next reply (after a raw or split send). */
  async next(
    t: CaseCheck,
    what: string,
    echo: { op: number; seq: number; session: number } | null,
  ): Promise<Reply> {
    return this.take(t, await this.raw.recv(this.ctx.timeoutMs), what, echo);
  }

  private take(
    t: CaseCheck,
    r: Received,
    what: string,
    echo: { op: number; seq: number; session: number } | null,
  ): Reply {
    t.must(r.kind === "msg", `a reply to ${what}`, () => describe(r));
    const { h, problems } = headerProblems(r.bytes, echo);
    this.ctx.noteStatus(h?.status);
    t.must(problems.length === 0 && h !== null, `a valid reply header to ${what}`, () => problems.join("; "));
    return { h, body: r.bytes.subarray(24), bytes: r.bytes, prefix: r.prefix };
  }
}

/** The op, seq and session a reply to `msg` echoes (CONTRACT 4). */
export function echoOf(msg: Uint8Array): { op: number; seq: number; session: number } {
  return {
    op: msg[6] ?? 0,
    seq: msg.length >= 12 ? u32(msg, 8) : 0,
    session: msg.length >= 16 ? u32(msg, 12) : 0,
  };
}

/** bf16 bits of a float (truncation). */
function bf16(x: number): number {
  const f = new Float32Array([x]);
  return new Uint32Array(f.buffer)[0]! >>> 16;
}

/** Context of the worker mode. */
export class WorkerCtx {
  readonly ep: Endpoint;
  readonly timeoutMs: number;
  readonly rng: Rng;
  readonly token: string | null;
  readonly takeover: "allow" | "refuse";
  readonly leaseMs: number;
  readonly sampleMode: "greedy" | "top32";
  g!: Geometry;
  /** The tester's main session. */
  main!: Sess;
  /** Session id the worker holds as current (as far as the tester knows). */
  current = 0;
  /** When the tester last had a frame of the current session answered OK. */
  lastOkAt = Number.NEGATIVE_INFINITY;
  /** Every frame status seen in replies (CONTRACT 5). */
  readonly statuses = new Map<number, number>();
  private open: RawConn[] = [];
  private zmqBinds = 0;
  private rowPool: Uint8Array | null = null;
  /** The options the run was started with. */
  readonly opts: WorkerSuiteOptions;

  constructor(opts: WorkerSuiteOptions) {
    this.opts = opts;
    this.ep = parseEndpoint(opts.endpoint);
    this.timeoutMs = opts.timeoutMs ?? 2000;
    this.rng = new Rng(opts.seed ?? 1);
    this.token = opts.token !== undefined && opts.token !== "" ? opts.token : null;
    this.takeover = opts.takeover ?? (this.token !== null ? "refuse" : "allow");
    this.leaseMs = opts.sessionLeaseMs ?? 10_000;
    this.sampleMode = opts.sampleMode ?? "greedy";
  }

  get stream(): boolean {
    return this.ep.scheme === "tcp" || this.ep.scheme === "unix" || this.ep.scheme === "tls";
  }

  /** True on `shm+unix://`: a unix socket whose every message is a doorbell (docs/transport.md "shm"). */
  get shm(): boolean {
    return this.ep.scheme === "shm+unix";
  }

  /** True where the worker has a connection it can close (every scheme but ZeroMQ). */
  get closes(): boolean {
    return this.stream || this.shm;
  }

  /** The shm client options of the run. */
  get shmOptions(): { shmBytes?: number; shmDir?: string } {
    const o: { shmBytes?: number; shmDir?: string } = {};
    if (this.opts.shmBytes !== undefined) o.shmBytes = this.opts.shmBytes;
    if (this.opts.shmDir !== undefined) o.shmDir = this.opts.shmDir;
    return o;
  }

  get hasTop32(): boolean {
    return (this.g.capabilities & 2) !== 0;
  }

  get hasMargin(): boolean {
    return (this.g.capabilities & 4) !== 0;
  }

  noteStatus(s: number | undefined): void {
    if (s !== undefined) this.statuses.set(s, (this.statuses.get(s) ?? 0) + 1);
  }

  /** A new raw connection (closed after the case). */
  async conn(): Promise<RawConn> {
    const c = await connect(this.ep, this.timeoutMs * 2, this.opts.tls ?? {}, this.shmOptions);
    this.open.push(c);
    return c;
  }

  /** Closes `c` after the case like the connections of {@link conn} (cases that connect themselves). */
  adopt<T extends RawConn>(c: T): T {
    this.open.push(c);
    return c;
  }

  /** A new connection wrapped as a {@link Peer}. */
  async peer(): Promise<Peer> {
    return new Peer(await this.conn(), this);
  }

  /** Closes the connections of the case that just ran. */
  closeAll(): void {
    for (const c of this.open) c.close();
    this.open = [];
  }

  /** A new session of the tester with a distinctive id and seq base. */
  newSess(hi?: number): Sess {
    // Session ids and seq bases are fresh per run (not from the seed): a second run against the
    // same worker must not find its session already holding a newer seq.
    const id = (randomInt(1, 2 ** 28) | 0x10000000) >>> 0;
    return new Sess(id, hi ?? 1_000_000 + randomInt(0, 2 ** 29), this.g.window);
  }

  /** HELLO fields for `sess`/`seq` with the worker's geometry, with overrides. */
  helloFields(sessId: number, seq: number, over: Partial<HelloFields> = {}): HelloFields {
    const g = this.g;
    return {
      drafterIdentity: g.drafterIdentity,
      markovIdentity: g.markovIdentity,
      window: g.window,
      numSpec: g.numSpec,
      sampleMode: this.sampleMode === "top32" ? 1 : 0,
      rowDtype: 1,
      numTaps: g.numTaps,
      hidden: g.hidden,
      rowBytes: g.rowBytes,
      vocabSize: g.vocab,
      maxSlots: Math.min(g.maxSlots, 16),
      maxRowsPerStep: Math.min(g.maxRowsPerStep, Math.max(4 * g.window, 64)),
      helloFlags: this.hasMargin ? 1 : 0,
      auth: this.token !== null ? helloHmac(this.token, sessId, seq) : new Uint8Array(32),
      clientName: "tapwire-conformance",
      ...over,
    };
  }

  /** A HELLO message. */
  helloMsg(
    sessId: number,
    seq: number,
    f: HelloFields,
    hdr: { version?: number; status?: number; reserved?: number } = {},
  ): Uint8Array {
    return frame({ op: Op.HELLO, seq, session: sessId, ...hdr }, helloBody(f));
  }

  /** Under `refuse`, waits until the current session's lease has run out (CONTRACT 6.2). */
  async leaseOut(): Promise<void> {
    if (this.takeover !== "refuse" || this.current === 0) return;
    const left = this.lastOkAt + this.leaseMs + 50 - performance.now();
    if (left > 0) await new Promise((r) => setTimeout(r, left));
  }

  /** Records an OK frame of session `sess` (HELLO, STEP, RESET). */
  okFrame(sess: Sess, seq: number, newSession: boolean): void {
    sess.hi = seq >>> 0;
    if (newSession) {
      sess.oracle.reset();
      this.current = sess.id;
    }
    this.lastOkAt = performance.now();
  }

  /**
   * HELLO of `sess` on `peer` that must be answered OK; the reply is validated (CONTRACT 6.1).
   * Waits out the lease first when it takes over under `refuse`.
   */
  async helloOk(
    t: CaseCheck,
    peer: Peer,
    sess: Sess,
    over: Partial<HelloFields> = {},
    seq?: number,
  ): Promise<{ reply: Reply; f: HelloFields; r: HelloReplyFields }> {
    const isNew = sess.id !== this.current;
    if (isNew) await this.leaseOut();
    const s = seq ?? (sess.hi + 17) >>> 0;
    const f = this.helloFields(sess.id, s, over);
    const reply = await peer.call(t, this.helloMsg(sess.id, s, f), "HELLO");
    t.must(reply.h.status === 0, `HELLO of session ${sess.id} seq ${s} answered OK`, () =>
      st(reply.h.status),
    );
    const { r, problems } = helloReplyProblems(reply.body, 0, f);
    t.must(problems.length === 0 && r !== null, "a valid HelloReply (CONTRACT 6.1)", () =>
      problems.join("; "),
    );
    this.okFrame(sess, s, isNew);
    if (!isNew) sess.oracle.dropFrom(f.maxSlots);
    return { reply, f, r };
  }

  /** A connection bound to `sess` (default the main session), windows emptied by RESET. */
  async bound(t: CaseCheck, o: ShapeOptions = {}): Promise<Bound> {
    // ZeroMQ peers never close: a DEALER the tester dropped stays bound at the worker and counts
    // against its max_connections (CONTRACT 11). A new main session now and then unbinds them all.
    if (!this.closes && o.sess === undefined && ++this.zmqBinds > 12) {
      this.zmqBinds = 0;
      this.main = this.newSess();
    }
    const sess = o.sess ?? this.main;
    const peer = await this.peer();
    const sampled = o.sampled ?? this.sampleMode === "top32";
    if (sampled && !this.hasTop32)
      t.unimplemented("TOP32 sessions (the worker lacks the TOP32 capability, CONTRACT 6.1)");
    const margin = o.margin ?? this.hasMargin;
    const over: Partial<HelloFields> = { sampleMode: sampled ? 1 : 0, helloFlags: margin ? 1 : 0 };
    if (o.maxSlots !== undefined) over.maxSlots = o.maxSlots;
    if (o.maxRowsPerStep !== undefined) over.maxRowsPerStep = o.maxRowsPerStep;
    const { f, r } = await this.helloOk(t, peer, sess, over);
    const b: Bound = {
      peer,
      sess,
      sampled,
      margin,
      maxSlots: f.maxSlots,
      maxRowsPerStep: f.maxRowsPerStep,
      hello: f,
      helloReply: r,
    };
    if (o.reset !== false) await this.resetOk(t, b);
    return b;
  }

  /** RESET that must be answered OK (CONTRACT 10). */
  async resetOk(t: CaseCheck, b: Bound): Promise<void> {
    const seq = b.sess.next;
    const reply = await b.peer.call(t, frame({ op: Op.RESET, seq, session: b.sess.id }), "RESET");
    t.must(reply.h.status === 0, "RESET of the bound session answered OK", () => st(reply.h.status));
    this.okFrame(b.sess, seq, false);
    b.sess.oracle.reset();
  }

  /** `n` rows of finite bf16 values in [-1, 1]. */
  rows(n: number): Uint8Array {
    const rb = this.g.rowBytes;
    if (this.rowPool === null) {
      const poolRows = 64;
      const p = new Uint8Array(poolRows * rb);
      for (let i = 0; i < p.length; i += 2) {
        const v = bf16((this.rng.u32() / 0xffffffff) * 2 - 1);
        p[i] = v & 0xff;
        p[i + 1] = v >>> 8;
      }
      this.rowPool = p;
    }
    const out = new Uint8Array(n * rb);
    const pool = this.rowPool;
    for (let i = 0; i < n; i++) {
      const src = (i * 7) % (pool.length / rb);
      out.set(pool.subarray(src * rb, (src + 1) * rb), i * rb);
    }
    return out;
  }

  /** Entry defaults: rows end at the anchor (CONTRACT 7.2); TOP32 entries sampled unless told. */
  entry(b: Bound, e: Partial<EntryFields> & { slot: number; anchorPos: number }): EntryFields {
    const nRows = e.nRows ?? 0;
    return {
      generation: 1,
      anchorToken: (e.anchorPos * 31 + e.slot) % this.g.vocab,
      rowStart: nRows > 0 ? e.anchorPos - nRows : e.anchorPos,
      nRows,
      nOut: 0,
      flags: 1,
      ...(b.sampled ? { seed: 7 + e.slot, topK: 8, tempMilli: 800 } : {}),
      ...e,
    };
  }

  /** A STEP message for `b` (rows generated unless given). */
  stepMsg(
    b: Bound,
    entries: EntryFields[],
    o: {
      seq?: number;
      stepId?: number;
      stepFlags?: number;
      nReq?: number;
      nRows?: number;
      rows?: Uint8Array;
      session?: number;
      padByte?: number;
    } = {},
  ): Uint8Array {
    const nRows = entries.reduce((s, e) => s + e.nRows, 0);
    const body = stepBody({
      stepId: o.stepId ?? this.rng.u32(),
      entries,
      sampled: b.sampled,
      rows: o.rows ?? this.rows(nRows),
      ...(o.stepFlags !== undefined ? { stepFlags: o.stepFlags } : {}),
      ...(o.nReq !== undefined ? { nReq: o.nReq } : {}),
      ...(o.nRows !== undefined ? { nRows: o.nRows } : {}),
      ...(o.padByte !== undefined ? { padByte: o.padByte } : {}),
    });
    return frame({ op: Op.STEP, seq: o.seq ?? b.sess.next, session: o.session ?? b.sess.id }, body);
  }

  /**
   * Sends a STEP that must be answered OK; validates the reply (7.4, 6.3, 8) and compares every
   * entry's status and window_rows with the oracle (7.2). Returns the parsed reply.
   */
  async stepOk(
    t: CaseCheck,
    b: Bound,
    entries: EntryFields[],
    o: { stepId?: number; rows?: Uint8Array; msg?: Uint8Array } = {},
  ): Promise<{ r: StepReplyFields; expected: Expected[] }> {
    const stepId = o.stepId ?? this.rng.u32();
    const seq = b.sess.next;
    const msg =
      o.msg ?? this.stepMsg(b, entries, { stepId, seq, ...(o.rows !== undefined ? { rows: o.rows } : {}) });
    const reply = await b.peer.call(t, msg, "STEP");
    t.must(reply.h.status === 0, "the STEP answered OK", () => st(reply.h.status));
    this.okFrame(b.sess, seq, false);
    const { r, problems } = stepReplyProblems(reply.body, {
      stepId: o.msg !== undefined ? u32(msg, 24) : stepId,
      entries,
      numSpec: this.g.numSpec,
      window: this.g.window,
      vocabSize: this.g.vocab,
      margin: b.margin,
      sampled: b.sampled,
    });
    t.must(problems.length === 0 && r !== null, "a STEP reply valid under CONTRACT 6.3, 7.4 and 8", () =>
      problems.slice(0, 4).join("; "),
    );
    const expected = b.sess.oracle.apply(entries);
    const bad: string[] = [];
    for (let i = 0; i < entries.length; i++) {
      const e = entries[i]!;
      const x = expected[i]!;
      const gs = r.status[i]!;
      const gw = r.windowRows[i]!;
      if (gs === x.status && gw === x.windowRows) continue;
      if ((gs === 4 || gs === 5) && (x.status === 0 || x.status === 1) && (e.flags & 1) !== 0) {
        t.note(
          `slot ${e.slot}: ${REQ_STATUS_NAMES[gs]} where ${REQ_STATUS_NAMES[x.status]} could be drafted`,
        );
        continue;
      }
      bad.push(
        `slot ${e.slot}: expected ${REQ_STATUS_NAMES[x.status]} window_rows ${x.windowRows}, got ${REQ_STATUS_NAMES[gs] ?? gs} window_rows ${gw}`,
      );
    }
    t.must(
      bad.length === 0,
      "each entry's status and window_rows as the window model gives them (CONTRACT 7.2)",
      () => bad.slice(0, 4).join("; "),
    );
    return { r, expected };
  }

  /** Sends a STEP (or RESET/HELLO) that must be refused with `status`; the seq is not consumed. */
  async refused(t: CaseCheck, peer: Peer, msg: Uint8Array, status: number, what: string): Promise<Reply> {
    const reply = await peer.call(t, msg, what);
    t.must(reply.h.status === status, `${what} answered ${st(status)}`, () => st(reply.h.status));
    return reply;
  }

  /** Discovers the worker's geometry (flags first, then a mismatched HELLO's HelloReply). */
  async init(): Promise<void> {
    const o = this.opts;
    const c = await connect(this.ep, this.timeoutMs * 2, o.tls ?? {}, this.shmOptions);
    try {
      const idOf = (name: string, v: string | undefined): Uint8Array | null => {
        if (v === undefined) return null;
        if (!/^[0-9a-fA-F]{64}$/.test(v))
          throw new ConformanceError("CONFORMANCE_BAD_OPTION", `--${name} must be 64 hex digits`);
        return new Uint8Array(Buffer.from(v, "hex"));
      };
      const did = idOf("drafter-identity", o.drafterIdentity);
      const mid = idOf("markov-identity", o.markovIdentity);
      const probe = this.rng.nonZero();
      // A HELLO that cannot match (identities flipped): its IDENTITY_MISMATCH reply carries the worker's values.
      const wrong = new Uint8Array(32).fill(0xa5);
      const f: HelloFields = {
        drafterIdentity: did !== null ? did.map((x) => x ^ 0xff) : wrong,
        markovIdentity: mid ?? wrong,
        window: o.window ?? 1,
        numSpec: o.numSpec ?? 1,
        sampleMode: 0,
        rowDtype: 1,
        numTaps: o.numTaps ?? 1,
        hidden: o.hidden ?? 1,
        rowBytes: (o.numTaps ?? 1) * (o.hidden ?? 1) * 2,
        vocabSize: o.vocab ?? 2,
        maxSlots: 1,
        maxRowsPerStep: 1,
        helloFlags: 0,
        auth: this.token !== null ? helloHmac(this.token, probe, 1) : new Uint8Array(32),
        clientName: "tapwire-conformance-probe",
      };
      c.send(frame({ op: Op.HELLO, seq: 1, session: probe }, helloBody(f)));
      const r = await c.recv(this.timeoutMs);
      if (r.kind !== "msg")
        throw new ConformanceError("CONFORMANCE_DISCOVERY", `the probe HELLO got ${describe(r)}`);
      const h = parseHeader(r.bytes);
      if (h === null)
        throw new ConformanceError("CONFORMANCE_DISCOVERY", "the probe HELLO got a reply without a header");
      if (h.status === 8)
        throw new ConformanceError(
          "CONFORMANCE_DISCOVERY",
          "the worker answers UNAUTHORIZED: pass its token with --token",
        );
      if (h.status !== 5 && h.status !== 6)
        throw new ConformanceError(
          "CONFORMANCE_DISCOVERY",
          `the probe HELLO (mismatched identities) got ${st(h.status)}, not IDENTITY_MISMATCH with a HelloReply`,
        );
      const { r: hr, problems } = helloReplyProblems(r.bytes.subarray(24), h.status, null);
      if (hr === null)
        throw new ConformanceError(
          "CONFORMANCE_DISCOVERY",
          `the probe's HelloReply is unreadable: ${problems.join("; ")}`,
        );
      const rowBytes = hr.rowBytes;
      this.g = {
        window: o.window ?? hr.window,
        numSpec: o.numSpec ?? hr.numSpec,
        vocab: o.vocab ?? hr.vocabSize,
        numTaps: o.numTaps ?? 1,
        hidden: o.hidden ?? rowBytes / 2,
        rowBytes,
        drafterIdentity: did ?? hr.drafterIdentity,
        markovIdentity: mid ?? hr.markovIdentity,
        capabilities: hr.capabilities,
        maxSlots: hr.maxSlots,
        maxRowsPerStep: hr.maxRowsPerStep,
      };
      this.main = this.newSess();
      // num_taps x hidden: only row_bytes is in the HelloReply; try the factorizations in turn.
      const candidates: number[] = [];
      if (o.numTaps !== undefined) candidates.push(o.numTaps);
      else for (let k = 1; k <= 64; k++) if ((rowBytes / 2) % k === 0) candidates.push(k);
      for (const k of candidates) {
        const seq = this.main.next;
        const hf = this.helloFields(this.main.id, seq, {
          numTaps: k,
          hidden: o.hidden ?? rowBytes / 2 / k,
          sampleMode: 0,
          helloFlags: 0,
        });
        c.send(this.helloMsg(this.main.id, seq, hf));
        const rr = await c.recv(this.timeoutMs);
        const hh = rr.kind === "msg" ? parseHeader(rr.bytes) : null;
        if (hh?.status === 0) {
          this.g.numTaps = k;
          this.g.hidden = hf.hidden;
          this.okFrame(this.main, seq, true);
          return;
        }
        if (hh === null || hh.status !== 6)
          throw new ConformanceError(
            "CONFORMANCE_DISCOVERY",
            `HELLO with the discovered geometry got ${rr.kind === "msg" ? st(hh?.status ?? -1) : describe(rr)}`,
          );
        this.main.hi = seq;
      }
      throw new ConformanceError(
        "CONFORMANCE_DISCOVERY",
        `no num_taps x hidden of row_bytes ${rowBytes} is accepted; give --num-taps and --hidden (and check --window/--num-spec/--vocab)`,
      );
    } finally {
      c.close();
    }
  }

  /** What the report prints about the peer. */
  describePeer(): Record<string, unknown> {
    const g = this.g;
    return {
      transport: this.ep.scheme,
      window: g.window,
      num_spec: g.numSpec,
      vocab: g.vocab,
      num_taps: g.numTaps,
      hidden: g.hidden,
      row_bytes: g.rowBytes,
      drafter_identity: hex(g.drafterIdentity),
      markov_identity: hex(g.markovIdentity),
      capabilities: g.capabilities,
      max_slots: g.maxSlots,
      max_rows_per_step: g.maxRowsPerStep,
      sample_mode: this.sampleMode,
      takeover: this.takeover,
      auth: this.token !== null,
    };
  }
}
