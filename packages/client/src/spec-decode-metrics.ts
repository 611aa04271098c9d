// The spec-decode counters under the names of vLLM's metrics and Grafana dashboard
// (`vllm_speculative_decoding.json`, issue 24), kept by the engine (rank 0) per verification and
// rendered as Prometheus text with the `position` label vLLM uses. Plain numbers on the hot path;
// the text is built only on a scrape.
import { ClientError } from "./errors.js";

/** Options of {@link SpecDecodeMetrics}. */
export interface SpecDecodeMetricsOptions {
  /** Draft positions counted (the session's N, 1..32). */
  numSpec: number;
  /** Prepended to every name; vLLM's engine prefix (default `"vllm:"`). */
  prefix?: string;
  /** Constant labels on every series (default `{ engine: "0", model_name: "tapwire" }`, as vLLM's). */
  labels?: Readonly<Record<string, string>>;
}

/** A plain-JSON view of {@link SpecDecodeMetrics}. */
export interface SpecDecodeSnapshot {
  /** Verifications that had at least one draft token (`spec_decode_num_drafts`). */
  numDrafts: number;
  /** Draft tokens verified (`spec_decode_num_draft_tokens`). */
  numDraftTokens: number;
  /** Draft tokens accepted (`spec_decode_num_accepted_tokens`). */
  numAcceptedTokens: number;
  /** Accepted tokens per draft position (`spec_decode_num_accepted_tokens_per_pos{position}`). */
  acceptedPerPosition: number[];
  /** Tokens generated (`generation_tokens`). */
  generationTokens: number;
  /** `numAcceptedTokens / numDraftTokens` (0 without drafts): the dashboard's acceptance rate. */
  acceptanceRate: number;
  /** `1 + numAcceptedTokens / numDrafts` (0 without drafts): the dashboard's acceptance length. */
  acceptanceLength: number;
  /** `acceptedPerPosition[j] / numDrafts`: the dashboard's acceptance rate by draft position. */
  acceptanceByPosition: number[];
}

/** Defaults of {@link SpecDecodeMetricsOptions}. */
export const SPEC_DECODE_DEFAULTS = {
  prefix: "vllm:",
  labels: { engine: "0", model_name: "tapwire" },
} as const;

const NAME_RE = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_RE = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/**
 * The spec-decode counters of vLLM (`spec_decode_num_drafts_total`,
 * `spec_decode_num_draft_tokens_total`, `spec_decode_num_accepted_tokens_total`,
 * `spec_decode_num_accepted_tokens_per_pos_total{position}`) plus `generation_tokens_total`,
 * under a configurable engine prefix, so that vLLM's Grafana dashboard reads a tapwire engine.
 */
export class SpecDecodeMetrics {
  /** The prefix of every name. */
  readonly prefix: string;
  /** Positions counted. */
  readonly numSpec: number;
  readonly #labels: string;
  readonly #perPos: Float64Array;
  #drafts = 0;
  #draftTokens = 0;
  #accepted = 0;
  #generated = 0;

  /** @throws ClientError `CLIENT_BAD_OPTION` naming the bad option. */
  constructor(options: SpecDecodeMetricsOptions) {
    const n = options?.numSpec;
    if (!Number.isInteger(n) || n < 1 || n > 32) {
      throw new ClientError("CLIENT_BAD_OPTION", `option numSpec ${String(n)} is not an integer in 1..32`);
    }
    const prefix = options.prefix ?? SPEC_DECODE_DEFAULTS.prefix;
    if (typeof prefix !== "string" || (prefix !== "" && !NAME_RE.test(prefix))) {
      throw new ClientError(
        "CLIENT_BAD_OPTION",
        `option prefix ${JSON.stringify(prefix)} is not a Prometheus name prefix`,
      );
    }
    const labels = options.labels ?? SPEC_DECODE_DEFAULTS.labels;
    const parts: string[] = [];
    for (const [k, v] of Object.entries(labels)) {
      if (!LABEL_RE.test(k) || k === "position" || typeof v !== "string") {
        throw new ClientError(
          "CLIENT_BAD_OPTION",
          `option labels: ${JSON.stringify(k)} is not a label name with a string value`,
        );
      }
      parts.push(`${k}="${v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")}"`);
    }
    this.prefix = prefix;
    this.numSpec = n;
    this.#labels = parts.join(",");
    this.#perPos = new Float64Array(n);
  }

  /**
   * One verification of `draftTokens` drafts of which the first `accepted` were accepted (vLLM's
   * semantics: positions `0..accepted-1` each count one accepted token). A verification without
   * drafts counts nothing.
   */
  observe(draftTokens: number, accepted: number): void {
    if (draftTokens <= 0) return;
    this.#drafts++;
    this.#draftTokens += draftTokens;
    const a = Math.min(accepted, draftTokens, this.numSpec);
    this.#accepted += a;
    for (let j = 0; j < a; j++) this.#perPos[j]!++;
  }

  /** `n` tokens generated (`generation_tokens_total`). */
  generated(n: number): void {
    this.#generated += n;
  }

  /** The counters and the dashboard's ratios. */
  snapshot(): SpecDecodeSnapshot {
    const d = this.#drafts;
    return {
      numDrafts: d,
      numDraftTokens: this.#draftTokens,
      numAcceptedTokens: this.#accepted,
      acceptedPerPosition: [...this.#perPos],
      generationTokens: this.#generated,
      acceptanceRate: this.#draftTokens > 0 ? this.#accepted / this.#draftTokens : 0,
      acceptanceLength: d > 0 ? 1 + this.#accepted / d : 0,
      acceptanceByPosition: [...this.#perPos].map((v) => (d > 0 ? v / d : 0)),
    };
  }

  /** The Prometheus text exposition of the counters (for `serveMetrics`' `extra`). */
  exposition(): string {
    const p = this.prefix;
    const l = this.#labels;
    const one = (name: string, help: string, v: number): string =>
      `# HELP ${p}${name} ${help}\n# TYPE ${p}${name} counter\n${p}${name}${l ? `{${l}}` : ""} ${v}\n`;
    let out =
      one(
        "spec_decode_num_drafts_total",
        "Number of spec decoding drafts (verifications with drafts).",
        this.#drafts,
      ) +
      one("spec_decode_num_draft_tokens_total", "Number of draft tokens verified.", this.#draftTokens) +
      one("spec_decode_num_accepted_tokens_total", "Number of accepted draft tokens.", this.#accepted);
    const name = `${p}spec_decode_num_accepted_tokens_per_pos_total`;
    out += `# HELP ${name} Accepted tokens per draft position.\n# TYPE ${name} counter\n`;
    for (let j = 0; j < this.numSpec; j++)
      out += `${name}{${l ? `${l},` : ""}position="${j}"} ${this.#perPos[j]}\n`;
    out += one("generation_tokens_total", "Number of generation tokens processed.", this.#generated);
    return out;
  }
}
