import type { ClientTlsOptions, RpcClient } from "@tapwire/transport";
import { makeClient } from "@tapwire/transport";
import type { HelloReply } from "@tapwire/wire";
import {
  APP_HEADER_SIZE,
  decodeHelloReply,
  decodeStepReply,
  EntryFlag,
  encodeHello,
  FrameStatus,
  frameStatusName,
  HelloFlag,
  helloAuth,
  Op,
  REQ_ENTRY_SIZE,
  reqStatusName,
  SAMPLE_META_SIZE,
  SampleMode,
  STEP_PREFIX_SIZE,
  stepReplyBodySize,
  toHex,
  USABLE_REQ_STATUS,
  WireError,
} from "@tapwire/wire";
import { TraceError, TraceErrorCode } from "./errors.js";
import { RecordFlag, RecordKind } from "./format.js";
import type { Trace, TraceRecord } from "./reader.js";
import { recordFrame } from "./reader.js";

/** Options of {@link replayTrace}. */
export interface ReplayOptions {
  /** Worker endpoint URL (any transport of `@tapwire/transport`). */
  endpoint: string;
  /** Send STEPs back to back instead of with the recorded pacing (default false). */
  fast?: boolean;
  /** Per-request timeout, ms (default 10 000). */
  timeoutMs?: number;
  /** Connect timeout, ms (default 5 000). */
  connectTimeoutMs?: number;
  /** Shared HELLO token of the worker (CONTRACT 6.1). */
  token?: string;
  /** TLS options for `tls://` endpoints. */
  tls?: ClientTlsOptions;
  /**
   * On IDENTITY_MISMATCH, HELLO again with the worker's identities and report the change as a
   * difference (default true: comparing another head is what a replay is for). False: fail.
   */
  adoptIdentity?: boolean;
  /** A confidence delta above this (absolute) at equal ids is a difference (default 1e-4). */
  confidenceTolerance?: number;
  /** Differences listed in the report at most (default 200; all are counted). */
  maxListed?: number;
}

/** One difference found by a replay. */
export interface ParityDifference {
  /** What differs. */
  kind: "frame_status" | "status" | "window_rows" | "draft" | "confidence" | "sampled" | "missing_reply";
  /** Index of the STEP in the trace (0-based, STEPs only). */
  step: number;
  /** The STEP's step_id. */
  stepId: number;
  /** Entry index in the STEP (-1 for a frame-level difference). */
  entry: number;
  /** The entry's slot (-1 for a frame-level difference). */
  slot: number;
  /** First differing draft position (draft / confidence), else -1. */
  position: number;
  /** The trace's value (id, status name, window rows, confidence). */
  trace: number | string;
  /** The replay's value. */
  replay: number | string;
  /** Confidence replay minus trace at `position` (draft / confidence), else 0. */
  confidenceDelta: number;
}

/** An RTT distribution in microseconds. */
export interface RttSummary {
  /** Samples. */
  count: number;
  /** Mean, µs. */
  meanUs: number;
  /** Median, µs. */
  p50Us: number;
  /** 90th percentile, µs. */
  p90Us: number;
  /** 99th percentile, µs. */
  p99Us: number;
  /** Largest, µs. */
  maxUs: number;
}

/** The parity report of {@link replayTrace}. */
export interface ParityReport {
  /** True when nothing differs. */
  identical: boolean;
  /** The endpoint replayed against. */
  endpoint: string;
  /** The worker's `worker_name`. */
  workerName: string;
  /** What the trace held. */
  trace: ReplayTraceInfo;
  /** Identities of the trace's HELLO and of the worker, and whether they differ. */
  identity: ReplayIdentity;
  /** STEPs replayed. */
  steps: number;
  /** Entries whose drafts were compared. */
  entriesCompared: number;
  /** Entries with identical status, window rows, ids (and confidence within the tolerance). */
  entriesIdentical: number;
  /** Entries with at least one difference. */
  entriesDifferent: number;
  /** Entries not compared: rows omitted from the trace reached their slot's window. */
  entriesNotCompared: number;
  /** Entries whose request status changed. */
  statusesChanged: number;
  /** Total differences (all kinds). */
  differenceCount: number;
  /** The first `maxListed` differences in trace order. */
  differences: ParityDifference[];
  /** The first difference, or null. */
  first: ParityDifference | null;
  /** Largest |confidence delta| over the entries compared with equal ids. */
  maxConfidenceDelta: number;
  /** STEP RTT of the trace and of the replay. */
  rtt: {
    /** The trace's (REPLY `aux`). */
    trace: RttSummary;
    /** The replay's. */
    replay: RttSummary;
  };
}

/** What a replayed trace held ({@link ParityReport.trace}). */
export interface ReplayTraceInfo {
  /** `"client"` or `"worker"`. */
  source: string;
  /** `"all"`, `"sampled"` or `"none"`. */
  rowsPolicy: string;
  /** Records in the file. */
  records: number;
  /** Records the writer dropped. */
  dropped: number;
  /** The file ends with END. */
  complete: boolean;
}

/** A pair of identities in hex (CONTRACT 6.1). */
export interface IdentityPair {
  /** drafter_identity, hex. */
  drafter: string;
  /** markov_identity, hex. */
  markov: string;
}

/** The identities of a replay ({@link ParityReport.identity}). */
export interface ReplayIdentity {
  /** The worker's identities differ from the trace's (the replay adopted them). */
  changed: boolean;
  /** The trace's HELLO. */
  trace: IdentityPair;
  /** The worker's. */
  worker: IdentityPair;
}

/** Defaults of {@link ReplayOptions}. */
export const REPLAY_DEFAULTS = {
  timeoutMs: 10_000,
  connectTimeoutMs: 5_000,
  confidenceTolerance: 1e-4,
  maxListed: 200,
} as const;

function fail(message: string, cause?: unknown): TraceError {
  return new TraceError(TraceErrorCode.REPLAY, message, cause === undefined ? undefined : { cause });
}

/** The distribution of `us` (microseconds). */
export function rttSummary(us: readonly number[]): RttSummary {
  const s = [...us].sort((a, b) => a - b);
  const q = (p: number): number =>
    s.length === 0 ? 0 : s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
  const mean = s.length === 0 ? 0 : s.reduce((a, b) => a + b, 0) / s.length;
  return {
    count: s.length,
    meanUs: mean,
    p50Us: q(0.5),
    p90Us: q(0.9),
    p99Us: q(0.99),
    maxUs: s.length === 0 ? 0 : s[s.length - 1]!,
  };
}

interface Pair {
  req: TraceRecord;
  rep: TraceRecord | null;
}

// requests with their replies (by seq; a reply the ring dropped leaves null)
function pairs(records: readonly TraceRecord[]): Pair[] {
  const out: Pair[] = [];
  const open = new Map<number, Pair>();
  for (const r of records) {
    if (r.kind === RecordKind.REQUEST) {
      const p = { req: r, rep: null };
      out.push(p);
      open.set(r.seq, p);
    } else if (r.kind === RecordKind.REPLY) {
      const p = open.get(r.seq);
      if (p !== undefined && p.rep === null) {
        p.rep = r;
        open.delete(r.seq);
      }
    }
  }
  return out;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Replays a trace against a worker (HELLO from the trace, then every STEP and RESET in order,
 * under a fresh session with its own seq numbers) and compares each reply with the recorded
 * one: frame status, then per entry status, window rows, draft ids (first differing position)
 * and confidence. Entries whose slot window holds rows the trace omitted are not compared.
 *
 * @throws TraceError `TRACE_REPLAY` when the worker cannot be reached or refuses the HELLO.
 */
export async function replayTrace(trace: Trace, options: ReplayOptions): Promise<ParityReport> {
  const timeoutMs = options.timeoutMs ?? REPLAY_DEFAULTS.timeoutMs;
  const tol = options.confidenceTolerance ?? REPLAY_DEFAULTS.confidenceTolerance;
  const maxListed = options.maxListed ?? REPLAY_DEFAULTS.maxListed;
  const adopt = options.adoptIdentity ?? true;
  const h = trace.header.hello;
  const sampled = h.sampleMode === SampleMode.TOP32;
  const margin = (h.helloFlags & HelloFlag.WANT_MARGIN) !== 0;
  const numSpec = h.numSpec;
  const replySize =
    APP_HEADER_SIZE + stepReplyBodySize({ nReq: h.maxSlots, numSpec, margin, sampled }) + 4096;
  const replyBuf = new Uint8Array(replySize);
  let maxFrame = APP_HEADER_SIZE + 160;
  for (const r of trace.records) if (r.kind === RecordKind.REQUEST) maxFrame = Math.max(maxFrame, r.frameLen);
  const sendBuf = new Uint8Array(maxFrame);
  const cli: RpcClient = makeClient(options.endpoint, {
    maxMessageBytes: Math.max(replySize, maxFrame, 1 << 20),
    connectTimeoutMs: options.connectTimeoutMs ?? REPLAY_DEFAULTS.connectTimeoutMs,
    ...(options.tls !== undefined ? { tls: options.tls } : {}),
  });
  try {
    await cli.connect(options.connectTimeoutMs ?? REPLAY_DEFAULTS.connectTimeoutMs);
  } catch (e) {
    throw fail(`cannot connect to ${options.endpoint}: ${(e as Error).message}`, e);
  }
  const traceId = { drafter: toHex(h.drafterIdentity), markov: toHex(h.markovIdentity) };
  const report: ParityReport = {
    identical: true,
    endpoint: options.endpoint,
    workerName: "",
    trace: {
      source: trace.header.source,
      rowsPolicy: trace.header.rowsPolicy,
      records: trace.records.length,
      dropped: trace.dropped,
      complete: trace.complete,
    },
    identity: { changed: false, trace: traceId, worker: { ...traceId } },
    steps: 0,
    entriesCompared: 0,
    entriesIdentical: 0,
    entriesDifferent: 0,
    entriesNotCompared: 0,
    statusesChanged: 0,
    differenceCount: 0,
    differences: [],
    first: null,
    maxConfidenceDelta: 0,
    rtt: { trace: rttSummary([]), replay: rttSummary([]) },
  };
  const diff = (d: ParityDifference): void => {
    report.differenceCount++;
    report.identical = false;
    report.first ??= d;
    if (report.differences.length < maxListed) report.differences.push(d);
  };
  let seq = 0;
  let session = 0;
  let identities: { drafter: Uint8Array; markov: Uint8Array } | null = null;
  const sessions = new Map<number, number>();
  const tainted = new Set<number>();
  const traceRtt: number[] = [];
  const replayRtt: number[] = [];
  const exchange = async (len: number): Promise<{ n: number; us: number }> => {
    const t0 = performance.now();
    try {
      const n = await cli.request(sendBuf.subarray(0, len), replyBuf, timeoutMs);
      return { n, us: (performance.now() - t0) * 1000 };
    } catch (e) {
      throw fail(`request seq ${seq} failed: ${(e as Error).message}`, e);
    }
  };
  const hello = async (traceSession: number): Promise<void> => {
    let s = sessions.get(traceSession);
    if (s === undefined) {
      do s = 1 + Math.floor(Math.random() * 0xfffffffe);
      while (s === session);
      sessions.set(traceSession, s);
    }
    session = s;
    for (let attempt = 0; attempt < 2; attempt++) {
      seq++;
      const body = encodeHello({
        ...h,
        ...(identities !== null
          ? { drafterIdentity: identities.drafter, markovIdentity: identities.markov }
          : {}),
        auth:
          options.token !== undefined && options.token !== ""
            ? helloAuth(options.token, session, seq)
            : new Uint8Array(32),
      });
      writeHeader(sendBuf, Op.HELLO, seq, session, body.length);
      sendBuf.set(body, APP_HEADER_SIZE);
      const { n } = await exchange(APP_HEADER_SIZE + body.length);
      const status = replyBuf[7]!;
      let rep: HelloReply | null = null;
      try {
        rep = decodeHelloReply(replyBuf.subarray(APP_HEADER_SIZE, n));
      } catch {
        rep = null;
      }
      if (status === FrameStatus.OK && rep !== null) {
        report.workerName = rep.workerName;
        return;
      }
      if (status === FrameStatus.IDENTITY_MISMATCH && rep !== null && adopt && identities === null) {
        identities = { drafter: rep.drafterIdentity, markov: rep.markovIdentity };
        report.identity.changed = true;
        report.identical = false;
        report.identity.worker = { drafter: toHex(rep.drafterIdentity), markov: toHex(rep.markovIdentity) };
        continue;
      }
      throw fail(`HELLO refused by ${options.endpoint}: ${frameStatusName(status)}`);
    }
    throw fail(`HELLO refused by ${options.endpoint} after adopting its identities`);
  };
  try {
    const list = pairs(trace.records);
    const tStart = performance.now();
    const t0Trace = list[0]?.req.tUs ?? 0;
    let stepIndex = 0;
    for (const { req, rep } of list) {
      const f = req.stored;
      const op = f[6]!;
      if (op !== Op.HELLO && op !== Op.STEP && op !== Op.RESET) continue;
      if (options.fast !== true) {
        const due = (req.tUs - t0Trace) / 1000 - (performance.now() - tStart);
        if (due > 1) await sleep(Math.min(due, 60_000));
      }
      const traceSession = readU32(f, 12);
      if (op === Op.HELLO) {
        if (!sessions.has(traceSession)) tainted.clear();
        await hello(traceSession);
        continue;
      }
      if (session === 0) continue;
      if (sessions.get(traceSession) !== session) await hello(traceSession);
      seq++;
      const frame = recordFrame(req);
      sendBuf.set(frame, 0);
      writeHeader(sendBuf, op, seq, session, frame.length - APP_HEADER_SIZE);
      const { n, us } = await exchange(frame.length);
      if (op === Op.RESET) {
        tainted.clear();
        continue;
      }
      const index = stepIndex++;
      report.steps++;
      replayRtt.push(us);
      const stepId = readU32(frame, APP_HEADER_SIZE);
      const nReq = readU32(frame, APP_HEADER_SIZE + 8);
      const omitted = (req.flags & RecordFlag.ROWS_OMITTED) !== 0;
      const entriesAt = APP_HEADER_SIZE + STEP_PREFIX_SIZE + (sampled ? SAMPLE_META_SIZE * nReq : 0);
      const slots: number[] = [];
      const flagsOf: number[] = [];
      const nOut: number[] = [];
      for (let e = 0; e < nReq; e++) {
        const at = entriesAt + REQ_ENTRY_SIZE * e;
        const slot = readU32(frame, at);
        const fl = frame[at + 26]! | (frame[at + 27]! << 8);
        slots.push(slot);
        flagsOf.push(fl);
        nOut.push(frame[at + 24]! | (frame[at + 25]! << 8) || numSpec);
        const rows = readU32(frame, at + 20);
        if ((fl & EntryFlag.RELEASE) !== 0) tainted.delete(slot);
        else if (rows > 0 && omitted) tainted.add(slot);
        else if (rows > 0 && (fl & EntryFlag.RESYNC) !== 0) tainted.delete(slot);
      }
      if (rep === null) {
        diff({
          kind: "missing_reply",
          step: index,
          stepId,
          entry: -1,
          slot: -1,
          position: -1,
          trace: "dropped",
          replay: "",
          confidenceDelta: 0,
        });
        continue;
      }
      traceRtt.push(rep.aux);
      const traceStatus = rep.stored[7]!;
      const replayStatus = replyBuf[7]!;
      if (traceStatus !== replayStatus) {
        diff({
          kind: "frame_status",
          step: index,
          stepId,
          entry: -1,
          slot: -1,
          position: -1,
          trace: frameStatusName(traceStatus),
          replay: frameStatusName(replayStatus),
          confidenceDelta: 0,
        });
        continue;
      }
      if (traceStatus !== FrameStatus.OK) continue;
      const shape = { nReq, numSpec, margin, sampled };
      let a: ReturnType<typeof decodeStepReply>;
      let b: ReturnType<typeof decodeStepReply>;
      try {
        a = decodeStepReply(rep.stored.slice(APP_HEADER_SIZE), shape);
        b = decodeStepReply(replyBuf.slice(APP_HEADER_SIZE, n), shape);
      } catch (e) {
        if (!(e instanceof WireError)) throw e;
        diff({
          kind: "frame_status",
          step: index,
          stepId,
          entry: -1,
          slot: -1,
          position: -1,
          trace: "OK",
          replay: `unreadable: ${e.message}`,
          confidenceDelta: 0,
        });
        continue;
      }
      for (let e = 0; e < nReq; e++) {
        const slot = slots[e]!;
        const base = { step: index, stepId, entry: e, slot };
        if (tainted.has(slot)) {
          report.entriesNotCompared++;
          continue;
        }
        report.entriesCompared++;
        let same = true;
        if (a.status[e] !== b.status[e]) {
          report.statusesChanged++;
          same = false;
          diff({
            ...base,
            kind: "status",
            position: -1,
            trace: reqStatusName(a.status[e]!),
            replay: reqStatusName(b.status[e]!),
            confidenceDelta: 0,
          });
        } else if (a.windowRows[e] !== b.windowRows[e]) {
          same = false;
          diff({
            ...base,
            kind: "window_rows",
            position: -1,
            trace: a.windowRows[e]!,
            replay: b.windowRows[e]!,
            confidenceDelta: 0,
          });
        } else if (USABLE_REQ_STATUS.has(a.status[e]!) && (flagsOf[e]! & EntryFlag.NEED_DRAFT) !== 0) {
          for (let j = 0; j < nOut[e]!; j++) {
            const k = e * numSpec + j;
            const dc = b.confidence[k]! - a.confidence[k]!;
            if (a.draftIds[k] !== b.draftIds[k]) {
              same = false;
              diff({
                ...base,
                kind: "draft",
                position: j,
                trace: a.draftIds[k]!,
                replay: b.draftIds[k]!,
                confidenceDelta: dc,
              });
              break;
            }
            const ad = Math.abs(dc);
            if (ad > report.maxConfidenceDelta) report.maxConfidenceDelta = ad;
            if (ad > tol) {
              same = false;
              diff({
                ...base,
                kind: "confidence",
                position: j,
                trace: a.confidence[k]!,
                replay: b.confidence[k]!,
                confidenceDelta: dc,
              });
              break;
            }
            // TOP32 (CONTRACT 8): the sampled mask, the support ids and the proposal q of the position
            if (sampled && a.sampledMask !== null && b.sampledMask !== null) {
              let what = -1;
              if (a.sampledMask[k] !== b.sampledMask[k]) what = -2;
              else {
                for (let t = 0; t < 32; t++) {
                  const q = k * 32 + t;
                  if (a.supportIds![q] !== b.supportIds![q] || a.proposalQ![q] !== b.proposalQ![q]) {
                    what = t;
                    break;
                  }
                }
              }
              if (what !== -1) {
                same = false;
                diff({
                  ...base,
                  kind: "sampled",
                  position: j,
                  trace:
                    what === -2
                      ? `mask ${a.sampledMask[k]}`
                      : `support[${what}] ${a.supportIds![k * 32 + what]} q ${a.proposalQ![k * 32 + what]}`,
                  replay:
                    what === -2
                      ? `mask ${b.sampledMask[k]}`
                      : `support[${what}] ${b.supportIds![k * 32 + what]} q ${b.proposalQ![k * 32 + what]}`,
                  confidenceDelta: dc,
                });
                break;
              }
            }
          }
        }
        if (same) report.entriesIdentical++;
        else report.entriesDifferent++;
      }
    }
  } finally {
    cli.close();
  }
  report.rtt = { trace: rttSummary(traceRtt), replay: rttSummary(replayRtt) };
  return report;
}

function readU32(b: Uint8Array, at: number): number {
  return (b[at]! | (b[at + 1]! << 8) | (b[at + 2]! << 16) | (b[at + 3]! << 24)) >>> 0;
}

function writeHeader(b: Uint8Array, op: number, seq: number, session: number, bodyLen: number): void {
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  b[0] = 0x44;
  b[1] = 0x53;
  b[2] = 0x50;
  b[3] = 0x4b;
  dv.setUint16(4, 1, true);
  b[6] = op;
  b[7] = 0;
  dv.setUint32(8, seq >>> 0, true);
  dv.setUint32(12, session >>> 0, true);
  dv.setUint32(16, bodyLen, true);
  dv.setUint32(20, 0, true);
}

/** The parity report as text (what `tapwire-replay` prints without `--json`). */
export function formatParityReport(r: ParityReport): string {
  const us = (s: RttSummary) =>
    `n ${s.count}  mean ${(s.meanUs / 1000).toFixed(3)} ms  p50 ${(s.p50Us / 1000).toFixed(3)}  p90 ${(s.p90Us / 1000).toFixed(3)}  p99 ${(s.p99Us / 1000).toFixed(3)}  max ${(s.maxUs / 1000).toFixed(3)} ms`;
  const lines = [
    `tapwire-replay: ${r.identical ? "IDENTICAL" : "DIFFERENT"} against ${r.endpoint} (worker ${JSON.stringify(r.workerName)})`,
    `trace: ${r.trace.source} trace, ${r.trace.records} records, rows ${r.trace.rowsPolicy}, ${r.trace.dropped} dropped${r.trace.complete ? "" : ", cut (no END record)"}`,
    `identity: ${r.identity.changed ? `CHANGED drafter ${r.identity.trace.drafter.slice(0, 16)}.. -> ${r.identity.worker.drafter.slice(0, 16)}.., markov ${r.identity.trace.markov.slice(0, 16)}.. -> ${r.identity.worker.markov.slice(0, 16)}..` : "same"}`,
    `steps ${r.steps}; entries compared ${r.entriesCompared}: identical ${r.entriesIdentical}, different ${r.entriesDifferent}; not compared (rows omitted) ${r.entriesNotCompared}; statuses changed ${r.statusesChanged}; max |confidence delta| ${r.maxConfidenceDelta.toExponential(2)}`,
  ];
  if (r.first !== null) {
    const d = r.first;
    lines.push(
      `first difference: step ${d.step} (step_id ${d.stepId}) entry ${d.entry} slot ${d.slot}${d.position >= 0 ? ` position ${d.position}` : ""}: ${d.kind} ${d.trace} -> ${d.replay}${d.confidenceDelta !== 0 ? ` (confidence delta ${d.confidenceDelta.toExponential(2)})` : ""}`,
    );
    for (const x of r.differences.slice(1, 10)) {
      lines.push(
        `  step ${x.step} slot ${x.slot}${x.position >= 0 ? ` position ${x.position}` : ""}: ${x.kind} ${x.trace} -> ${x.replay}`,
      );
    }
    if (r.differenceCount > 10) lines.push(`  ... ${r.differenceCount - 10} more`);
  }
  lines.push(`rtt trace:  ${us(r.rtt.trace)}`, `rtt replay: ${us(r.rtt.replay)}`);
  return `${lines.join("\n")}\n`;
}
