/**
 * The requests of a run, derived from `--seed` only: arrival times (Poisson at `--rate`), prompts,
 * generation lengths, and for multimodal requests one to three media items named by content hash,
 * drawn with a skewed popularity so that some items are shared between requests (cache hits).
 */
import { createHash } from "node:crypto";
import type { HarnessConfig } from "../cli/cli.js";
import { deriveSeed, Rng } from "./prng.js";

/** One request of the workload. */
export interface RequestSpec {
  /** 0-based id, also the order of arrival. */
  id: number;
  /** Arrival time, ms after the run starts. */
  arrivalMs: number;
  /** Prompt tokens (at least 2: the last one is the first anchor). */
  prompt: number[];
  /** Tokens to generate. */
  maxNewTokens: number;
  /** Content hashes (mm_hash, lowercase hex SHA-256) of its media items; empty for text-only. */
  media: string[];
  /** Seed of the request's sampling streams. */
  seed: number;
  /** Index of its prompt in the prompt pool (its own id when prompts are all distinct). */
  promptId: number;
}

/** Stream ids for {@link deriveSeed}, so that each use of randomness is independent. */
export const STREAM = {
  WORKLOAD: 1,
  REQUEST: 2,
  VERIFY: 3,
  DRAFT: 4,
  TARGET_ONLY: 5,
  FAULTS: 6,
  GENERATIONS: 7,
} as const;

/** The content hash of media item `i` of a run (what an encoder cache is keyed by). */
export function mediaHash(seed: number, i: number): string {
  return createHash("sha256").update(`tapwire-harness-media:${seed}:${i}`).digest("hex");
}

type WorkloadConfig = Pick<
  HarnessConfig,
  | "requests"
  | "rate"
  | "maxNewTokens"
  | "promptTokens"
  | "promptPool"
  | "mmShare"
  | "mediaPool"
  | "vocab"
  | "seed"
>;

/** Builds the workload of a run. */
export function makeWorkload(cfg: WorkloadConfig): { requests: RequestSpec[]; media: string[] } {
  const rng = new Rng(deriveSeed(cfg.seed, STREAM.WORKLOAD));
  const media = Array.from({ length: cfg.mediaPool }, (_, i) => mediaHash(cfg.seed, i));
  // Zipf(1) popularity: item i is picked with weight 1/(i+1).
  const weights = media.map((_, i) => 1 / (i + 1));
  const requests: RequestSpec[] = [];
  let t = 0;
  const half = (n: number) => Math.max(1, Math.ceil(n / 2));
  const newPrompt = () => {
    const plen = rng.int(Math.max(2, half(cfg.promptTokens)), cfg.promptTokens);
    return Array.from({ length: plen }, () => rng.int(0, cfg.vocab - 1));
  };
  const pool = Array.from({ length: cfg.promptPool }, newPrompt);
  for (let id = 0; id < cfg.requests; id++) {
    if (cfg.rate > 0 && id > 0) t += rng.exponential(cfg.rate) * 1000;
    const promptId = pool.length > 0 ? rng.int(0, pool.length - 1) : id;
    const prompt = pool.length > 0 ? (pool[promptId] as number[]) : newPrompt();
    const maxNewTokens = rng.int(half(cfg.maxNewTokens), cfg.maxNewTokens);
    const items: string[] = [];
    if (rng.float() < cfg.mmShare) {
      const want = Math.min(rng.int(1, 3), media.length);
      const w = weights.slice();
      while (items.length < want) {
        const i = rng.categorical(w);
        w[i] = 0;
        items.push(media[i] as string);
      }
    }
    requests.push({
      id,
      arrivalMs: t,
      prompt,
      maxNewTokens,
      media: items,
      seed: deriveSeed(cfg.seed, STREAM.REQUEST, id),
      promptId,
    });
  }
  return { requests, media };
}
