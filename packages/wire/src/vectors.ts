import { fromHex, toHex } from "./bytes.js";
import { checkReplyValues, type ReplyContext, validateSampled } from "./check.js";
import { APP_HEADER_SIZE, FRAME_STATUS_NAMES, FrameStatus, HELLO_BODY_SIZE, Op } from "./constants.js";
import { WireError } from "./errors.js";
import { encodeHeader, frame, splitFrame } from "./header.js";
import { decodeHello, decodeHelloReply, encodeHello, encodeHelloReply, helloAuth } from "./hello.js";
import { beginStepReply, decodeStepReply, peekStepReplyShape, setReplyWorkerUs } from "./step-reply.js";
import { decodeStepRequest, type ReqEntry, type SampleMeta, writeStepPrefix } from "./step-request.js";

/** One case of a vectors file (format of `wire-v1.json`, see its README). */
export interface VectorCase {
  /** Case name, e.g. `step_request_greedy#1` (for reports; the frame kind follows from `fields`). */
  name: string;
  /** The whole frame, lowercase hex. */
  hex: string;
  /** Fields with snake_case names as in CONTRACT. */
  fields: Record<string, unknown>;
  /** Whether the frame must decode (and encode from `fields` to `hex`) or be refused. */
  valid: boolean;
  /** For invalid cases: a frame status name, or text the error message must contain. */
  expect?: string;
}

/** Outcome of one case: `problem` names the first mismatch when `ok` is false. */
export interface VectorResult {
  /** The case's name. */
  name: string;
  /** The case behaved as the file says. */
  ok: boolean;
  /** The first mismatch, when not `ok`. */
  problem?: string;
}

/** Outcome of a whole vectors file. */
export interface VectorReport {
  /** One result per case, in file order. */
  results: VectorResult[];
  /** Cases that behaved as the file says. */
  passed: number;
  /** Cases that did not. */
  failed: number;
}

type F = Record<string, unknown>;

class Mismatch extends Error {}

function num(f: F, key: string, dflt?: number): number {
  const v = f[key];
  if (typeof v === "number") return v;
  if (v === undefined && dflt !== undefined) return dflt;
  throw new Mismatch(`field ${key} missing or not a number`);
}
function str(f: F, key: string): string {
  const v = f[key];
  if (typeof v !== "string") throw new Mismatch(`field ${key} missing or not a string`);
  return v;
}
function obj(f: F, key: string): F {
  const v = f[key];
  if (typeof v !== "object" || v === null || Array.isArray(v))
    throw new Mismatch(`field ${key} is not an object`);
  return v as F;
}
function arr(f: F, key: string): unknown[] {
  const v = f[key];
  if (!Array.isArray(v)) throw new Mismatch(`field ${key} is not an array`);
  return v;
}
function nums(f: F, key: string): number[] {
  return arr(f, key).map((x, i) => {
    if (typeof x !== "number") throw new Mismatch(`field ${key}[${i}] is not a number`);
    return x;
  });
}

function same(what: string, got: unknown, want: unknown): void {
  if (got !== want && !(Number.isNaN(got) && Number.isNaN(want))) {
    throw new Mismatch(`${what}: decoded ${String(got)}, vector has ${String(want)}`);
  }
}
function sameArray(what: string, got: ArrayLike<number> | null, want: readonly number[] | undefined): void {
  if (want === undefined) {
    if (got !== null) throw new Mismatch(`${what}: decoded an array the vector does not have`);
    return;
  }
  if (got === null) throw new Mismatch(`${what}: vector has an array, decoded none`);
  same(`${what} length`, got.length, want.length);
  for (let i = 0; i < want.length; i++) same(`${what}[${i}]`, got[i], want[i]);
}
function sameBytes(what: string, got: Uint8Array, wantHex: string): void {
  const g = toHex(got);
  if (g !== wantHex.toLowerCase()) throw new Mismatch(`${what}: got ${g}, want ${wantHex}`);
}

function entryOf(e: F): ReqEntry {
  return {
    slot: num(e, "slot"),
    generation: num(e, "generation"),
    anchorPos: num(e, "anchor_pos"),
    anchorToken: num(e, "anchor_token", 0),
    rowStart: num(e, "row_start", 0),
    nRows: num(e, "n_rows", 0),
    nOut: num(e, "n_out", 0),
    flags: num(e, "flags", 0),
  };
}
function metaOf(m: F): SampleMeta {
  return { seed: num(m, "seed"), topK: num(m, "top_k"), tempMilli: num(m, "temp_milli") };
}
function metasOf(f: F): SampleMeta[] | null {
  const v = f["sample_meta"];
  return v === null || v === undefined ? null : arr(f, "sample_meta").map((m) => metaOf(m as F));
}

function contextOf(rc: F, stepId: number, numSpec: number): ReplyContext {
  return {
    stepId: num(rc, "step_id", stepId),
    vocabSize: num(rc, "vocab_size"),
    window: num(rc, "window"),
    numSpec: num(rc, "num_spec", numSpec),
    entries: arr(rc, "entries").map((e) => entryOf(e as F)),
    sampleMeta: metasOf(rc),
  };
}

function helloOf(h: F) {
  return {
    drafterIdentity: fromHex(str(h, "drafter_identity")),
    markovIdentity: fromHex(str(h, "markov_identity")),
    window: num(h, "window"),
    numSpec: num(h, "num_spec"),
    sampleMode: num(h, "sample_mode"),
    rowDtype: num(h, "row_dtype", 1),
    numTaps: num(h, "num_taps"),
    hidden: num(h, "hidden"),
    rowBytes: num(h, "row_bytes"),
    vocabSize: num(h, "vocab_size"),
    maxSlots: num(h, "max_slots"),
    maxRowsPerStep: num(h, "max_rows_per_step"),
    helloFlags: num(h, "hello_flags"),
    auth: fromHex(str(h, "auth")),
    clientName: str(h, "client_name"),
  };
}

function helloReplyOf(r: F) {
  return {
    drafterIdentity: fromHex(str(r, "drafter_identity")),
    markovIdentity: fromHex(str(r, "markov_identity")),
    window: num(r, "window"),
    numSpec: num(r, "num_spec"),
    capabilities: num(r, "capabilities"),
    maxSlots: num(r, "max_slots"),
    maxRowsPerStep: num(r, "max_rows_per_step"),
    vocabSize: num(r, "vocab_size"),
    rowBytes: num(r, "row_bytes"),
    windowsKept: num(r, "windows_kept"),
    workerName: str(r, "worker_name"),
  };
}

function sameObject(what: string, got: Record<string, unknown>, want: Record<string, unknown>): void {
  for (const [k, v] of Object.entries(want)) {
    const g = got[k];
    if (v instanceof Uint8Array) sameBytes(`${what}.${k}`, g as Uint8Array, toHex(v));
    else same(`${what}.${k}`, g, v);
  }
}

function validCase(c: VectorCase, msg: Uint8Array): void {
  const f = c.fields;
  const isRequest = f["status"] === undefined;
  const { header, body } = splitFrame(msg, msg.length, { request: isRequest });
  same("op", header.op, num(f, "op"));
  same("seq", header.seq, num(f, "seq"));
  same("session", header.session, num(f, "session"));
  same("status", header.status, num(f, "status", 0));
  const status = num(f, "status", 0);
  const h = { op: header.op, status, seq: header.seq, session: header.session };

  if (f["hello"] !== undefined) {
    const want = helloOf(obj(f, "hello"));
    sameObject("hello", decodeHello(body) as unknown as F, want as unknown as F);
    if (typeof f["token"] === "string") {
      sameBytes(
        "hello.auth (HMAC of token, CONTRACT 6.1)",
        helloAuth(f["token"], header.session, header.seq),
        str(obj(f, "hello"), "auth"),
      );
    }
    sameBytes("encoded HELLO", frame(h, encodeHello(want)), c.hex);
  } else if (f["hello_reply"] !== undefined) {
    const want = helloReplyOf(obj(f, "hello_reply"));
    sameObject("hello_reply", decodeHelloReply(body) as unknown as F, want as unknown as F);
    sameBytes("encoded HelloReply", frame(h, encodeHelloReply(want)), c.hex);
  } else if (f["entries"] !== undefined) {
    const sampled = f["sampled"] === true;
    const rowBytes = num(f, "row_bytes");
    const req = decodeStepRequest(body, {
      sampled,
      rowBytes,
      maxSlots: 0xffffffff,
      maxRowsPerStep: 0xffffffff,
      numSpec: 0xffff,
    });
    same("step_id", req.stepId, num(f, "step_id"));
    same("step_flags", req.stepFlags, num(f, "step_flags", 0));
    same("n_rows", req.nRows, num(f, "n_rows"));
    same("rows_offset", req.rowsOffset, num(f, "rows_offset", req.rowsOffset));
    const entries = arr(f, "entries").map((e) => entryOf(e as F));
    same("n_req", req.nReq, entries.length);
    for (const [i, e] of entries.entries()) {
      sameObject(`entries[${i}]`, req.entries[i] as unknown as F, e as unknown as F);
    }
    const metas = metasOf(f);
    same("sample_meta present", req.sampleMeta !== null, metas !== null);
    for (const [i, m] of (metas ?? []).entries()) {
      sameObject(`sample_meta[${i}]`, req.sampleMeta?.[i] as unknown as F, m as unknown as F);
    }
    const rowsHex = typeof f["rows_hex"] === "string" ? f["rows_hex"] : "";
    sameBytes("rows", req.rows, rowsHex);
    const out = new Uint8Array(msg.length);
    out.set(fromHex(rowsHex), APP_HEADER_SIZE + req.rowsOffset);
    const len = writeStepPrefix(out, {
      seq: header.seq,
      session: header.session,
      stepId: num(f, "step_id"),
      entries,
      sampleMeta: metas,
      nRows: num(f, "n_rows"),
      rowBytes,
    });
    sameBytes("encoded STEP request", out.subarray(0, len), c.hex);
  } else if (f["req_status"] !== undefined) {
    const shape = peekStepReplyShape(body);
    const r = decodeStepReply(body, shape);
    same("step_id", r.stepId, num(f, "step_id"));
    same("num_spec", r.numSpec, num(f, "num_spec"));
    same("reply_flags", r.replyFlags, num(f, "reply_flags"));
    same("worker_us", r.workerUs, num(f, "worker_us", 0));
    const arrays: [string, keyof typeof r][] = [
      ["req_status", "status"],
      ["window_rows", "windowRows"],
      ["generation", "generation"],
      ["draft_ids", "draftIds"],
      ["confidence", "confidence"],
      ["margin", "margin"],
      ["sampled_mask", "sampledMask"],
      ["support_ids", "supportIds"],
      ["proposal_q", "proposalQ"],
    ];
    for (const [k, v] of arrays) {
      sameArray(k, r[v] as ArrayLike<number> | null, f[k] === undefined ? undefined : nums(f, k));
    }
    if (f["request_context"] !== undefined) {
      const ctx = contextOf(obj(f, "request_context"), r.stepId, r.numSpec);
      checkReplyValues(r, ctx);
      validateSampled(r, ctx);
    }
    const out = new Uint8Array(msg.length);
    const v = beginStepReply(out, {
      seq: header.seq,
      session: header.session,
      stepId: num(f, "step_id"),
      ...shape,
    });
    for (const [k, key] of arrays) {
      const dst = v[key] as { set(a: ArrayLike<number>): void } | null;
      if (f[k] !== undefined && dst !== null) dst.set(nums(f, k));
    }
    setReplyWorkerUs(out, num(f, "worker_us", 0));
    if (status !== FrameStatus.OK) encodeHeader(out, 0, { ...h, bodyLen: v.frameLength - APP_HEADER_SIZE });
    sameBytes("encoded STEP reply", out.subarray(0, v.frameLength), c.hex);
  } else if (f["body_hex"] !== undefined) {
    sameBytes("body", body, str(f, "body_hex"));
    sameBytes("encoded frame", frame(h, fromHex(str(f, "body_hex"))), c.hex);
  } else {
    throw new Mismatch(
      "valid case of an unknown kind (no hello, hello_reply, entries, req_status or body_hex)",
    );
  }
}

function invalidCase(c: VectorCase, msg: Uint8Array): void {
  const expect = c.expect ?? "";
  const statusNames = Object.values(FRAME_STATUS_NAMES);
  try {
    const { header, body } = splitFrame(msg);
    const f = c.fields;
    if (f["request_context"] !== undefined) {
      const r = decodeStepReply(body, peekStepReplyShape(body));
      const ctx = contextOf(obj(f, "request_context"), r.stepId, r.numSpec);
      checkReplyValues(r, ctx);
      validateSampled(r, ctx);
    } else if (header.op === Op.HELLO && header.status === 0) {
      if (body.length !== HELLO_BODY_SIZE) decodeHello(body);
    } else if (header.op === Op.HELLO) {
      decodeHelloReply(body);
    }
  } catch (e) {
    if (!(e instanceof WireError)) throw new Mismatch(`threw ${String(e)}, not a WireError`);
    if (statusNames.includes(expect)) {
      const got = e.status === undefined ? e.code : (FRAME_STATUS_NAMES[e.status] ?? String(e.status));
      if (got !== expect) throw new Mismatch(`refused with ${got} (${e.message}), vector expects ${expect}`);
    } else if (!e.message.includes(expect)) {
      throw new Mismatch(`refused with "${e.message}", which does not name "${expect}"`);
    }
    return;
  }
  throw new Mismatch(`accepted, vector expects ${expect}`);
}

/** Runs one vectors case (decode and, for valid cases, encode back byte for byte). */
export function runVectorCase(c: VectorCase): VectorResult {
  try {
    const msg = fromHex(c.hex);
    if (c.valid) validCase(c, msg);
    else invalidCase(c, msg);
    return { name: c.name, ok: true };
  } catch (e) {
    const problem =
      e instanceof Mismatch
        ? e.message
        : `${e instanceof WireError ? e.code : "error"}: ${String((e as Error).message ?? e)}`;
    return { name: c.name, ok: false, problem };
  }
}

/**
 * Runs every case of a parsed vectors document (`{ cases: VectorCase[] }`, the format of
 * `wire-v1.json`) and counts passes and failures.
 * @throws WireError `WIRE_BAD_ARGUMENT` when the document has no `cases` array.
 */
export function runVectors(doc: unknown): VectorReport {
  const cases = (doc as { cases?: unknown } | null)?.cases;
  if (!Array.isArray(cases)) throw new WireError("WIRE_BAD_ARGUMENT", "vectors document has no cases array");
  const results = cases.map((c, i) => {
    const vc = c as Partial<VectorCase>;
    if (typeof vc.hex !== "string" || typeof vc.valid !== "boolean") {
      return { name: String(vc.name ?? `case ${i}`), ok: false, problem: "case lacks hex or valid" };
    }
    return runVectorCase({ fields: {}, name: `case ${i}`, ...vc } as VectorCase);
  });
  const passed = results.filter((r) => r.ok).length;
  return { results, passed, failed: results.length - passed };
}
