/**
 * The engine: continuous batching over S slots, one drafter-link round per decode round, the depth
 * policy, and target verification. It talks to the drafter only through {@link DraftLink} and to
 * the encoder only through {@link MediaSource}, so it runs the same over any transport.
 */
import type { TargetModel } from "@tapwire/reference-model";
import type { HarnessConfig } from "../cli/cli.js";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import type { EngineMetrics } from "./engine-metrics.js";
import { deriveSeed, Rng } from "./prng.js";
import { ArrivalQueue, type Placement, SlotScheduler } from "./scheduler.js";
import { conditioningOf, TargetSequence } from "./sequence.js";
import { type SampledDrafts, SampleScratch, verifyGreedy, verifySampled } from "./verify.js";
import { type RequestSpec, STREAM } from "./workload.js";

export { EngineMetrics } from "./engine-metrics.js";

/** Sampling parameters of one entry (CONTRACT 7.3 sample meta). */
export interface EntrySample {
  seed: number;
  topK: number;
  tempMilli: number;
}

/** What the engine hands the drafter link for one running request in one round. */
export interface LinkRequest {
  slot: number;
  generation: number;
  /** Position of the anchor (the last accepted token; its row is not known yet, CONTRACT 2). */
  anchorPos: number;
  anchorToken: number;
  /** Rows of positions `[anchorPos - nRows, anchorPos)`: the tokens accepted since the last round. */
  rows: Uint8Array;
  nRows: number;
  /** Drafts wanted (0: none, only keep the window in sync). */
  want: number;
  sample: EntrySample | null;
}

/** Drafts of one request: the consumed positions of a valid reply (CONTRACT 6.3). */
export interface LinkDrafts extends SampledDrafts {
  /** Usable draft positions. */
  k: number;
  /** Positions the depth policy chose to verify (`<= k`). */
  depth: number;
  conf: ArrayLike<number>;
  margin: ArrayLike<number> | null;
}

/** The result of one link round. */
export interface LinkRound {
  /** Per request, in the order given: drafts, or null (no draft this round). */
  drafts: Array<LinkDrafts | null>;
  /** Client outcome of the STEP (CONTRACT 9.2 reason), or "none" when no STEP went out. */
  outcome: string;
  /** STEP round trip in ms when a STEP got a reply; null otherwise. */
  rttMs: number | null;
  /** Entries sent with RESYNC (CONTRACT 7.5). */
  resynced: number;
  /** Entries deferred past max_rows_per_step. */
  deferred: number;
}

/** The drafter link as the engine sees it (adapter over RoundCore + RemoteDraftClient). */
export interface DraftLink {
  /**
   * One round: send the new rows of every running request and the RELEASE of finished ones,
   * return drafts. Never throws for link failures (those are outcomes); target-only when down.
   */
  round(
    reqs: readonly LinkRequest[],
    released: ReadonlyArray<{ slot: number; generation: number }>,
  ): Promise<LinkRound>;
}

/** A multimodal request whose embeddings are available. */
export interface MediaReady {
  spec: RequestSpec;
  /**
   * SHA-256 of each embedding's bytes (as transferred, or as computed locally on a fallback), one
   * per media item in order: what conditions the request's prompt (see `mediaConditioning`).
   */
  digests: Uint8Array[];
}

/** The encoder side as the engine sees it (adapter over ConsumerConnector). */
export interface MediaSource {
  /** Starts loading the media of a request that just arrived. */
  request(spec: RequestSpec): void;
  /** Advances transfers (never blocks); returns requests whose media are all available. */
  poll(): MediaReady[];
  /** Requests still waiting for media. */
  readonly waiting: number;
}

/** Called once per round (and while idle) with the engine's progress; may inject faults. */
export type RoundHook = (p: {
  round: number;
  completed: number;
  total: number;
  elapsedMs: number;
  /** Requests holding a slot now (0 while idle). */
  running: number;
}) => void | Promise<void>;

/** Everything the engine produced. */
export interface EngineResult {
  /** Generated tokens per request id. */
  outputs: Map<number, number[]>;
  /** The media conditioning each multimodal request was decoded with (for the reference run). */
  wallMs: number;
  /** Milliseconds spent per round part, summed. */
  linkMs: number;
  verifyMs: number;
  schedulingMs: number;
  /** Prompt prefill of admitted requests (target steps over the prompt). */
  prefillMs: number;
}

interface Live {
  spec: RequestSpec;
  place: Placement<RequestSpec>;
  seq: TargetSequence;
  out: number[];
  anchor: number;
  verifyRng: Rng;
  draftRng: Rng;
}

/** Options of {@link Engine}. */
export interface EngineOptions {
  cfg: HarnessConfig;
  target: TargetModel;
  requests: readonly RequestSpec[];
  link: DraftLink;
  media: MediaSource;
  /** The verification budget at a batch size (for the report; the link applies the policy). */
  budgetFor: (batch: number) => number;
  metrics: EngineMetrics;
  /** Per-round hook (progress, faults). */
  onRound?: RoundHook;
  /**
   * How many requests may have arrived so far (default unlimited): requests past the cap wait,
   * in arrival order, until it rises. `--faults` uses it to keep some traffic for the end of the
   * fault schedule, so that every fault meets live requests whatever the machine's speed.
   */
  arrivalCap?: (p: { arrived: number; running: number; total: number; waiting: number }) => number;
  /** Media conditioning per request id, recorded for the reference decode. */
  conditioning?: Map<number, Uint8Array | undefined>;
  /** After each request's verification with drafts: the drafts, the depth verified, the drafts accepted. */
  onVerified?: (drafts: LinkDrafts, depth: number, accepted: number) => void;
  /** After each decode round: requests in the batch, draft tokens verified, requests verified without drafts. */
  onRoundVerified?: (batch: number, verified: number, unverified: number) => void;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const yieldToLoop = () => new Promise<void>((r) => setImmediate(r));

/** The speculative-decoding engine of the harness. */
export class Engine {
  private readonly cfg: HarnessConfig;
  private readonly sched: SlotScheduler<RequestSpec>;
  private readonly live: Array<Live | null>;
  private readonly scratch: SampleScratch;
  private readonly outputs = new Map<number, number[]>();
  private readonly conditioning: Map<number, Uint8Array | undefined>;
  private readonly capacityRows: number;
  // arrived requests held back by `arrivalCap` (faults mode keeps traffic for the fault schedule)
  private readonly held: RequestSpec[] = [];
  private heldHead = 0;
  private arrived = 0;

  constructor(private readonly o: EngineOptions) {
    this.cfg = o.cfg;
    const genRng = new Rng(deriveSeed(o.cfg.seed, STREAM.GENERATIONS));
    // Start every slot a few requests short of the u32 wrap: each run crosses it (CONTRACT 2, 7.1).
    this.sched = new SlotScheduler({
      slots: o.cfg.slots,
      initialGeneration: () => (0xffffffff - genRng.int(0, 3)) >>> 0,
    });
    this.live = new Array<Live | null>(o.cfg.slots).fill(null);
    this.scratch = new SampleScratch(o.cfg.vocab);
    this.conditioning = o.conditioning ?? new Map();
    let maxPrompt = 2;
    for (const r of o.requests) maxPrompt = Math.max(maxPrompt, r.prompt.length);
    this.capacityRows = Math.max(maxPrompt, o.cfg.numSpec + 1);
  }

  /** Runs every request to completion. */
  async run(): Promise<EngineResult> {
    const { metrics: m, link, media } = this.o;
    const arrivals = new ArrivalQueue(this.o.requests);
    const total = this.o.requests.length;
    const t0 = performance.now();
    let linkMs = 0;
    let verifyMs = 0;
    let schedMs = 0;
    let prefillMs = 0;
    let round = 0;
    let released: Array<{ slot: number; generation: number }> = [];
    const linkReqs: LinkRequest[] = [];
    const liveOrder: Live[] = [];
    const emitted: number[] = [];
    this.held.length = 0;
    this.heldHead = 0;
    this.arrived = 0;

    while (this.outputs.size < total) {
      const tr0 = performance.now();
      this.admitArrivals(arrivals, tr0 - t0, total);
      const tp0 = performance.now();
      for (const p of this.sched.admit()) this.start(p);
      const roundPrefill = performance.now() - tp0;
      prefillMs += roundPrefill;
      m.running.set(this.sched.runningCount);
      m.queued.set(this.sched.queued);
      m.waitingMedia.set(media.waiting);

      this.linkRequests(liveOrder, linkReqs);

      if (liveOrder.length === 0) {
        if (released.length > 0) {
          // nothing to decode, but tell the worker about finished slots
          this.countLink(await link.round(linkReqs, released));
          released = [];
        }
        await this.o.onRound?.({
          round,
          completed: this.outputs.size,
          total,
          elapsedMs: performance.now() - t0,
          running: 0,
        });
        const next = arrivals.nextArrivalMs();
        const waitMs = next === null ? 2 : Math.max(0, Math.min(next - (performance.now() - t0), 2));
        await sleep(waitMs);
        continue;
      }

      round++;
      m.rounds.inc();
      const tl0 = performance.now();
      const res = await link.round(linkReqs, released);
      const tl1 = performance.now();
      released = [];
      this.countLink(res);

      m.resyncs.inc(res.resynced);
      m.deferred.inc(res.deferred);
      this.countDrafts(res, liveOrder.length);

      let roundVerified = 0;
      let roundUnverified = 0;
      for (let i = 0; i < liveOrder.length; i++) {
        const d = res.drafts[i] ?? null;
        const k = this.verifyOne(
          liveOrder[i] as Live,
          d,
          (linkReqs[i] as LinkRequest).want,
          emitted,
          released,
        );
        if (k > 0) roundVerified += k;
        else roundUnverified++;
      }
      this.o.onRoundVerified?.(liveOrder.length, roundVerified, roundUnverified);
      const tv1 = performance.now();
      const roundMs = tv1 - tr0;
      linkMs += tl1 - tl0;
      verifyMs += tv1 - tl1;
      schedMs += roundMs - (tl1 - tl0) - (tv1 - tl1) - roundPrefill;
      m.roundTime.observe(roundMs / 1000);
      m.linkTime.observe((tl1 - tl0) / 1000);
      m.verifyTime.observe((tv1 - tl1) / 1000);
      await this.o.onRound?.({
        round,
        completed: this.outputs.size,
        total,
        elapsedMs: performance.now() - t0,
        running: this.sched.runningCount,
      });
      // A target-only round does no I/O: without this, rounds would run back to back as
      // microtasks and starve timers and sockets (the client's reconnect loop, EC transfers).
      await yieldToLoop();
    }
    if (released.length > 0) this.countLink(await link.round([], released));
    return {
      outputs: this.outputs,
      wallMs: performance.now() - t0,
      linkMs,
      verifyMs,
      schedulingMs: schedMs,
      prefillMs,
    };
  }

  /**
   * Requests due by `elapsed` arrive, up to `arrivalCap` (the rest are held, in arrival order);
   * a request with media waits for it, the others are submitted; requests whose media is ready
   * are submitted with their conditioning.
   */
  private admitArrivals(arrivals: ArrivalQueue<RequestSpec>, elapsed: number, total: number): void {
    const { metrics: m, media } = this.o;
    const held = this.held;
    for (const spec of arrivals.due(elapsed)) held.push(spec);
    const cap =
      this.o.arrivalCap?.({
        arrived: this.arrived,
        running: this.sched.runningCount,
        total,
        waiting: held.length - this.heldHead,
      }) ?? Number.POSITIVE_INFINITY;
    while (this.heldHead < held.length && this.arrived < cap) {
      const spec = held[this.heldHead++] as RequestSpec;
      this.arrived++;
      m.requestsArrived.inc();
      if (spec.media.length > 0) media.request(spec);
      else this.sched.submit(spec);
    }
    for (const ready of media.poll()) {
      this.conditioning.set(ready.spec.id, conditioningOf(ready.digests));
      this.sched.submit(ready.spec);
    }
  }

  /** Counts the drafts a round received and whether it verified any (with its budget). */
  private countDrafts(res: LinkRound, n: number): void {
    const m = this.o.metrics;
    let anyDrafts = false;
    for (let i = 0; i < n; i++) {
      const d = res.drafts[i] ?? null;
      if (d && d.k > 0) {
        anyDrafts = true;
        m.draftsReceived.inc(d.k);
      }
    }
    if (anyDrafts) {
      m.roundsWithDrafts.inc();
      m.budgetSum.inc(this.o.budgetFor(n));
    } else {
      m.roundsTargetOnly.inc();
    }
  }

  /** The live requests in slot order and, for each, its link request of this round. */
  private linkRequests(liveOrder: Live[], linkReqs: LinkRequest[]): void {
    const { cfg } = this.o;
    liveOrder.length = 0;
    linkReqs.length = 0;
    for (const l of this.live) {
      if (!l) continue;
      liveOrder.push(l);
      const { rows, nRows } = l.seq.takeRows();
      const remaining = l.spec.maxNewTokens - l.out.length;
      linkReqs.push({
        slot: l.place.slot,
        generation: l.place.generation,
        anchorPos: l.seq.position,
        anchorToken: l.anchor,
        rows,
        nRows,
        want: Math.min(cfg.numSpec, remaining - 1),
        sample: cfg.sample
          ? {
              seed: l.draftRng.u32(),
              topK: cfg.topK,
              tempMilli: Math.max(1, Math.round(cfg.temperature * 1000)),
            }
          : null,
      });
    }
  }

  /**
   * Verifies one request's drafts (CONTRACT 8 when sampled) and appends the tokens; a finished
   * request is released. Returns the drafts verified (0: the round was target-only for it).
   */
  private verifyOne(
    l: Live,
    d: LinkDrafts | null,
    want: number,
    emitted: number[],
    released: Array<{ slot: number; generation: number }>,
  ): number {
    const { cfg, metrics: m } = this.o;
    // the depth policy's choice, never past the request's last token
    const k = d ? Math.min(d.depth, d.k, want) : 0;
    if (d) m.draftsSkipped.inc(d.k - k);
    emitted.length = 0;
    const before = l.seq.steps;
    let accepted: number;
    if (cfg.sample) {
      accepted = verifySampled(
        l.seq,
        l.anchor,
        d ?? NO_DRAFTS,
        d ? k : 0,
        cfg.temperature,
        l.verifyRng,
        this.scratch,
        emitted,
      );
    } else {
      accepted = verifyGreedy(l.seq, l.anchor, d ? d.ids : EMPTY, d ? d.offset : 0, d ? k : 0, emitted);
    }
    m.targetSteps.inc(l.seq.steps - before);
    m.targetForwards.inc();
    if (k > 0) {
      m.draftsVerified.inc(k);
      m.draftsAccepted.inc(accepted);
      m.verificationsWithDrafts.inc();
      m.acceptedLengthSum.inc(accepted + 1);
      this.o.onVerified?.(d as LinkDrafts, k, accepted);
    }
    for (const t of emitted) l.out.push(t);
    l.anchor = emitted[emitted.length - 1] as number;
    m.tokensGenerated.inc(emitted.length);
    if (l.out.length >= l.spec.maxNewTokens) {
      if (l.out.length > l.spec.maxNewTokens) {
        throw new HarnessError(HarnessErrorCode.INTERNAL, `request ${l.spec.id} overran its length`);
      }
      this.finish(l);
      released.push({ slot: l.place.slot, generation: l.place.generation });
    }
    return k;
  }

  /** Counts a link round's outcome and STEP RTT (decode rounds and RELEASE-only rounds alike). */
  private countLink(res: LinkRound): void {
    if (res.outcome !== "idle") this.o.metrics.outcome(res.outcome);
    if (res.rttMs !== null) this.o.metrics.stepRtt.observe(res.rttMs / 1000);
  }

  /** Admits a request into its slot: prefill (rows of the prompt but its last token, the anchor). */
  private start(p: Placement<RequestSpec>): void {
    const spec = p.req;
    const seq = new TargetSequence(this.o.target, this.conditioning.get(spec.id), this.capacityRows);
    for (let i = 0; i < spec.prompt.length - 1; i++) seq.feed(spec.prompt[i] as number);
    this.o.metrics.promptTokens.inc(spec.prompt.length);
    this.live[p.slot] = {
      spec,
      place: p,
      seq,
      out: [],
      anchor: spec.prompt[spec.prompt.length - 1] as number,
      verifyRng: new Rng(deriveSeed(spec.seed, STREAM.VERIFY)),
      draftRng: new Rng(deriveSeed(spec.seed, STREAM.DRAFT)),
    };
  }

  private finish(l: Live): void {
    this.outputs.set(l.spec.id, l.out);
    this.live[l.place.slot] = null;
    this.sched.release(l.place.slot);
    this.o.metrics.requestsCompleted.inc();
  }
}

const EMPTY = new Float32Array(0);
const NO_DRAFTS: SampledDrafts = { ids: EMPTY, offset: 0, mask: null, support: null, q: null };
