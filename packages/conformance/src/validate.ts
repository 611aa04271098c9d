/**
 * The tester's reply validator: every reply a worker sends is checked against CONTRACT 4, 6.1,
 * 6.3, 7.4 and 8 (and the scripted worker of the client mode uses the same rules to build the
 * replies it breaks on purpose). Each problem is a sentence naming the contract section.
 */
import { APP_HEADER_SIZE, HELLO_REPLY_BODY_SIZE, TOP_K_MAX } from "@tapwire/wire";
import type { EntryFields, HelloFields, HelloReplyFields, ParsedHeader, StepReplyFields } from "./frames.js";
import { hex, parseHeader, parseHelloReply, parseStepReply } from "./frames.js";

/** What a reply must echo: the request's header (or, for an unreadable one, what was present). */
export interface Echo {
  op: number;
  seq: number;
  session: number;
}

/** Problems with the header of a reply (CONTRACT 4, 5). */
export function headerProblems(
  m: Uint8Array,
  echo: Echo | null,
): { h: ParsedHeader | null; problems: string[] } {
  const p: string[] = [];
  const h = parseHeader(m);
  if (h === null) return { h, problems: [`CONTRACT 4: reply of ${m.length} bytes has no 24-byte header`] };
  if (!h.magicOk) p.push(`CONTRACT 4: reply magic is ${hex(m.subarray(0, 4))}, not 4453504b`);
  if (h.version !== 1) p.push(`CONTRACT 4: reply version is ${h.version}, not 1`);
  if (h.reserved !== 0) p.push(`CONTRACT 4: reply reserved field is ${h.reserved}, not 0`);
  if (h.bodyLen !== m.length - APP_HEADER_SIZE)
    p.push(
      `CONTRACT 4: reply body_len ${h.bodyLen} but the message has ${m.length - APP_HEADER_SIZE} body bytes`,
    );
  if (h.status > 11) p.push(`CONTRACT 5: reply status ${h.status} is not a frame status`);
  if (echo !== null) {
    if (h.op !== echo.op) p.push(`CONTRACT 4: reply op ${h.op} does not echo the request's ${echo.op}`);
    if (h.seq !== echo.seq) p.push(`CONTRACT 4: reply seq ${h.seq} does not echo the request's ${echo.seq}`);
    if (h.session !== echo.session)
      p.push(`CONTRACT 4: reply session ${h.session} does not echo the request's ${echo.session}`);
  }
  return { h, problems: p };
}

function nameProblem(b: Uint8Array, what: string): string | null {
  let end = b.indexOf(0);
  if (end < 0) end = b.length;
  for (let i = end; i < b.length; i++) if (b[i] !== 0) return `CONTRACT 6.1: ${what} is not NUL-padded`;
  try {
    new TextDecoder("utf-8", { fatal: true }).decode(b.subarray(0, end));
  } catch {
    return `CONTRACT 6.1: ${what} is not UTF-8`;
  }
  return null;
}

/** Problems of a HelloReply body (CONTRACT 6.1), plus the client's checks of an OK reply. */
export function helloReplyProblems(
  body: Uint8Array,
  status: number,
  hello: HelloFields | null,
): { r: HelloReplyFields | null; problems: string[] } {
  const p: string[] = [];
  const r = parseHelloReply(body);
  if (r === null) {
    return {
      r,
      problems: [`CONTRACT 6.1: HelloReply body is ${body.length} bytes, not ${HELLO_REPLY_BODY_SIZE}`],
    };
  }
  if (r.reserved !== 0) p.push(`CONTRACT 6.1: HelloReply reserved is ${r.reserved}, not 0`);
  const np = nameProblem(r.workerNameBytes, "worker_name");
  if (np !== null) p.push(np);
  if ((r.capabilities & 1) === 0) p.push("CONTRACT 6.1: HelloReply capabilities lack TAPS_BF16 (bit 0)");
  if (status === 0 && hello !== null) {
    if (hex(r.drafterIdentity) !== hex(hello.drafterIdentity))
      p.push("CONTRACT 6.1: OK HelloReply drafter_identity differs from the HELLO's");
    if (hex(r.markovIdentity) !== hex(hello.markovIdentity))
      p.push("CONTRACT 6.1: OK HelloReply markov_identity differs from the HELLO's");
    if (r.window !== hello.window)
      p.push(`CONTRACT 6.1: OK HelloReply window ${r.window} != ${hello.window}`);
    if (r.numSpec !== hello.numSpec)
      p.push(`CONTRACT 6.1: OK HelloReply num_spec ${r.numSpec} != ${hello.numSpec}`);
    if (hello.sampleMode === 1 && (r.capabilities & 2) === 0)
      p.push("CONTRACT 6.1: OK reply to a TOP32 HELLO lacks the TOP32 capability");
    if ((hello.helloFlags & 1) !== 0 && (r.capabilities & 4) === 0)
      p.push("CONTRACT 6.1: OK reply to a WANT_MARGIN HELLO lacks the MARGIN capability");
    if (r.maxSlots < hello.maxSlots)
      p.push(`CONTRACT 6.1: OK HelloReply max_slots ${r.maxSlots} < asked ${hello.maxSlots}`);
    if (r.maxRowsPerStep < hello.maxRowsPerStep)
      p.push(
        `CONTRACT 6.1: OK HelloReply max_rows_per_step ${r.maxRowsPerStep} < asked ${hello.maxRowsPerStep}`,
      );
    if (r.vocabSize !== hello.vocabSize)
      p.push(`CONTRACT 6.1: OK HelloReply vocab_size ${r.vocabSize} != ${hello.vocabSize}`);
    if (r.rowBytes !== hello.rowBytes)
      p.push(`CONTRACT 6.1: OK HelloReply row_bytes ${r.rowBytes} != ${hello.rowBytes}`);
  }
  return { r, problems: p };
}

/** What the validator needs to know about the STEP a reply answers. */
export interface StepContext {
  stepId: number;
  entries: EntryFields[];
  numSpec: number;
  window: number;
  vocabSize: number;
  margin: boolean;
  sampled: boolean;
}

/** Statuses a worker may use for an entry (CONTRACT 7.2). */
export const REQ_STATUS_COUNT = 6;

/** Problems of an OK STEP reply (CONTRACT 6.3, 7.2, 7.4, 8). */
export function stepReplyProblems(
  body: Uint8Array,
  c: StepContext,
): { r: StepReplyFields | null; problems: string[] } {
  const parsed = parseStepReply(body);
  if (typeof parsed === "string") return { r: null, problems: [`CONTRACT 7.4: ${parsed}`] };
  const r = parsed;
  const p: string[] = [];
  const n = c.entries.length;
  const N = c.numSpec;
  if (r.stepId !== c.stepId) p.push(`CONTRACT 7.4: reply step_id ${r.stepId} does not echo ${c.stepId}`);
  if (r.nReq !== n) p.push(`CONTRACT 7.4: reply n_req ${r.nReq} != request's ${n}`);
  if (r.numSpec !== N) p.push(`CONTRACT 7.4: reply num_spec ${r.numSpec} != the session's ${N}`);
  if ((r.replyFlags & ~3) !== 0) p.push(`CONTRACT 7.4: reply_flags ${r.replyFlags} has unknown bits`);
  if (((r.replyFlags & 1) !== 0) !== c.margin)
    p.push(
      `CONTRACT 7.4: MARGIN is ${(r.replyFlags & 1) !== 0 ? "set" : "not set"} but the session ${c.margin ? "asked" : "did not ask"} WANT_MARGIN`,
    );
  if (((r.replyFlags & 2) !== 0) !== c.sampled)
    p.push(
      `CONTRACT 7.4: SAMPLED is ${(r.replyFlags & 2) !== 0 ? "set" : "not set"} in a ${c.sampled ? "TOP32" : "greedy"} session`,
    );
  if (r.paddingNonZero !== null) p.push(`CONTRACT 7.4: ${r.paddingNonZero} is not zero`);
  if (p.length > 0 || r.nReq !== n || r.numSpec !== N) return { r, problems: p };
  for (let i = 0; i < n; i++) {
    const e = c.entries[i]!;
    const st = r.status[i]!;
    if (st >= REQ_STATUS_COUNT) p.push(`CONTRACT 7.2: slot ${e.slot} status ${st} is not a request status`);
    if (r.generation[i] !== e.generation >>> 0)
      p.push(`CONTRACT 7.4: slot ${e.slot} generation echo ${r.generation[i]} != ${e.generation >>> 0}`);
    const expected = Math.min(c.window, e.anchorPos);
    if (r.windowRows[i]! > expected)
      p.push(
        `CONTRACT 7.2: slot ${e.slot} window_rows ${r.windowRows[i]} > min(W, anchor_pos) = ${expected}`,
      );
    if ((st === 3 || (e.flags & 4) !== 0) && r.windowRows[i] !== 0)
      p.push(
        `CONTRACT 7.2: slot ${e.slot} window_rows ${r.windowRows[i]} for a ${st === 3 ? "STALE_GENERATION" : "RELEASE"} entry (must be 0)`,
      );
    const consumed = (e.flags & 1) !== 0 && (st === 0 || st === 1);
    const k = consumed ? (e.nOut === 0 ? N : Math.min(e.nOut, N)) : 0;
    const sampledEntry = c.sampled && (e.tempMilli ?? 0) > 0;
    for (let j = 0; j < N; j++) {
      const q = i * N + j;
      const id = r.draftIds[q]!;
      const conf = r.confidence[q]!;
      const m = r.margin !== null ? r.margin[q]! : 0;
      const at = `slot ${e.slot} position ${j}`;
      if (j < k) {
        if (!(id >= 0 && id < c.vocabSize))
          p.push(`CONTRACT 6.3: ${at} draft id ${id} outside [0, ${c.vocabSize})`);
        if (!(Number.isFinite(conf) && conf >= 0 && conf <= 1))
          p.push(`CONTRACT 6.3: ${at} confidence ${conf} not finite in [0, 1]`);
        if (r.margin !== null && !(Number.isFinite(m) && m >= 0))
          p.push(`CONTRACT 6.3: ${at} margin ${m} not finite >= 0`);
      } else {
        if (id !== 0 || !Object.is(conf, 0) || !Object.is(m, 0))
          p.push(`CONTRACT 6.3: ${at} beyond k=${k} is (${id}, ${conf}, ${m}), not exactly (0, 0.0, 0.0)`);
      }
      if (r.sampledMask === null) continue;
      const mask = r.sampledMask[q]!;
      const o = q * TOP_K_MAX;
      const ids = r.supportIds!.subarray(o, o + TOP_K_MAX);
      const qs = r.proposalQ!.subarray(o, o + TOP_K_MAX);
      if (j < k && sampledEntry) {
        if (mask !== 1) p.push(`CONTRACT 8: ${at} is sampled (temp_milli > 0) but sampled_mask is ${mask}`);
        const topK = e.topK ?? 8;
        const seen = new Set<number>();
        let sum = 0;
        let hit = false;
        for (let t = 0; t < TOP_K_MAX; t++) {
          const sid = ids[t]!;
          const sq = qs[t]!;
          if (t >= topK) {
            if (sid !== 0 || sq !== 0) p.push(`CONTRACT 8: ${at} support/q at ${t} >= top_k ${topK} not 0`);
            continue;
          }
          if (!(sid >= 0 && sid < c.vocabSize))
            p.push(`CONTRACT 8: ${at} support id ${sid} outside the vocabulary`);
          if (seen.has(sid)) p.push(`CONTRACT 8: ${at} support id ${sid} twice`);
          seen.add(sid);
          if (sq < 1) p.push(`CONTRACT 8: ${at} q[${t}] = ${sq} < 1`);
          sum += sq;
          if (sid === id) hit = true;
        }
        if (sum !== 2 ** 24) p.push(`CONTRACT 8: ${at} q sums to ${sum}, not 2^24`);
        if (!hit) p.push(`CONTRACT 8: ${at} draft id ${id} is not one of the support ids`);
      } else {
        if (mask !== 0)
          p.push(`CONTRACT 8: ${at} sampled_mask ${mask} on a ${j < k ? "greedy" : "non-consumed"} position`);
        let bad = false;
        for (let t = 0; t < TOP_K_MAX; t++) if (ids[t] !== 0 || qs[t] !== 0) bad = true;
        if (bad)
          p.push(`CONTRACT 8: ${at} support/q not zero on a ${j < k ? "greedy" : "non-consumed"} position`);
      }
      if (p.length > 20) return { r, problems: p };
    }
  }
  return { r, problems: p };
}
