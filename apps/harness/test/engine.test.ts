import { DepthPolicy } from "@tapwire/client";
import { DraftHead, TargetModel } from "@tapwire/reference-model";
import { Registry } from "@tapwire/stats";
import { describe, expect, test } from "vitest";
import { DEFAULTS, type HarnessConfig } from "../src/cli/cli.js";
import {
  type DraftLink,
  Engine,
  EngineMetrics,
  type LinkDrafts,
  type LinkRequest,
  type LinkRound,
  type MediaReady,
  type MediaSource,
} from "../src/engine/engine.js";
import { checkGreedy, checkSampled } from "../src/engine/lossless.js";
import { Rng } from "../src/engine/prng.js";
import { decodeTargetOnly, embeddingDigest, mediaConditioning } from "../src/engine/sequence.js";
import { SampleScratch } from "../src/engine/verify.js";
import { makeWorkload, type RequestSpec } from "../src/engine/workload.js";

/**
 * An in-process drafter link for unit tests of the engine alone: a per-slot window of the rows the
 * engine sends, the reference draft head, and optional faults (lost rounds, wrong drafts).
 */
class LocalLink implements DraftLink {
  private readonly windows = new Map<number, { gen: number; rows: Uint8Array[]; end: number }>();
  rounds = 0;
  releases = 0;
  constructor(
    private readonly head: DraftHead,
    private readonly cfg: HarnessConfig,
    private readonly faults: { lose: number; garbage: number; rng: Rng } | null = null,
  ) {}

  async round(
    reqs: readonly LinkRequest[],
    released: ReadonlyArray<{ slot: number; generation: number }>,
  ): Promise<LinkRound> {
    this.rounds++;
    this.releases += released.length;
    const rb = this.head.rowBytes;
    const drafts: Array<LinkDrafts | null> = [];
    const lose = this.faults !== null && this.faults.rng.float() < this.faults.lose;
    for (const r of reqs) {
      let w = this.windows.get(r.slot);
      if (!w || w.gen !== r.generation) {
        w = { gen: r.generation, rows: [], end: r.anchorPos - r.nRows };
        this.windows.set(r.slot, w);
      }
      expect(w.end).toBe(r.anchorPos - r.nRows); // rows continue the window (CONTRACT 7.2)
      for (let i = 0; i < r.nRows; i++) w.rows.push(r.rows.slice(i * rb, (i + 1) * rb));
      w.end = r.anchorPos;
      while (w.rows.length > this.cfg.window) w.rows.shift();
      if (lose || r.want === 0) {
        drafts.push(null);
        continue;
      }
      const rows = new Uint8Array(w.rows.length * rb);
      for (let i = 0; i < w.rows.length; i++) rows.set(w.rows[i]!, i * rb);
      const N = this.cfg.numSpec;
      const ids = new Int32Array(N);
      const conf = new Float32Array(N);
      const margin = new Float32Array(N);
      const support = r.sample ? new Int32Array(N * 32) : null;
      const q = r.sample ? new Uint32Array(N * 32) : null;
      const mask = r.sample ? new Uint8Array(N) : null;
      this.head.draft(
        rows,
        w.rows.length,
        r.anchorToken,
        r.want,
        { ids, conf, margin, offset: 0 },
        r.sample
          ? {
              ...r.sample,
              supportIds: support!,
              proposalQ: q!,
              offset: 0,
              position: r.anchorPos,
              sampledMask: mask!,
            }
          : undefined,
      );
      if (this.faults && this.faults.rng.float() < this.faults.garbage) {
        for (let j = 0; j < r.want; j++) ids[j] = this.faults.rng.int(0, this.cfg.vocab - 1);
      }
      drafts.push({ k: r.want, depth: r.want, ids, offset: 0, conf, margin, mask, support, q });
    }
    return { drafts, outcome: lose ? "timeout" : "ok", rttMs: lose ? null : 0.1, resynced: 0, deferred: 0 };
  }
}

/** Media that become ready after a few polls; some "fail" and are encoded locally. */
class FakeMedia implements MediaSource {
  private pending: Array<{ spec: RequestSpec; polls: number }> = [];
  released = 0;
  constructor(private readonly bytes: (h: string) => Uint8Array) {}
  request(spec: RequestSpec): void {
    this.pending.push({ spec, polls: 3 + (spec.id % 5) });
  }
  poll(): MediaReady[] {
    const out: MediaReady[] = [];
    this.pending = this.pending.filter((p) => {
      if (--p.polls > 0) return true;
      this.released++;
      out.push({ spec: p.spec, digests: p.spec.media.map((h) => embeddingDigest(this.bytes(h))) });
      return false;
    });
    return out;
  }
  get waiting(): number {
    return this.pending.length;
  }
}

function embeddingOf(h: string): Uint8Array {
  const b = new Uint8Array(256);
  for (let i = 0; i < b.length; i++) b[i] = h.charCodeAt(i % h.length) ^ i;
  return b;
}

const small: HarnessConfig = {
  ...DEFAULTS,
  vocab: 256,
  stateDim: 24,
  numTaps: 2,
  hidden: 32,
  slots: 4,
  numSpec: 4,
  window: 8,
  requests: 24,
  rate: 0,
  maxNewTokens: 24,
  promptTokens: 10,
  mmShare: 0.4,
  mediaPool: 4,
  progress: "off",
};

function setup(cfg: HarnessConfig) {
  const target = TargetModel.create({
    vocabSize: cfg.vocab,
    stateDim: cfg.stateDim,
    numTaps: cfg.numTaps,
    hidden: cfg.hidden,
    seed: cfg.seed,
  });
  const head = DraftHead.distill(target, {
    window: cfg.window,
    numSpec: cfg.numSpec,
    rank: 18,
    noise: 0.3,
    seed: 7,
    markovRank: 8,
    calibrationRounds: 32,
  });
  const { requests } = makeWorkload(cfg);
  return { target, head, requests };
}

async function runEngine(cfg: HarnessConfig, link: DraftLink, target: TargetModel, requests: RequestSpec[]) {
  const metrics = new EngineMetrics(new Registry({ prefix: "t_" }));
  const media = new FakeMedia(embeddingOf);
  const policy = new DepthPolicy({ budget: 1000 });
  const engine = new Engine({
    cfg,
    target,
    requests,
    link,
    media,
    budgetFor: (b) => policy.budgetFor(b),
    metrics,
  });
  const res = await engine.run();
  const scratch = new SampleScratch(cfg.vocab);
  const reference = new Map<number, number[]>();
  for (const r of requests) {
    reference.set(
      r.id,
      decodeTargetOnly(target, r, mediaConditioning(r.media.map(embeddingOf)), cfg, scratch),
    );
  }
  return { res, metrics, media, reference };
}

describe("engine (in-process link, fake media)", () => {
  test("greedy speculative decoding equals target-only decoding and accepts more than one token per forward", async () => {
    const { target, head, requests } = setup(small);
    const link = new LocalLink(head, small);
    const { res, metrics, media, reference } = await runEngine(small, link, target, requests);
    const check = checkGreedy(requests, res.outputs, reference);
    expect(check.firstMismatch).toBeNull();
    expect(check.ok).toBe(true);
    expect(metrics.requestsCompleted.value).toBe(small.requests);
    expect(metrics.tokensGenerated.value).toBe(requests.reduce((a, r) => a + r.maxNewTokens, 0));
    // continuous batching: more requests than slots, all served, slots released
    expect(link.releases).toBe(small.requests);
    expect(media.released).toBe(requests.filter((r) => r.media.length > 0).length);
    expect(metrics.tokensGenerated.value / metrics.targetForwards.value).toBeGreaterThan(1.3);
    expect(metrics.draftsAccepted.value).toBeGreaterThan(0);
  });

  test("lost rounds and wrong drafts never change the greedy output", async () => {
    const { target, head, requests } = setup(small);
    const link = new LocalLink(head, small, { lose: 0.3, garbage: 0.3, rng: new Rng(3) });
    const { res, metrics, reference } = await runEngine(small, link, target, requests);
    expect(checkGreedy(requests, res.outputs, reference).ok).toBe(true);
    expect(metrics.roundsTargetOnly.value).toBeGreaterThan(0);
  });

  test("a corrupted embedding changes the output (the check would catch it)", () => {
    const { target, requests } = setup(small);
    const r = requests.find((x) => x.media.length > 0)!;
    const good = r.media.map(embeddingOf);
    const bad = good.map((e) => e.slice());
    bad[0]![17]! ^= 1;
    const scratch = new SampleScratch(small.vocab);
    const a = decodeTargetOnly(target, r, mediaConditioning(good), small, scratch);
    const b = decodeTargetOnly(target, r, mediaConditioning(bad), small, scratch);
    expect(a).not.toEqual(b);
  });

  test("sampled speculative decoding passes the distribution test against target-only sampling", async () => {
    const cfg: HarnessConfig = {
      ...small,
      sample: true,
      temperature: 1,
      requests: 300,
      maxNewTokens: 3,
      promptPool: 2,
      mmShare: 0,
      slots: 16,
    };
    const { target, head, requests } = setup(cfg);
    const { res, reference } = await runEngine(cfg, new LocalLink(head, cfg), target, requests);
    const check = checkSampled(requests, res.outputs, reference, 3);
    expect(check.test!.df).toBeGreaterThan(5);
    expect(check.ok).toBe(true);
    // and the same test rejects a target-only run at another temperature
    const scratch = new SampleScratch(cfg.vocab);
    const hot = new Map<number, number[]>();
    for (const r of requests)
      hot.set(r.id, decodeTargetOnly(target, r, undefined, { sample: true, temperature: 3 }, scratch));
    expect(checkSampled(requests, res.outputs, hot, 3).ok).toBe(false);
  });
});
