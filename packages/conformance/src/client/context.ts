/**
 * The client mode's context: a scripted worker that answers a rank-0 client correctly by default
 * (its own window oracle, valid drafts), checks every request the client sends (CONTRACT 6.1,
 * 6.2, 7.2, 7.3), and lets a case break one reply and then watch what the client does next.
 */
import { Op } from "@tapwire/wire";
import type { EntryFields, HelloFields, ParsedHeader } from "../frames.js";
import { frame, helloHmac, helloReplyBody, hex, parseHeader, stepReplyBody } from "../frames.js";
import { WindowOracle } from "../oracle.js";
import type { CaseCheck } from "../runner.js";
import type { SessionShape, StepRequestFields } from "./requests.js";
import { parseHello, parseStep } from "./requests.js";
import type { ServerConn, ServerEvent } from "./server.js";
import { ScriptedListener } from "./server.js";

/** Options of the client mode. */
export interface ClientSuiteOptions {
  /** Where the scripted worker listens (tcp://, unix://, zmq+tcp://, zmq+ipc://). */
  listen: string;
  /** Geometry the scripted worker announces; the client must be configured the same. */
  window?: number;
  /** num_spec N (default 4). */
  numSpec?: number;
  /** vocab_size (default 1000). */
  vocab?: number;
  /** Tap vectors per row (default 1). */
  numTaps?: number;
  /** bf16 values per tap vector (default 8). */
  hidden?: number;
  /** Drafter identity, 64 hex digits (default zeros). */
  drafterIdentity?: string;
  /** Markov identity, 64 hex digits (default zeros). */
  markovIdentity?: string;
  /** The client's shared token, if it sends one (checked as CONTRACT 6.1's HMAC). */
  token?: string;
  /**
   * The client's `backoff_ms` (CONTRACT 9.1), when known: "with backoff" then means the re-HELLO
   * comes no sooner than 0.8 of it, "at once" sooner than half of it. Unknown: only the order is judged.
   */
  backoffMs?: number;
  /** How long to wait for the client's next move (default 5000 ms). */
  timeoutMs?: number;
  /** How long a disabled client must stay silent (default max(4 x backoffMs, 1500) ms). */
  disableWaitMs?: number;
  /** Called once listening (the endpoint actually bound). */
  onListening?: (endpoint: string) => void;
  /** Called when a case needs a fresh client (the previous one was disabled, as it must be). */
  onNeedClient?: (why: string) => void;
}

/** A STEP the client sent, as the scripted worker received it. */
export interface StepEvent {
  conn: ServerConn;
  msg: Uint8Array;
  h: ParsedHeader;
  req: StepRequestFields;
  at: number;
}

/** A HELLO the client sent. */
export interface HelloEvent {
  conn: ServerConn;
  msg: Uint8Array;
  h: ParsedHeader;
  f: HelloFields;
  at: number;
}

const GEOM_DEFAULTS = { window: 8, numSpec: 4, vocab: 1000, numTaps: 1, hidden: 8 };

/** The scripted worker's state and helpers. */
export class ClientCtx {
  readonly listener = new ScriptedListener();
  readonly opts: ClientSuiteOptions;
  readonly waitMs: number;
  readonly disableWaitMs: number;
  readonly W: number;
  readonly N: number;
  readonly V: number;
  readonly numTaps: number;
  readonly hidden: number;
  readonly rowBytes: number;
  readonly drafterIdentity: Uint8Array;
  readonly markovIdentity: Uint8Array;
  /** The client's current session (0: none) and its highest seq. */
  session = 0;
  hi = 0;
  shape: (SessionShape & { margin: boolean }) | null = null;
  hello: HelloFields | null = null;
  oracle: WindowOracle;
  /** Sessions the cases disabled: a request from one is a violation. */
  readonly disabled = new Set<number>();
  /** Connections bound by an OK HELLO (id → session). */
  private bound = new Map<number, number>();
  /** Problems with the client's requests since the case began. */
  violations: string[] = [];
  /** Every violation of the run (the 9.1 summary case). */
  readonly allViolations: string[] = [];
  /** HELLO/STEP counts of the run. */
  hellos = 0;
  steps = 0;
  /** Drafts that a refused reply carried, by slot: a later use would show in nothing we can see, so they are only recorded. */
  sawTop32 = false;

  constructor(opts: ClientSuiteOptions) {
    this.opts = opts;
    this.waitMs = opts.timeoutMs ?? 5000;
    this.disableWaitMs = opts.disableWaitMs ?? Math.max(4 * (opts.backoffMs ?? 0), 1500);
    this.W = opts.window ?? GEOM_DEFAULTS.window;
    this.N = opts.numSpec ?? GEOM_DEFAULTS.numSpec;
    this.V = opts.vocab ?? GEOM_DEFAULTS.vocab;
    this.numTaps = opts.numTaps ?? GEOM_DEFAULTS.numTaps;
    this.hidden = opts.hidden ?? GEOM_DEFAULTS.hidden;
    this.rowBytes = this.numTaps * this.hidden * 2;
    this.drafterIdentity =
      opts.drafterIdentity !== undefined
        ? new Uint8Array(Buffer.from(opts.drafterIdentity, "hex"))
        : new Uint8Array(32);
    this.markovIdentity =
      opts.markovIdentity !== undefined
        ? new Uint8Array(Buffer.from(opts.markovIdentity, "hex"))
        : new Uint8Array(32);
    this.oracle = new WindowOracle(this.W);
  }

  private violation(s: string): void {
    this.violations.push(s);
    if (this.allViolations.length < 50) this.allViolations.push(s);
  }

  /** The HelloReply the scripted worker gives (fields overridable for the mismatch cases). */
  helloReply(windowsKept: number, over: Partial<Parameters<typeof helloReplyBody>[0]> = {}): Uint8Array {
    return helloReplyBody({
      drafterIdentity: this.drafterIdentity,
      markovIdentity: this.markovIdentity,
      window: this.W,
      numSpec: this.N,
      capabilities: 7,
      maxSlots: 256,
      maxRowsPerStep: 4096,
      vocabSize: this.V,
      rowBytes: this.rowBytes,
      windowsKept,
      reserved: 0,
      workerName: "tapwire-conformance",
      ...over,
    });
  }

  /** Checks a HELLO the client sent (CONTRACT 6.1, 6.2); returns its fields or null. */
  checkHello(h: ParsedHeader, body: Uint8Array): HelloFields | null {
    const f = parseHello(body);
    if (f === null) {
      this.violation(`CONTRACT 6.1: HELLO body of ${body.length} bytes, not 160`);
      return null;
    }
    if (h.session === 0) this.violation("CONTRACT 6.2: HELLO with session 0");
    if (h.session === this.session && h.session !== 0 && ((h.seq - this.hi) >>> 0) - 1 >= 0x7fffffff)
      this.violation(`CONTRACT 6.2: re-HELLO seq ${h.seq} not newer than ${this.hi}`);
    if (f.rowDtype !== 1) this.violation(`CONTRACT 6.1: row_dtype ${f.rowDtype}`);
    if (f.rowBytes !== f.numTaps * f.hidden * 2)
      this.violation("CONTRACT 6.1: row_bytes != num_taps*hidden*2");
    if ((f.helloFlags & ~1) !== 0)
      this.violation(`CONTRACT 6.1: hello_flags ${f.helloFlags} has unknown bits`);
    if (f.sampleMode > 1) this.violation(`CONTRACT 6.1: sample_mode ${f.sampleMode}`);
    if (f.window < 1 || f.window > 4096 || f.numSpec < 1 || f.numSpec > 32)
      this.violation("CONTRACT 6.1: window or num_spec out of range");
    const zero = f.auth.every((x) => x === 0);
    if (this.opts.token !== undefined) {
      if (hex(f.auth) !== hex(helloHmac(this.opts.token, h.session, h.seq)))
        this.violation('CONTRACT 6.1: auth is not HMAC-SHA256(token, "tapwire/hello" ‖ session ‖ seq)');
    } else if (!zero) this.violation("CONTRACT 6.1: auth not zero without a token (pass --token)");
    return f;
  }

  /** Whether the HELLO matches what this worker serves (else the case answers CONFIG/IDENTITY_MISMATCH). */
  helloMismatch(f: HelloFields): number {
    if (
      hex(f.drafterIdentity) !== hex(this.drafterIdentity) ||
      hex(f.markovIdentity) !== hex(this.markovIdentity)
    )
      return 5;
    if (f.window !== this.W || f.numSpec !== this.N || f.vocabSize !== this.V || f.rowBytes !== this.rowBytes)
      return 6;
    return 0;
  }

  /** Answers a HELLO OK and installs the session (CONTRACT 6.2). */
  acceptHello(
    conn: ServerConn,
    h: ParsedHeader,
    f: HelloFields,
    over: Partial<Parameters<typeof helloReplyBody>[0]> = {},
  ): void {
    const same = h.session === this.session;
    if (!same) {
      this.oracle.reset();
      for (const [k, v] of this.bound) if (v !== h.session) this.bound.delete(k);
    }
    const kept = same ? this.oracle.nonEmpty : 0;
    this.session = h.session;
    this.hi = h.seq;
    this.hello = f;
    this.shape = {
      sampled: f.sampleMode === 1,
      margin: (f.helloFlags & 1) !== 0,
      maxSlots: f.maxSlots,
      maxRowsPerStep: f.maxRowsPerStep,
      rowBytes: this.rowBytes,
      numSpec: this.N,
    };
    if (this.shape.sampled) this.sawTop32 = true;
    this.bound.set(conn.id, h.session);
    conn.send(frame({ op: Op.HELLO, seq: h.seq, session: h.session }, this.helloReply(kept, over)));
  }

  /** Checks a STEP the client sent (CONTRACT 6.2, 7.2, 7.3); returns it parsed, or null. */
  checkStep(conn: ServerConn, h: ParsedHeader, body: Uint8Array): StepRequestFields | null {
    if (this.disabled.has(h.session))
      this.violation(`CONTRACT 9.3: a disabled client (session ${h.session}) sent a STEP`);
    if (this.bound.get(conn.id) !== h.session || h.session !== this.session) {
      this.violation(
        `CONTRACT 6.2: STEP of session ${h.session} on a connection not bound to it by an OK HELLO`,
      );
      return null;
    }
    if (((h.seq - this.hi) >>> 0) - 1 >= 0x7fffffff)
      this.violation(`CONTRACT 6.2: STEP seq ${h.seq} not newer than ${this.hi}`);
    if (this.shape === null) return null;
    const r = parseStep(body, this.shape);
    if (typeof r === "string") {
      this.violation(r);
      return null;
    }
    return r;
  }

  /** A valid OK reply to `req` (statuses and window_rows from the oracle; drafts in range). */
  replyFor(
    h: ParsedHeader,
    req: StepRequestFields,
    apply = true,
  ): { msg: Uint8Array; body: ReturnType<ClientCtx["replyParts"]> } {
    const parts = this.replyParts(req, apply);
    return { msg: frame({ op: Op.STEP, seq: h.seq, session: h.session }, stepReplyBody(parts)), body: parts };
  }

  /** The parts of a valid reply, for cases that break one of them. */
  replyParts(req: StepRequestFields, apply = true) {
    const n = req.entries.length;
    const N = this.N;
    const margin = this.shape?.margin ?? false;
    const sampled = this.shape?.sampled ?? false;
    const expected = apply
      ? this.oracle.apply(req.entries)
      : req.entries.map(() => ({ status: 0, windowRows: 0 }));
    const status = new Uint8Array(n);
    const windowRows = new Uint16Array(n);
    const generation = new Uint32Array(n);
    const draftIds = new Int32Array(n * N);
    const confidence = new Float32Array(n * N);
    const marginArr = margin ? new Float32Array(n * N) : null;
    const sampledMask = sampled ? new Uint8Array(n * N) : null;
    const supportIds = sampled ? new Int32Array(n * N * 32) : null;
    const proposalQ = sampled ? new Uint32Array(n * N * 32) : null;
    req.entries.forEach((e: EntryFields, i) => {
      const x = expected[i]!;
      status[i] = x.status;
      windowRows[i] = x.windowRows;
      generation[i] = e.generation;
      const consumed = (e.flags & 1) !== 0 && (x.status === 0 || x.status === 1);
      const k = consumed ? (e.nOut === 0 ? N : Math.min(e.nOut, N)) : 0;
      for (let j = 0; j < k; j++) {
        const p = i * N + j;
        let id = (e.anchorToken + j + 1) % this.V;
        if (sampledMask !== null && (e.tempMilli ?? 0) > 0) {
          const topK = e.topK ?? 1;
          const each = Math.floor(2 ** 24 / topK);
          for (let t = 0; t < topK; t++) {
            supportIds![p * 32 + t] = (e.anchorToken + j + 1 + t) % this.V;
            proposalQ![p * 32 + t] = each + (t < 2 ** 24 - each * topK ? 1 : 0);
          }
          id = supportIds![p * 32]!;
          sampledMask[p] = 1;
        }
        draftIds[p] = id;
        confidence[p] = 0.5;
        if (marginArr !== null) marginArr[p] = 1;
      }
    });
    return {
      stepId: req.stepId,
      nReq: n,
      numSpec: N,
      replyFlags: (margin ? 1 : 0) | (sampled ? 2 : 0),
      workerUs: 10,
      status,
      windowRows,
      generation,
      draftIds,
      confidence,
      margin: marginArr,
      sampledMask,
      supportIds,
      proposalQ,
    };
  }

  /** Answers any request the way a conforming worker would. */
  auto(ev: ServerEvent): void {
    if (ev.kind === "bad-prefix") {
      this.violation(`CONTRACT 3: the client wrote a length prefix ${hex(ev.prefix)} (big-endian?)`);
      return;
    }
    if (ev.kind === "close") {
      this.bound.delete(ev.conn.id);
      return;
    }
    if (ev.kind !== "msg") return;
    const h = parseHeader(ev.msg);
    if (
      h === null ||
      !h.magicOk ||
      h.version !== 1 ||
      h.reserved !== 0 ||
      h.bodyLen !== ev.msg.length - 24 ||
      h.status !== 0
    ) {
      this.violation(`CONTRACT 4: the client sent an invalid header: ${hex(ev.msg.subarray(0, 24))}`);
      ev.conn.send(frame({ op: h?.op ?? 0, status: 3, seq: h?.seq ?? 0, session: h?.session ?? 0 }));
      return;
    }
    const body = ev.msg.subarray(24);
    switch (h.op) {
      case Op.HELLO: {
        this.hellos++;
        if (this.disabled.has(h.session))
          this.violation(`CONTRACT 9.3: a disabled client (session ${h.session}) reconnected`);
        const f = this.checkHello(h, body);
        if (f === null) {
          ev.conn.send(frame({ op: Op.HELLO, status: 3, seq: h.seq, session: h.session }));
          return;
        }
        if (h.session === this.session && ((h.seq - this.hi) >>> 0) - 1 >= 0x7fffffff) {
          ev.conn.send(frame({ op: Op.HELLO, status: 2, seq: h.seq, session: h.session }));
          return;
        }
        const mm = this.helloMismatch(f);
        if (mm !== 0) {
          ev.conn.send(
            frame({ op: Op.HELLO, status: mm, seq: h.seq, session: h.session }, this.helloReply(0)),
          );
          return;
        }
        this.acceptHello(ev.conn, h, f);
        return;
      }
      case Op.STEP: {
        this.steps++;
        const req = this.checkStep(ev.conn, h, body);
        if (req === null) {
          ev.conn.send(
            frame({
              op: Op.STEP,
              status: this.bound.get(ev.conn.id) === h.session ? 3 : 1,
              seq: h.seq,
              session: h.session,
            }),
          );
          return;
        }
        this.hi = h.seq;
        ev.conn.send(this.replyFor(h, req).msg);
        return;
      }
      case Op.PING:
        ev.conn.send(
          frame(
            { op: Op.PING, seq: h.seq, session: h.session },
            body.length <= 1024 ? body : new Uint8Array(0),
          ),
        );
        return;
      case Op.STATS:
        ev.conn.send(
          frame({ op: Op.STATS, seq: h.seq, session: h.session }, new Uint8Array(Buffer.from("{}"))),
        );
        return;
      case Op.RESET:
        if (this.bound.get(ev.conn.id) !== h.session || h.session !== this.session) {
          ev.conn.send(frame({ op: Op.RESET, status: 1, seq: h.seq, session: h.session }));
          return;
        }
        this.hi = h.seq;
        this.oracle.reset();
        ev.conn.send(frame({ op: Op.RESET, seq: h.seq, session: h.session }));
        return;
      default:
        this.violation(`CONTRACT 4: the client sent op ${h.op}`);
        ev.conn.send(frame({ op: h.op, status: 7, seq: h.seq, session: h.session }));
    }
  }

  /**
   * Processes events (answering them as a conforming worker) until `pick` takes one; ends the
   * case FAILED after `ms` without one.
   */
  async until<T>(
    t: CaseCheck,
    what: string,
    pick: (ev: ServerEvent, h: ParsedHeader | null) => T | null,
    ms = this.waitMs,
  ): Promise<T> {
    const deadline = performance.now() + ms;
    for (;;) {
      const left = deadline - performance.now();
      const ev = left > 0 ? await this.listener.next(left) : null;
      t.must(ev !== null, what, `nothing within ${ms} ms`);
      const h = ev.kind === "msg" ? parseHeader(ev.msg) : null;
      const v = pick(ev, h);
      if (v !== null) return v;
      this.auto(ev);
    }
  }

  /** Collects events for `ms` (answering them), returning them. */
  async watch(
    ms: number,
    stop?: (ev: ServerEvent, h: ParsedHeader | null) => boolean,
  ): Promise<{ ev: ServerEvent; h: ParsedHeader | null }[]> {
    const out: { ev: ServerEvent; h: ParsedHeader | null }[] = [];
    const deadline = performance.now() + ms;
    for (;;) {
      const left = deadline - performance.now();
      if (left <= 0) return out;
      const ev = await this.listener.next(left);
      if (ev === null) return out;
      const h = ev.kind === "msg" ? parseHeader(ev.msg) : null;
      out.push({ ev, h });
      if (stop?.(ev, h) === true) return out;
      this.auto(ev);
    }
  }

  /** The next valid STEP of the current session carrying at least one entry (not yet answered). */
  async nextStep(
    t: CaseCheck,
    pred: (s: StepEvent) => boolean = (s) => s.req.entries.length > 0,
  ): Promise<StepEvent> {
    return this.until(t, "a STEP from the client", (ev, h) => {
      if (ev.kind !== "msg" || h === null || h.op !== Op.STEP || !h.magicOk || h.session !== this.session)
        return null;
      if (this.bound.get(ev.conn.id) !== h.session) return null;
      const req = parseStep(ev.msg.subarray(24), this.shape!);
      if (typeof req === "string") return null;
      if (((h.seq - this.hi) >>> 0) - 1 >= 0x7fffffff) return null;
      const s = { conn: ev.conn, msg: ev.msg, h, req, at: ev.at };
      if (!pred(s)) return null;
      this.steps++;
      return s;
    });
  }

  /** The next HELLO (not yet answered), from any session. */
  async nextHello(
    t: CaseCheck,
    pred: (h: ParsedHeader) => boolean = () => true,
    ms = this.waitMs,
  ): Promise<HelloEvent> {
    return this.until(
      t,
      "a HELLO from the client",
      (ev, h) => {
        if (ev.kind !== "msg" || h === null || h.op !== Op.HELLO || !pred(h)) return null;
        const f = parseHello(ev.msg.subarray(24));
        if (f === null) return null;
        this.hellos++;
        return { conn: ev.conn, msg: ev.msg, h, f, at: ev.at };
      },
      ms,
    );
  }

  /** Marks the client's session as consumed by a fatal case and asks for a fresh client. */
  needNewClient(why: string): void {
    this.disabled.add(this.session);
    this.session = 0;
    this.opts.onNeedClient?.(why);
  }
}
