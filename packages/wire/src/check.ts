import { isIntIn } from "./bytes.js";
import { DYADIC_ONE, EntryFlag, ReplyFlag, ReqStatus, reqStatusName, TOP_K_MAX } from "./constants.js";
import { badArgument, badReply } from "./errors.js";
import type { StepReplyViews } from "./step-reply.js";
import type { ReqEntry, SampleMeta } from "./step-request.js";

/** What a STEP reply answers: the request as the client sent it, and the session's parameters. */
export interface ReplyContext {
  /** The request's `step_id`. */
  stepId: number;
  /** The session's vocabulary size `V`. */
  vocabSize: number;
  /** The session's window `W`. */
  window: number;
  /** The session's `N`. */
  numSpec: number;
  /** The request's entries (only slot, generation, anchorPos, nOut and flags are read). */
  entries: readonly Pick<ReqEntry, "slot" | "generation" | "anchorPos" | "nOut" | "flags">[];
  /** The first `nEntries` of `entries` were sent (default all). */
  nEntries?: number;
  /** The request's sample meta in TOP32 sessions; null/omitted in greedy sessions. */
  sampleMeta?: readonly SampleMeta[] | null;
}

type CtxEntry = ReplyContext["entries"][number];

function entryCount(reply: StepReplyViews, ctx: ReplyContext): number {
  const n = ctx.nEntries ?? ctx.entries.length;
  if (!isIntIn(n, 0, ctx.entries.length)) {
    throw badArgument(`nEntries ${n} outside 0..${ctx.entries.length}`);
  }
  if (reply.nReq !== n) throw badReply(`reply n_req ${reply.nReq} != ${n} entries sent`);
  return n;
}

/**
 * Positions of entry `e` whose values the client consumes (CONTRACT 6.3): `n_out == 0 ? N :
 * min(n_out, N)` when it had NEED_DRAFT and a usable status (OK or PARTIAL_WINDOW), else 0.
 */
export function consumedPositions(
  e: Pick<ReqEntry, "nOut" | "flags">,
  reqStatus: number,
  numSpec: number,
): number {
  if ((e.flags & EntryFlag.NEED_DRAFT) === 0 || reqStatus > ReqStatus.PARTIAL_WINDOW) return 0;
  return e.nOut === 0 ? numSpec : Math.min(e.nOut, numSpec);
}

function fmt(v: number): string {
  return Object.is(v, -0) ? "-0" : String(v);
}

/**
 * Client checks of a decoded STEP reply against the request it answers (CONTRACT 6.3, 7.2 step 5
 * and 6, 7.4), throwing `WIRE_BAD_REPLY` naming the first violation:
 * - echoes: `step_id`, `n_req`, `num_spec`, then per entry the generation echo;
 * - per entry: a known request status; `window_rows <= min(W, anchor_pos)`; OK means exactly
 *   `min(W, anchor_pos)` rows, PARTIAL_WINDOW fewer but not 0, NEED_RESYNC 0, STALE_GENERATION
 *   and RELEASE entries 0;
 * - values: consumed positions have a draft id in `[0, V)`, a confidence in `[0, 1]` and a finite
 *   margin `>= 0`; every other position has draft id, confidence and margin exactly 0 (+0.0).
 * The values are first checked in one pass without building messages; only when that pass fails
 * does a second pass search the first violation ("slot S position P: draft id X outside [0, V)").
 * Allocates nothing proportional to the reply.
 */
export function checkReplyValues(reply: StepReplyViews, ctx: ReplyContext): void {
  if (reply.stepId !== ctx.stepId >>> 0)
    throw badReply(`reply step_id ${reply.stepId} != ${ctx.stepId >>> 0}`);
  const n = entryCount(reply, ctx);
  const N = reply.numSpec;
  if (N !== ctx.numSpec) throw badReply(`reply num_spec ${N} != session num_spec ${ctx.numSpec}`);
  const V = ctx.vocabSize;
  const W = ctx.window;
  const ids = reply.draftIds;
  const conf = reply.confidence;
  const margin = reply.margin;
  if (
    reply.status.length < n ||
    reply.windowRows.length < n ||
    reply.generation.length < n ||
    ids.length < n * N ||
    conf.length < n * N ||
    (margin !== null && margin.length < n * N)
  ) {
    throw badArgument("reply views are shorter than n_req * num_spec");
  }
  for (let i = 0; i < n; i++) {
    const e = ctx.entries[i]!;
    const g = reply.generation[i]!;
    if (g !== e.generation >>> 0)
      throw badReply(`slot ${e.slot}: generation echo ${g} != ${e.generation >>> 0}`);
    const rs = reply.status[i]!;
    if (rs > ReqStatus.DRAFT_FAILED) throw badReply(`slot ${e.slot}: unknown request status ${rs}`);
    const wr = reply.windowRows[i]!;
    const expected = Math.min(W, e.anchorPos);
    if (wr > expected) {
      throw badReply(
        `slot ${e.slot}: window_rows ${wr} > ${expected} readable rows (min(W ${W}, anchor_pos ${e.anchorPos}))`,
      );
    }
    if ((e.flags & EntryFlag.RELEASE) !== 0 || rs === ReqStatus.STALE_GENERATION) {
      if (wr !== 0) {
        const what = rs === ReqStatus.STALE_GENERATION ? "STALE_GENERATION" : "RELEASE";
        throw badReply(`slot ${e.slot}: window_rows ${wr} for a ${what} entry, want 0`);
      }
    } else if (rs === ReqStatus.OK && wr !== expected) {
      throw badReply(`slot ${e.slot}: status OK with window_rows ${wr} != ${expected} (min(W, anchor_pos))`);
    } else if (rs === ReqStatus.PARTIAL_WINDOW && !(wr > 0 && wr < expected)) {
      throw badReply(`slot ${e.slot}: PARTIAL_WINDOW with window_rows ${wr}, want 1..${expected - 1}`);
    } else if (rs === ReqStatus.NEED_RESYNC && wr !== 0) {
      throw badReply(`slot ${e.slot}: NEED_RESYNC with window_rows ${wr}, want 0`);
    }
  }

  // Tails must be +0.0 bit for bit, so they are compared as u32 words.
  const confBits = new Uint32Array(conf.buffer, conf.byteOffset, n * N);
  const marginBits = margin !== null ? new Uint32Array(margin.buffer, margin.byteOffset, n * N) : null;
  let ok = true;
  for (let i = 0; i < n; i++) {
    const e = ctx.entries[i]!;
    const k = consumedPositions(e, reply.status[i]!, N);
    const base = i * N;
    const live = base + k;
    const end = base + N;
    for (let p = base; p < live; p++) {
      const id = ids[p]!;
      const c = conf[p]!;
      if (!(id >= 0 && id < V && c >= 0 && c <= 1)) ok = false;
    }
    for (let p = live; p < end; p++) if ((ids[p]! | confBits[p]!) !== 0) ok = false;
    if (margin !== null && marginBits !== null) {
      for (let p = base; p < live; p++) {
        const m = margin[p]!;
        if (!(m >= 0 && m < Number.POSITIVE_INFINITY)) ok = false;
      }
      for (let p = live; p < end; p++) if (marginBits[p] !== 0) ok = false;
    }
  }
  if (!ok) throw firstValueViolation(reply, ctx, n);
}

function firstValueViolation(reply: StepReplyViews, ctx: ReplyContext, n: number): Error {
  for (let i = 0; i < n; i++) {
    const why = entryDraftProblem(reply, i, ctx);
    if (why !== null) return badReply(why);
  }
  return badReply("reply values violate CONTRACT 6.3"); // unreachable: the two passes agree
}

/** What {@link entryValueProblem} reads of a {@link ReplyContext}. */
export type EntryValueContext = Pick<ReplyContext, "vocabSize" | "entries" | "sampleMeta">;

// CONTRACT 6.3 for entry i: the first violation as "slot S position P: ...", or null.
function entryDraftProblem(reply: StepReplyViews, i: number, ctx: EntryValueContext): string | null {
  const N = reply.numSpec;
  const V = ctx.vocabSize;
  const e = ctx.entries[i]!;
  const rs = reply.status[i]!;
  const k = consumedPositions(e, rs, N);
  const margin = reply.margin;
  for (let j = 0; j < N; j++) {
    const p = i * N + j;
    const id = reply.draftIds[p]!;
    const c = reply.confidence[p]!;
    const m = margin !== null ? margin[p] : undefined;
    if (j < k) {
      if (
        id >= 0 &&
        id < V &&
        c >= 0 &&
        c <= 1 &&
        (m === undefined || (m >= 0 && m < Number.POSITIVE_INFINITY))
      )
        continue;
      const at = `slot ${e.slot} position ${j}`;
      if (!(id >= 0 && id < V)) return `${at}: draft id ${id} outside [0, ${V})`;
      if (!(c >= 0 && c <= 1)) return `${at}: confidence ${fmt(c)} is not a probability in [0, 1]`;
      return `${at}: margin ${fmt(m!)} is not a finite top-1 minus top-2 >= 0`;
    }
    // Exactly +0.0: Object.is tells +0 from -0, and no other float32 bit pattern reads as +0.
    if (id === 0 && Object.is(c, 0) && (m === undefined || Object.is(m, 0))) continue;
    const at = `slot ${e.slot} position ${j}`;
    const why =
      `(n_out ${e.nOut}, status ${reqStatusName(rs)}, need_draft ${(e.flags & EntryFlag.NEED_DRAFT) !== 0}: ` +
      `${k} consumed positions)`;
    if (id !== 0) return `${at}: draft id ${id} where CONTRACT 6.3 requires 0 ${why}`;
    if (!Object.is(c, 0)) return `${at}: confidence ${fmt(c)} where CONTRACT 6.3 requires 0.0 ${why}`;
    return `${at}: margin ${fmt(m!)} where CONTRACT 6.3 requires 0.0 ${why}`;
  }
  return null;
}

// Duplicate detection among at most 32 support ids: an open-addressing set of 64 cells whose
// cells are valid only for the current stamp, so nothing is cleared or allocated per position.
const setKeys = new Int32Array(64);
const setStamp = new Uint32Array(64);
let stamp = 0;

function nextStamp(): void {
  stamp++;
  if (stamp > 0xffffffff) {
    setStamp.fill(0);
    stamp = 1;
  }
}

/** Adds `id` to the current set; false when it was there already. */
function addToSet(id: number): boolean {
  let h = Math.imul(id, 0x9e3779b1) >>> 26;
  while (setStamp[h] === stamp) {
    if (setKeys[h] === id) return false;
    h = (h + 1) & 63;
  }
  setStamp[h] = stamp;
  setKeys[h] = id;
  return true;
}

/**
 * Client checks of the sampled arrays of a STEP reply (CONTRACT 8), throwing `WIRE_BAD_REPLY`
 * naming the first violation. In a greedy session (no `sampleMeta`) a reply carrying SAMPLED or
 * any q is refused. In a TOP32 session a reply without SAMPLED/support/q is refused ("sampled ids
 * without q"); then per entry and position: a consumed position ({@link consumedPositions}) of an
 * entry with `temp_milli > 0` has `sampled_mask` 1, `support_ids[0..top_k)` distinct and in
 * `[0, V)`, `proposal_q[0..top_k)` each `>= 1` summing to exactly 2^24, zeros from `top_k` to 32,
 * and its draft id among the support; every other position (greedy entry, beyond `k`, entry not
 * consumed) has mask 0 and all 32 support ids and q values 0. Call after {@link checkReplyValues}.
 */
export function validateSampled(reply: StepReplyViews, ctx: ReplyContext): void {
  const meta = ctx.sampleMeta ?? null;
  const mask = reply.sampledMask;
  const sup = reply.supportIds;
  const q = reply.proposalQ;
  if (meta === null) {
    if ((reply.replyFlags & ReplyFlag.SAMPLED) !== 0 || mask !== null || sup !== null || q !== null) {
      throw badReply("reply carries SAMPLED (q) in a greedy session");
    }
    return;
  }
  if ((reply.replyFlags & ReplyFlag.SAMPLED) === 0 || mask === null || sup === null || q === null) {
    throw badReply("reply of a TOP32 session lacks SAMPLED/support/q: refusing sampled ids without q");
  }
  const n = entryCount(reply, ctx);
  const N = reply.numSpec;
  if (meta.length < n) throw badArgument(`sampleMeta has ${meta.length} records for ${n} entries`);
  if (mask.length < n * N || sup.length < n * N * TOP_K_MAX || q.length < n * N * TOP_K_MAX) {
    throw badArgument("sampled views are shorter than n_req * num_spec");
  }
  for (let i = 0; i < n; i++) {
    const topK = meta[i]!.topK;
    if (!isIntIn(topK, 1, TOP_K_MAX)) {
      throw badArgument(`sampleMeta[${i}].topK ${topK} outside 1..32`);
    }
    const why = entrySampledProblem(reply, i, ctx);
    if (why !== null) throw badReply(why);
  }
}

// CONTRACT 8 for entry i of a TOP32 reply (views and meta checked present): the first violation,
// or null.
function entrySampledProblem(reply: StepReplyViews, i: number, ctx: EntryValueContext): string | null {
  const mask = reply.sampledMask!;
  const sup = reply.supportIds!;
  const q = reply.proposalQ!;
  const N = reply.numSpec;
  const V = ctx.vocabSize;
  const e = ctx.entries[i]!;
  const m = ctx.sampleMeta![i]!;
  const topK = m.topK;
  const k = m.tempMilli > 0 ? consumedPositions(e, reply.status[i]!, N) : 0;
  for (let j = 0; j < N; j++) {
    const p = i * N + j;
    const sb = p * TOP_K_MAX;
    const mk = mask[p]!;
    if (j >= k) {
      let bad = mk;
      for (let t = 0; t < TOP_K_MAX; t++) bad |= sup[sb + t]! | q[sb + t]!;
      if (bad !== 0) return nonSampledViolation(e, j, k, m, mk, sup, q, sb);
      continue;
    }
    const at = `slot ${e.slot} position ${j}`;
    if (mk !== 1) return `${at}: sampled_mask ${mk}, want 1 for a sampled position`;
    const draft = reply.draftIds[p]!;
    nextStamp();
    let sum = 0;
    let found = false;
    for (let t = 0; t < topK; t++) {
      const id = sup[sb + t]!;
      if (!(id >= 0 && id < V)) return `${at}: support id ${id} at index ${t} outside [0, ${V})`;
      if (!addToSet(id)) return `${at}: support id ${id} at index ${t} repeats an earlier one`;
      const qt = q[sb + t]!;
      if (qt < 1) return `${at}: proposal_q ${qt} at index ${t} is below 1`;
      sum += qt;
      if (id === draft) found = true;
    }
    if (sum !== DYADIC_ONE)
      return `${at}: proposal_q sums to ${sum} over top_k ${topK}, not 2^24 = ${DYADIC_ONE}`;
    for (let t = topK; t < TOP_K_MAX; t++) {
      if (sup[sb + t] !== 0)
        return `${at}: support id ${sup[sb + t]} at index ${t} >= top_k ${topK} (must be 0)`;
      if (q[sb + t] !== 0) return `${at}: proposal_q ${q[sb + t]} at index ${t} >= top_k ${topK} (must be 0)`;
    }
    if (!found) return `${at}: draft id ${draft} is not in the support`;
  }
  return null;
}

/**
 * The first violation of CONTRACT 6.3 (and, in a TOP32 reply, 8) by the values of entry `i` of a
 * STEP reply, as "slot S position P: ...", or null when its values are valid. The entry's
 * consumed positions come from its request entry and the reply's request status
 * ({@link consumedPositions}). The one per-entry rule behind {@link checkReplyValues} and
 * {@link validateSampled} (which throw it, first entry first), and what a worker calls to mark
 * an entry DRAFT_FAILED instead of sending values a client would refuse. The sampled part is
 * checked when the reply has SAMPLED views and `ctx.sampleMeta` is given (with a `topK` in 1..32
 * for entry `i`). Never throws for views and context of matching sizes; allocates nothing
 * unless it finds a violation.
 */
export function entryValueProblem(reply: StepReplyViews, i: number, ctx: EntryValueContext): string | null {
  const why = entryDraftProblem(reply, i, ctx);
  if (why !== null) return why;
  if (reply.sampledMask === null || reply.supportIds === null || reply.proposalQ === null) return null;
  if (ctx.sampleMeta === null || ctx.sampleMeta === undefined) return null;
  return entrySampledProblem(reply, i, ctx);
}

function nonSampledViolation(
  e: CtxEntry,
  j: number,
  k: number,
  m: SampleMeta,
  mk: number,
  sup: Int32Array,
  q: Uint32Array,
  sb: number,
): string {
  const at = `slot ${e.slot} position ${j}`;
  const what = m.tempMilli === 0 ? "a greedy entry (temp_milli 0)" : `a position not consumed (k ${k})`;
  if (mk !== 0) return `${at}: sampled_mask ${mk} on ${what}, want 0`;
  for (let t = 0; t < TOP_K_MAX; t++) {
    if (sup[sb + t] !== 0) return `${at}: support id ${sup[sb + t]} at index ${t} on ${what}, want 0`;
    if (q[sb + t] !== 0) return `${at}: proposal_q ${q[sb + t]} at index ${t} on ${what}, want 0`;
  }
  return `${at}: sampled values on ${what}`;
}
