// WorkerPool (CONTRACT 12.2): one RemoteDraftClient per member, each slot assigned to one ready
// member at a time, one STEP per member per round sent concurrently, each STEP's outcome applied
// to its own entries. RoundCore talks to it through DraftLink exactly as it talks to one client:
// `slotEpoch` is where a slot is (re)assigned at the start of a round, and a slot's epoch token
// changes whenever its member or that member's connection changes, so RoundCore resyncs it with
// its whole ring (7.5). Membership (sources, drain, removal) lives in this file too because it
// moves the same per-slot assignment arrays.
import { randomInt } from "node:crypto";
import type { Counter, Gauge } from "@tapwire/stats";
import { Registry } from "@tapwire/stats";
import type { ReqEntry, SampleMeta, StepReplyViews } from "@tapwire/wire";
import { APP_HEADER_SIZE, EntryFlag, maxStepBodySize, ReqStatus, rowsOffsetFor } from "@tapwire/wire";
import type { Logger } from "pino";
import { pino } from "pino";
import type { StepCall } from "./client.js";
import { RemoteDraftClient } from "./client.js";
import { ClientError } from "./errors.js";
import type { MemberSource, PoolMemberInfo } from "./members.js";
import { compatProblem, staticMembers } from "./members.js";
import type { RemoteDraftClientOptions, ResolvedClientOptions } from "./options.js";
import { resolveOptions } from "./options.js";
import type { StepOutcome, StepOutcomeReason } from "./outcomes.js";
import { errText, NOT_READY, RECONNECTED } from "./outcomes.js";
import type { DraftLink } from "./round-types.js";

/** Options of {@link WorkerPool}: those of {@link RemoteDraftClient} for every member, plus the members. */
export interface WorkerPoolOptions
  extends Omit<RemoteDraftClientOptions, "endpoint" | "registry" | "autoStart"> {
  /** A static list of endpoints, or a {@link MemberSource} (discovery). */
  members: readonly string[] | MemberSource;
  /** The pool's stats registry (default a new one with prefix `tapwire_pool_`); each member has its own. */
  registry?: Registry;
  /** Failover gaps kept for {@link WorkerPool.failoverRounds} (default 4096, the oldest dropped). */
  maxFailoverSamples?: number;
}

/** One member as {@link WorkerPool.members} reports it. */
export interface PoolMemberStats {
  /** The member's endpoint (its key). */
  readonly endpoint: string;
  /** The incarnation its source last reported, or null. */
  readonly incarnation: string | null;
  /** The member client's connection state (CONTRACT 9.1). */
  readonly state: string;
  /** True while the member is no longer listed by its source and its slots move away. */
  readonly draining: boolean;
  /** Slots assigned to it now. */
  readonly assigned: number;
  /** STEPs sent to it. */
  readonly steps: number;
  /** STEPs answered OK. */
  readonly stepsOk: number;
  /** STEPs with any other outcome (CONTRACT 9.2). */
  readonly stepsFailed: number;
  /** Entries carried by its STEPs (RELEASE included). */
  readonly entries: number;
  /** Slots moved away from it because it was not ready, drained or gone (failovers). */
  readonly failoversOut: number;
  /** RELEASEs sent to it for slots that moved elsewhere while it held them. */
  readonly movedReleases: number;
  /** Successful HELLOs of its client (its epoch). */
  readonly epoch: number;
  /**
   * Smoothed RTT of its answered STEPs in µs (gain 1/8 per STEP, RFC 6298's SRTT; timeouts and
   * other failures do not feed it), 0 before the first.
   */
  readonly rttUs: number;
  /** Why its client is disabled, or null. */
  readonly disabledReason: string | null;
  /** Its client's last error, or null. */
  readonly lastError: string | null;
}

// a RELEASE the pool answers itself (its member is not ready): ok, nothing sent
const LOCAL_OK: StepOutcome = Object.freeze({ ...NOT_READY, ok: true, reason: "ok" as const });
const RELEASE_META: SampleMeta = Object.freeze({ seed: 0, topK: 1, tempMilli: 0 });
/**
 * Weight of a new STEP RTT in a member's smoothed RTT: 1/8, the SRTT gain of RFC 6298 (TCP).
 * Only answered STEPs feed it (a timeout measures the timeout, not the member: Karn's rule).
 */
const RTT_GAIN = 0.125;

// The round's outcome, one per pool and reused (like the merged reply, valid until the next step).
class PoolOutcome implements StepOutcome {
  ok = false;
  reason: StepOutcomeReason = "not_ready";
  unknownApply = false;
  rttUs = 0;
  reply: StepReplyViews | null = null;
  error: string | null = null;
  perEntry: StepOutcome[];
  constructor(perEntry: StepOutcome[]) {
    this.perEntry = perEntry;
  }
}

class Member {
  readonly endpoint: string;
  readonly client: RemoteDraftClient;
  incarnation: string | null;
  draining = false;
  removed = false;
  assigned = 0;
  /** The client epoch whose HELLO the pool has looked at (windows kept or not). */
  seenEpoch = 0;
  /** Round of the first failed STEP since the last OK one, or -1. */
  failedSince = -1;
  /** Per slot, the generation last sent (the worker may hold a window for it), or -1. */
  readonly sentGen: Float64Array;
  /** Per slot, the generation of a slot that moved away while it may hold its window (RELEASE when it is back), or -1. */
  readonly movedGen: Float64Array;
  /** Slots with `movedGen >= 0`. */
  nMoved = 0;
  /** Smoothed RTT of its answered STEPs, µs (0 before the first). */
  rttUs = 0;
  /** The STEP sent this round, awaited after every member's STEP is out. */
  pending: Promise<StepOutcome> | null = null;
  // the STEP being built this round
  readonly entries: ReqEntry[] = [];
  readonly meta: SampleMeta[] = [];
  readonly parts: Uint8Array[] = [];
  index = new Int32Array(0);
  readonly releases: ReqEntry[] = [];
  n = 0;
  /** Entries of the round's call routed to it (`n` without the RELEASEs the pool added). */
  routed = 0;
  /** Its STEP's reply this round (views into its client's reply buffer), or null. */
  lastReply: StepReplyViews | null = null;
  nRows = 0;
  np = 0;
  readonly call: StepCall;
  steps = 0;
  stepsOk = 0;
  stepsFailed = 0;
  entriesSent = 0;
  failoversOut = 0;
  movedReleases = 0;
  constructor(endpoint: string, incarnation: string | null, client: RemoteDraftClient, maxSlots: number) {
    this.endpoint = endpoint;
    this.incarnation = incarnation;
    this.client = client;
    this.index = new Int32Array(maxSlots);
    this.sentGen = new Float64Array(maxSlots).fill(-1);
    this.movedGen = new Float64Array(maxSlots).fill(-1);
    this.call = {
      stepId: 0,
      entries: this.entries,
      nEntries: 0,
      nRows: 0,
      sampleMeta: null,
      epoch: 0,
      rows: this.parts,
    };
  }
  /** Ready, not draining, not removed: may take slots this round. */
  servable(): boolean {
    return !this.removed && !this.draining && this.client.ready;
  }
  /** `slot` leaves it: a window it may hold is remembered for a RELEASE when it is back. */
  moveAway(slot: number): void {
    const g = this.sentGen[slot]!;
    if (g < 0) return;
    this.sentGen[slot] = -1;
    if (this.movedGen[slot]! < 0) this.nMoved++;
    this.movedGen[slot] = g;
  }
  /** `slot` needs no RELEASE here any more (released, or resynced here). */
  dropMoved(slot: number): void {
    if (this.movedGen[slot]! < 0) return;
    this.movedGen[slot] = -1;
    this.nMoved--;
  }
  /** It holds no window of ours (a new session). */
  forgetWindows(): void {
    this.sentGen.fill(-1);
    this.movedGen.fill(-1);
    this.nMoved = 0;
  }
  /** An answered STEP's RTT (CONTRACT 9.2 `ok`): the smoothed RTT moves by {@link RTT_GAIN}. */
  observeRtt(us: number): void {
    if (!(us > 0) || !Number.isFinite(us)) return;
    this.rttUs = this.rttUs === 0 ? us : this.rttUs + RTT_GAIN * (us - this.rttUs);
  }
}

class MergedReply implements StepReplyViews {
  stepId = 0;
  nReq = 0;
  numSpec: number;
  replyFlags = 0;
  workerUs = 0;
  status: Uint8Array;
  windowRows: Uint16Array;
  generation: Uint32Array;
  draftIds: Int32Array;
  confidence: Float32Array;
  margin: Float32Array | null;
  sampledMask: Uint8Array | null;
  supportIds: Int32Array | null;
  proposalQ: Uint32Array | null;
  constructor(n: number, N: number, margin: boolean, sampled: boolean) {
    this.numSpec = N;
    this.status = new Uint8Array(n);
    this.windowRows = new Uint16Array(n);
    this.generation = new Uint32Array(n);
    this.draftIds = new Int32Array(n * N);
    this.confidence = new Float32Array(n * N);
    this.margin = margin ? new Float32Array(n * N) : null;
    this.sampledMask = sampled ? new Uint8Array(n * N) : null;
    this.supportIds = sampled ? new Int32Array(n * N * 32) : null;
    this.proposalQ = sampled ? new Uint32Array(n * N * 32) : null;
  }
  // entry j of `r` becomes entry k; element loops (N is small: subarray() would allocate a
  // view per array per entry, the pool's largest per-round cost when it did)
  copyFrom(r: StepReplyViews, j: number, k: number): void {
    const N = this.numSpec;
    this.status[k] = r.status[j]!;
    this.windowRows[k] = r.windowRows[j]!;
    this.generation[k] = r.generation[j]!;
    const s = j * N;
    const d = k * N;
    const ids = this.draftIds;
    const conf = this.confidence;
    const rIds = r.draftIds;
    const rConf = r.confidence;
    for (let i = 0; i < N; i++) {
      ids[d + i] = rIds[s + i]!;
      conf[d + i] = rConf[s + i]!;
    }
    const mg = this.margin;
    const rMg = r.margin;
    if (mg !== null && rMg !== null) for (let i = 0; i < N; i++) mg[d + i] = rMg[s + i]!;
    if (this.sampledMask !== null && r.sampledMask !== null) {
      const sm = this.sampledMask;
      const rSm = r.sampledMask;
      for (let i = 0; i < N; i++) sm[d + i] = rSm[s + i]!;
      const sup = this.supportIds!;
      const q = this.proposalQ!;
      const rSup = r.supportIds!;
      const rQ = r.proposalQ!;
      const s32 = s * 32;
      const d32 = d * 32;
      for (let i = 0; i < N * 32; i++) {
        sup[d32 + i] = rSup[s32 + i]!;
        q[d32 + i] = rQ[s32 + i]!;
      }
    }
  }
  // a RELEASE the pool answered itself: OK, no window (CONTRACT 7.2 step 4)
  released(k: number, generation: number): void {
    this.status[k] = ReqStatus.OK;
    this.windowRows[k] = 0;
    this.generation[k] = generation;
  }
}

function hexOf(b: Uint8Array): string {
  return Buffer.from(b).toString("hex");
}

/**
 * A pool of drafter workers on rank 0 (CONTRACT 12.2), a {@link DraftLink} like
 * {@link RemoteDraftClient}: give it to `RoundCore` in place of a client.
 *
 * - One {@link RemoteDraftClient} per member (its own connection, HELLO, seq, epoch and backoff);
 *   the session id is the process's, the same at every member.
 * - Each slot is assigned to one ready member at a time; a new slot goes to the ready member with
 *   the fewest slots. A slot whose member is not ready at the start of a round (or is draining,
 *   or left the pool) is reassigned in that round and resyncs with its whole ring (7.5).
 * - A member that comes back holding windows (same session, `windows_kept > 0`) gets RELEASE for
 *   the slots that moved away from it; one that comes back with a new session lost them anyway.
 * - A round sends one STEP per member with entries, all at once; each is awaited within the
 *   request timeout, and its 9.2 outcome applies to its own entries only.
 * - A member disabled by a fatal status (9.3) leaves the pool; the pool is disabled only when no
 *   member can ever serve (every member of a static list disabled). A member its source no longer
 *   lists is drained: no new slots, its slots move at the next round, then it is closed.
 */
export class WorkerPool implements DraftLink {
  /** The validated options every member uses (`endpoint` is a placeholder). */
  readonly options: ResolvedClientOptions;
  /** The pool's stats registry (prefix `tapwire_pool_`). */
  readonly registry: Registry;
  /** The pool's send buffer (rows staged in `"stage"` mode; split per member without a copy). */
  readonly sendBuffer: Uint8Array;

  readonly #memberOptions: RemoteDraftClientOptions;
  readonly #log: Logger;
  readonly #source: MemberSource;
  readonly #members = new Map<string, Member>();
  /** The members of `#members` in insertion order: what the per-round loops walk (no iterator). */
  readonly #list: Member[] = [];
  /** Endpoints disabled by a fatal status, with the incarnation that was refused. */
  readonly #refused = new Map<string, string | null>();
  readonly #ignoredLogged = new Set<string>();
  readonly #slotMember: (Member | null)[];
  readonly #slotMemberEpoch: Float64Array;
  readonly #slotToken: Float64Array;
  /** Round a moved slot's failover started (its old member's first failed STEP), or -1. */
  readonly #slotFailStart: Float64Array;
  /** Per entry position, its view of `sendBuffer` in `"stage"` mode (made again only when it moves). */
  readonly #stageViews: Uint8Array[] = [];
  readonly #perEntry: StepOutcome[] = [];
  readonly #merged: MergedReply;
  readonly #out: PoolOutcome;
  readonly #own: {
    drafterIdentity: string;
    markovIdentity: string;
    window: number;
    numSpec: number;
    vocabSize: number;
    rowBytes: number;
    sampleMode: string;
  };
  readonly #failovers: number[] = [];
  readonly #maxFailoverSamples: number;
  readonly #unsubscribe: () => void;
  #session: number;
  #tokens = 0;
  #round = 0;
  #closed = false;
  #sending: Member[] = [];
  readonly #c: {
    failovers: Counter;
    movedReleases: Counter;
    localReleases: Counter;
    memberSteps: Counter;
    memberStepsFailed: Counter;
    ignored: Counter;
    members: Gauge;
    membersReady: Gauge;
  };

  /** @throws ClientError `CLIENT_BAD_OPTION` naming the first bad option. */
  constructor(options: WorkerPoolOptions) {
    if (options === null || typeof options !== "object") {
      throw new ClientError("CLIENT_BAD_OPTION", "options must be an object");
    }
    const { members, registry, maxFailoverSamples, ...rest } = options;
    // every member option is checked once here, with a placeholder endpoint
    const o = resolveOptions({ ...rest, endpoint: "tcp://pool.invalid:1" } as RemoteDraftClientOptions);
    this.options = o;
    this.#session = o.sessionId;
    const src: MemberSource | null = Array.isArray(members)
      ? staticMembers(members as readonly string[])
      : ((members as MemberSource | undefined) ?? null);
    if (src === null || typeof src !== "object" || typeof src.subscribe !== "function") {
      throw new ClientError(
        "CLIENT_BAD_OPTION",
        "members must be a non-empty list of endpoints or a MemberSource",
      );
    }
    this.#source = src;
    if (registry !== undefined && (registry === null || typeof registry.counter !== "function")) {
      throw new ClientError("CLIENT_BAD_OPTION", "registry must be a @tapwire/stats Registry");
    }
    const mfs = maxFailoverSamples ?? 4096;
    if (!Number.isInteger(mfs) || mfs < 1) {
      throw new ClientError(
        "CLIENT_BAD_OPTION",
        `maxFailoverSamples must be a positive integer, got ${String(mfs)}`,
      );
    }
    this.#maxFailoverSamples = mfs;
    this.#memberOptions = { ...(rest as Omit<RemoteDraftClientOptions, "endpoint">), endpoint: "" };
    this.#log = options.logger ?? pino({ level: "silent" });
    this.registry = registry ?? new Registry({ prefix: "tapwire_pool_" });
    const r = this.registry;
    this.#c = {
      failovers: r.counter(
        "failovers",
        "slots moved from a member that was not ready, drained or gone (CONTRACT 12.2)",
      ),
      movedReleases: r.counter(
        "moved_releases",
        "RELEASEs sent to a returning member for slots that moved away",
      ),
      localReleases: r.counter(
        "local_releases",
        "RELEASEs answered by the pool (the slot's member was not ready)",
      ),
      memberSteps: r.counter("member_steps", "STEPs sent to members"),
      memberStepsFailed: r.counter("member_steps_failed", "member STEPs with an outcome other than ok"),
      ignored: r.counter(
        "members_ignored",
        "member records ignored: identities or geometry differ from the HELLO",
      ),
      members: r.gauge("members", "members in the pool"),
      membersReady: r.gauge("members_ready", "members with a ready connection"),
    };
    const n = o.maxSlots;
    this.#slotMember = new Array<Member | null>(n).fill(null);
    this.#slotMemberEpoch = new Float64Array(this.#slotMember.length);
    this.#slotToken = new Float64Array(this.#slotMember.length);
    this.#slotFailStart = new Float64Array(this.#slotMember.length).fill(-1);
    this.#merged = new MergedReply(n, o.numSpec, o.wantMargin, o.sampled);
    this.#out = new PoolOutcome(this.#perEntry);
    this.sendBuffer = Buffer.alloc(
      APP_HEADER_SIZE +
        maxStepBodySize({
          sampled: o.sampled,
          rowBytes: o.rowBytes,
          maxSlots: o.maxSlots,
          maxRowsPerStep: o.maxRowsPerStep,
          numSpec: o.numSpec,
        }),
    );
    this.#own = {
      drafterIdentity: hexOf(o.drafterIdentity),
      markovIdentity: hexOf(o.markovIdentity),
      window: o.window,
      numSpec: o.numSpec,
      vocabSize: o.vocabSize,
      rowBytes: o.rowBytes,
      sampleMode: o.sampleMode,
    };
    this.#unsubscribe = src.subscribe((list) => {
      try {
        this.#onMembers(list);
      } catch (e) {
        this.#log.error({ err: errText(e) }, `tapwire pool: member list refused: ${errText(e)}`);
      }
    });
  }

  // ------------------------------------------------------------------ membership

  #onMembers(list: readonly PoolMemberInfo[]): void {
    if (this.#closed) return;
    const seen = new Set<string>();
    for (const info of list) {
      const ep = info?.endpoint;
      if (typeof ep !== "string" || !/^(tcp|unix|tls|zmq\+tcp|zmq\+ipc|shm\+unix):\/\/./.test(ep)) continue;
      const inc = typeof info.incarnation === "string" ? info.incarnation : null;
      const problem = compatProblem(info.compat, this.#own);
      if (problem !== null) {
        const key = `${ep} ${inc ?? ""}`;
        if (!this.#ignoredLogged.has(key)) {
          this.#ignoredLogged.add(key);
          this.#c.ignored.inc();
          this.#log.warn(
            { endpoint: ep, incarnation: inc, problem },
            `tapwire pool: member ${ep} ignored: ${problem} differs from this pool's HELLO (CONTRACT 12.2)`,
          );
        }
        continue;
      }
      if (seen.has(ep)) continue; // an older record of a restarted server: one member per endpoint
      seen.add(ep);
      if (this.#refused.has(ep)) {
        if (this.#refused.get(ep) === inc || inc === null) continue;
        this.#refused.delete(ep); // a new process at that endpoint: try again
      }
      const m = this.#members.get(ep);
      if (m === undefined) {
        this.#addMember(ep, inc);
        continue;
      }
      if (inc !== null && m.incarnation !== inc) {
        this.#log.info(
          { endpoint: ep, incarnation: inc, previous: m.incarnation },
          `tapwire pool: member ${ep} has a new incarnation ${inc}`,
        );
        m.incarnation = inc;
      }
      if (m.draining) {
        m.draining = false;
        this.#log.info({ endpoint: ep }, `tapwire pool: member ${ep} listed again; no longer draining`);
      }
    }
    for (const m of this.#members.values()) {
      if (!seen.has(m.endpoint) && !m.draining) {
        m.draining = true;
        this.#log.info(
          { endpoint: m.endpoint, assigned: m.assigned },
          `tapwire pool: member ${m.endpoint} left discovery; draining (its slots move at the next round)`,
        );
      }
    }
    this.#c.members.set(this.#members.size);
  }

  #addMember(endpoint: string, incarnation: string | null): void {
    const client = new RemoteDraftClient({
      ...this.#memberOptions,
      endpoint,
      sessionId: this.#session,
      logger: this.#log.child({ member: endpoint }),
      autoStart: true,
    });
    const m = new Member(endpoint, incarnation, client, this.#slotMember.length);
    this.#members.set(endpoint, m);
    this.#list.push(m);
    this.#log.info({ endpoint, incarnation }, `tapwire pool: member ${endpoint} added`);
  }

  #removeMember(m: Member, why: string): void {
    if (m.removed) return;
    m.removed = true;
    this.#members.delete(m.endpoint);
    this.#list.splice(this.#list.indexOf(m), 1);
    this.#unassignAll(m);
    this.#log.info({ endpoint: m.endpoint, why }, `tapwire pool: member ${m.endpoint} left the pool: ${why}`);
    m.client.close().catch(() => {});
    this.#c.members.set(this.#members.size);
  }

  // every slot of `m` loses its member (it moves at its next slotEpoch)
  #unassignAll(m: Member): void {
    if (m.assigned === 0) return;
    const sm = this.#slotMember;
    for (let s = 0; s < sm.length; s++) if (sm[s] === m) this.#unassign(s, m);
  }

  // failover: the member could not keep it (not ready, drained, gone); else a new request placed anew
  #unassign(slot: number, m: Member, failover = true): void {
    this.#slotMember[slot] = null;
    m.assigned--;
    m.moveAway(slot);
    if (!failover) return;
    m.failoversOut++;
    this.#c.failovers.inc();
    // the gap runs from the old member's first failed STEP (or now, for a drained member)
    this.#slotFailStart[slot] = m.failedSince >= 0 ? m.failedSince : this.#round;
  }

  // start of a round: look at new HELLOs, drop members that can never serve, finish drains
  #refresh(): void {
    let ready = 0;
    const list = this.#list;
    // backwards: a member removed here leaves the list
    for (let i = list.length - 1; i >= 0; i--) {
      const m = list[i]!;
      const c = m.client;
      if (c.disabled) {
        this.#refused.set(m.endpoint, m.incarnation);
        this.#removeMember(m, `disabled: ${c.disabledReason}`);
        continue;
      }
      if (c.ready && c.epoch !== m.seenEpoch) {
        m.seenEpoch = c.epoch;
        m.failedSince = -1; // back: a later move starts a new failover episode
        // a HELLO that kept no window: the worker holds nothing of the slots that moved (CONTRACT 6.2)
        if ((c.workerInfo?.windowsKept ?? 0) === 0) m.forgetWindows();
      }
      if (m.draining) {
        this.#unassignAll(m);
        if (m.nMoved === 0 || !c.ready) this.#removeMember(m, "drained");
        continue;
      }
      if (c.ready) ready++;
    }
    this.#c.membersReady.set(ready);
  }

  #pick(): Member | null {
    let best: Member | null = null;
    const list = this.#list;
    for (let i = 0; i < list.length; i++) {
      const m = list[i]!;
      if (m.servable() && (best === null || m.assigned < best.assigned)) best = m;
    }
    return best;
  }

  // ------------------------------------------------------------------ DraftLink

  /** True when no member can ever serve (a static list whose members are all disabled) or after close. */
  get disabled(): boolean {
    if (this.#closed) return true;
    if (this.#source.dynamic) return false;
    for (const m of this.#members.values()) if (!m.client.disabled) return false;
    return true;
  }

  /** Why the pool is disabled: the members' reasons, or null. */
  get disabledReason(): string | null {
    if (!this.disabled) return null;
    if (this.#closed) return "pool closed";
    const reasons = [...this.#refused.keys()].map((e) => e);
    return `every member left the pool (${reasons.join(", ") || "none listed"})`;
  }

  /** The process's session id, the same at every member (CONTRACT 12.2). */
  get sessionId(): number {
    return this.#session;
  }

  /** True when at least one member has a ready connection. */
  get ready(): boolean {
    for (const m of this.#members.values()) if (m.servable()) return true;
    return false;
  }

  /**
   * The start of a round: a number (the members' HELLOs so far) while any member can take slots,
   * else null (the round is target-only).
   */
  connectionEpoch(): number | null {
    this.#refresh();
    let sum = 0;
    let any = false;
    const list = this.#list;
    for (let i = 0; i < list.length; i++) {
      const m = list[i]!;
      sum += m.client.epoch;
      if (m.servable()) any = true;
    }
    return any ? sum : null;
  }

  /**
   * Assigns `slot` for this round (CONTRACT 12.2) and returns its epoch token: unchanged while
   * the slot stays with the same ready member on the same connection, new (RoundCore resyncs)
   * when it moves or its member reconnected, null when no member is ready. A `fresh` slot (a new
   * request took it) moves to the member with the fewest slots when its own has at least 2 more.
   */
  slotEpoch(slot: number, fresh = false): number | null {
    let cur = this.#slotMember[slot] ?? null;
    // a new request is no failover still in progress (a move below starts a new one)
    if (fresh) this.#slotFailStart[slot] = -1;
    if (fresh && cur?.servable()) {
      // a new request in the slot is a new slot: the ready member with the fewest slots takes it
      const best = this.#pick();
      if (best !== null && best !== cur && best.assigned < cur.assigned - 1) {
        this.#unassign(slot, cur, false);
        cur = null;
      }
    }
    if (cur?.servable()) {
      const ep = cur.client.epoch;
      if (ep !== this.#slotMemberEpoch[slot]) {
        this.#slotMemberEpoch[slot] = ep;
        this.#slotToken[slot] = ++this.#tokens;
      }
      return this.#slotToken[slot]!;
    }
    if (cur !== null) this.#unassign(slot, cur);
    const next = this.#pick();
    if (next === null) return null;
    this.#slotMember[slot] = next;
    next.assigned++;
    next.dropMoved(slot); // its RESYNC replaces whatever window it still held
    this.#slotMemberEpoch[slot] = next.client.epoch;
    this.#slotToken[slot] = ++this.#tokens;
    return this.#slotToken[slot]!;
  }

  /** Offset in {@link sendBuffer} where the rows of a round with `nEntries` entries start. */
  rowsOffset(nEntries: number): number {
    return APP_HEADER_SIZE + rowsOffsetFor(nEntries, this.options.sampled);
  }

  /**
   * One round: the entries go to their slots' members, one STEP per member, all at once; each
   * outcome (CONTRACT 9.2) is the `perEntry` outcome of its own entries. The result is ok when
   * any member's STEP was; its reply holds the entries of the ok STEPs in `call` order. The
   * result, its reply and `perEntry` are the pool's own, reused: valid until the next `step`.
   *
   * Per round nothing is allocated by the pool itself: entries, rows (views of the caller's
   * parts, or of `sendBuffer` made once per entry position), replies and outcomes live in
   * buffers sized once; every member's STEP is written before any is awaited. When one member
   * carries every entry (a pool of 1, or every other member idle) its reply is the round's reply
   * as it is; otherwise the members' replies are merged by copy into one reply in `call` order.
   *
   * @throws ClientError `CLIENT_BAD_ARGUMENT` when the call is malformed (rows that do not add up).
   */
  async step(call: StepCall): Promise<StepOutcome> {
    this.#round++;
    const n = call.nEntries ?? call.entries.length;
    const per = this.#perEntry;
    per.length = n;
    const merged = this.#merged;
    merged.stepId = call.stepId;
    merged.nReq = n;
    merged.replyFlags = 0;
    const anyLocal = this.#route(call, n);
    const sending = this.#sending;
    this.#addReleases(sending);
    // one member carries every entry, in call order, and nothing else: its reply is the round's
    // as it is (a view, no merge copy)
    const whole = sending.length === 1 && sending[0]!.routed === n && sending[0]!.n === n;
    // one STEP per member, all written before any is awaited, each bounded by the request timeout
    const sampled = this.options.sampled;
    for (let x = 0; x < sending.length; x++) {
      const m = sending[x]!;
      const c = m.call;
      c.stepId = call.stepId;
      c.nEntries = m.n;
      c.nRows = m.nRows;
      c.sampleMeta = sampled ? m.meta : null;
      c.epoch = m.client.epoch;
      if (m.parts.length !== m.np) m.parts.length = m.np;
      m.steps++;
      m.entriesSent += m.n;
      this.#c.memberSteps.inc();
      m.pending = m.client.step(c);
    }
    const out = this.#out;
    out.rttUs = 0;
    out.unknownApply = false;
    let anyOk = anyLocal;
    let firstFail: StepOutcome | null = null;
    for (let x = 0; x < sending.length; x++) {
      const m = sending[x]!;
      const o = await m.pending!;
      m.pending = null;
      if (o.rttUs > out.rttUs) out.rttUs = o.rttUs;
      m.lastReply = o.reply;
      if (o.ok) {
        m.stepsOk++;
        m.failedSince = -1;
        m.observeRtt(o.rttUs);
        anyOk = true;
      } else {
        m.stepsFailed++;
        this.#c.memberStepsFailed.inc();
        if (m.failedSince < 0) m.failedSince = this.#round;
        firstFail ??= o;
        if (o.unknownApply) out.unknownApply = true;
      }
      this.#apply(call, m, o, !whole);
    }
    if (anyOk) {
      out.ok = true;
      out.reason = "ok";
      out.unknownApply = false;
      out.reply = whole ? sending[0]!.lastReply : merged;
      out.error = null;
      return out;
    }
    const f = firstFail ?? per[0] ?? NOT_READY;
    out.ok = false;
    out.reason = f.reason;
    out.reply = null;
    out.error = f.error;
    return out;
  }

  // entries (and their rows) to their slots' members; entries with no member to go to get their
  // outcome here. True when a RELEASE was answered by the pool itself (ok).
  #route(call: StepCall, n: number): boolean {
    const list = this.#list;
    for (let i = 0; i < list.length; i++) {
      const m = list[i]!;
      m.n = 0;
      m.routed = 0;
      m.nRows = 0;
      m.np = 0;
    }
    const rb = this.options.rowBytes;
    const sampled = this.options.sampled;
    const per = this.#perEntry;
    const merged = this.#merged;
    // rows: the caller's parts, or what it staged in sendBuffer
    const rows = call.rows;
    const stageViews = this.#stageViews;
    let pi = 0;
    let po = 0;
    let stageOff = this.rowsOffset(n);
    let anyLocal = false;
    for (let k = 0; k < n; k++) {
      const en = call.entries[k]!;
      const slot = en.slot;
      const bytes = en.nRows * rb;
      const m = this.#slotMember[slot] ?? null;
      let dest: Member | null = null;
      if ((en.flags & EntryFlag.RELEASE) !== 0) {
        if (m?.client.ready && !m.removed) dest = m;
        else {
          // nobody to tell: the pool answers it; a member that comes back gets it (moved)
          if (m !== null) {
            this.#slotMember[slot] = null;
            m.assigned--;
            m.moveAway(slot);
          }
          this.#c.localReleases.inc();
          merged.released(k, en.generation);
          per[k] = LOCAL_OK;
          anyLocal = true;
        }
      } else if (m === null || !m.client.ready || m.removed) {
        per[k] = NOT_READY;
      } else if (m.client.epoch !== this.#slotMemberEpoch[slot]) {
        per[k] = RECONNECTED; // built for an older connection of the member (CONTRACT 7.5)
      } else dest = m;
      // the entry's rows, routed to its member or skipped
      if (rows !== undefined) {
        let left = bytes;
        while (left > 0) {
          const part = rows[pi];
          if (part === undefined)
            throw new ClientError("CLIENT_BAD_ARGUMENT", "rows hold fewer bytes than the entries' nRows");
          const avail = part.length - po;
          const take = Math.min(avail, left);
          if (dest !== null)
            dest.parts[dest.np++] = po === 0 && take === part.length ? part : part.subarray(po, po + take);
          left -= take;
          po += take;
          if (po === part.length) {
            pi++;
            po = 0;
          }
        }
      } else if (bytes > 0) {
        if (dest !== null) {
          // the view of entry position k is made again only when the round's shape moved it
          let v = stageViews[k];
          if (
            v === undefined ||
            v.byteOffset !== this.sendBuffer.byteOffset + stageOff ||
            v.length !== bytes
          ) {
            v = this.sendBuffer.subarray(stageOff, stageOff + bytes);
            stageViews[k] = v;
          }
          dest.parts[dest.np++] = v;
        }
        stageOff += bytes;
      }
      if (dest === null) continue;
      dest.routed++;
      const j = dest.n++;
      dest.entries[j] = en;
      if (sampled) dest.meta[j] = call.sampleMeta![k]!;
      dest.index[j] = k;
      dest.nRows += en.nRows;
      if ((en.flags & EntryFlag.RELEASE) === 0) dest.sentGen[slot] = en.generation;
    }
    return anyLocal;
  }

  // RELEASE for slots that moved away from a member that is back with their windows (12.2);
  // fills `sending` with the members that have entries
  #addReleases(sending: Member[]): void {
    sending.length = 0;
    const sampled = this.options.sampled;
    const list = this.#list;
    for (let i = 0; i < list.length; i++) {
      const m = list[i]!;
      if (m.nMoved > 0 && m.client.ready && m.client.epoch === m.seenEpoch) {
        let r = 0;
        const mg = m.movedGen;
        for (let slot = 0; slot < mg.length && r < m.nMoved; slot++) {
          const generation = mg[slot]!;
          if (generation < 0) continue;
          let re = m.releases[r];
          if (re === undefined) {
            re = {
              slot: 0,
              generation: 0,
              anchorPos: 0,
              anchorToken: 0,
              rowStart: 0,
              nRows: 0,
              nOut: 0,
              flags: EntryFlag.RELEASE,
            };
            m.releases[r] = re;
          }
          r++;
          re.slot = slot;
          re.generation = generation;
          const j = m.n++;
          m.entries[j] = re;
          if (sampled) m.meta[j] = RELEASE_META;
          m.index[j] = -1 - slot;
        }
      }
      if (m.n > 0) sending.push(m);
    }
  }

  // a member STEP's outcome applied to its own entries (CONTRACT 9.2, 12.2)
  #apply(call: StepCall, m: Member, o: StepOutcome, copy: boolean): void {
    const per = this.#perEntry;
    const merged = this.#merged;
    const reply = o.reply;
    for (let j = 0; j < m.n; j++) {
      const k = m.index[j]!;
      if (k < 0) {
        const slot = -1 - k;
        if (o.ok && reply!.status[j] !== ReqStatus.STALE_GENERATION) {
          m.dropMoved(slot);
          m.movedReleases++;
          this.#c.movedReleases.inc();
        }
        continue;
      }
      per[k] = o;
      if (!o.ok) continue;
      if (copy) merged.copyFrom(reply!, j, k);
      const en = call.entries[k]!;
      if ((en.flags & EntryFlag.RELEASE) !== 0) {
        // released: the slot's next request is a new slot (fewest first)
        if (this.#slotMember[en.slot] === m) {
          this.#slotMember[en.slot] = null;
          m.assigned--;
        }
        m.sentGen[en.slot] = -1;
        this.#slotFailStart[en.slot] = -1;
      } else if (this.#slotFailStart[en.slot]! >= 0) {
        // served again: the new member holds the slot's window (drafts when it asks for them)
        const st = reply!.status[j]!;
        if (st === ReqStatus.OK || st === ReqStatus.PARTIAL_WINDOW) this.#failoverDone(en.slot);
      }
    }
    if (reply !== null) merged.replyFlags = reply.replyFlags;
  }

  #failoverDone(slot: number): void {
    const gap = this.#round - this.#slotFailStart[slot]!;
    this.#slotFailStart[slot] = -1;
    const f = this.#failovers;
    if (f.length >= this.#maxFailoverSamples) f.shift();
    f.push(gap);
  }

  /**
   * Takes a new session id for the process and reconnects every member with it (CONTRACT 6.2,
   * 12.2: the session id is the same at every member).
   */
  newSession(reason: string): void {
    let s = this.#session;
    while (s === this.#session) s = randomInt(1, 2 ** 32);
    this.#session = s;
    for (const m of this.#members.values()) m.client.newSession(reason, s);
  }

  /**
   * RESET at every ready member (CONTRACT 10). With a RoundCore use `RoundCore.reset()`, which
   * also resyncs every slot.
   *
   * @throws ClientError `CLIENT_NOT_READY` when no member is ready; the first member's error otherwise.
   */
  async reset(): Promise<void> {
    const ready = [...this.#members.values()].filter((m) => m.client.ready);
    if (ready.length === 0) throw new ClientError("CLIENT_NOT_READY", "no ready member in the pool");
    const res = await Promise.allSettled(ready.map((m) => m.client.reset()));
    for (const r of res) if (r.status === "rejected") throw r.reason;
  }

  // ------------------------------------------------------------------ tools

  /** The members now, with their counters (for reports and STATS). */
  members(): PoolMemberStats[] {
    return [...this.#members.values()].map((m) => ({
      endpoint: m.endpoint,
      incarnation: m.incarnation,
      state: m.client.state,
      draining: m.draining,
      assigned: m.assigned,
      steps: m.steps,
      stepsOk: m.stepsOk,
      stepsFailed: m.stepsFailed,
      entries: m.entriesSent,
      failoversOut: m.failoversOut,
      movedReleases: m.movedReleases,
      epoch: m.client.epoch,
      rttUs: m.rttUs,
      disabledReason: m.client.disabledReason,
      lastError: m.client.lastError,
    }));
  }

  /** The member client of `endpoint`, or null (for PING / STATS to one member). */
  member(endpoint: string): RemoteDraftClient | null {
    return this.#members.get(endpoint)?.client ?? null;
  }

  /** The member a slot is assigned to now, or null. */
  slotMember(slot: number): string | null {
    return this.#slotMember[slot]?.endpoint ?? null;
  }

  /**
   * Failover gaps in rounds (CONTRACT 12.2): per slot that moved, rounds from its old member's
   * first failed STEP (or the move, when none failed) to the first round its entry is served by
   * the new member (status OK or PARTIAL_WINDOW: drafted when it asked for drafts). A copy.
   */
  failoverRounds(): number[] {
    return [...this.#failovers];
  }

  /**
   * Resolves true once at least `count` members are ready, false after `timeoutMs`. For tools
   * and tests; the engine path never waits.
   */
  async waitReady(timeoutMs: number, count = 1): Promise<boolean> {
    const t0 = Date.now();
    for (;;) {
      let n = 0;
      for (const m of this.#members.values()) if (m.servable()) n++;
      if (n >= count) return true;
      if (this.#closed || Date.now() - t0 >= timeoutMs) return false;
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  /** Stops the source and closes every member; later rounds are target-only (`disabled`). */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    try {
      this.#unsubscribe();
    } catch {
      // a source that throws on stop changes nothing: the members close below
    }
    const ms = [...this.#members.values()];
    this.#members.clear();
    this.#list.length = 0;
    await Promise.all(ms.map((m) => m.client.close()));
  }
}
