/**
 * The engine's series under vLLM's names (issue 24): the spec-decode counters vLLM's Grafana
 * dashboard `vllm_speculative_decoding.json` reads (`@tapwire/client` SpecDecodeMetrics, fed per
 * verification), and the EC side's `ec_*` byte and time series, under the engine prefix
 * (`--metrics-engine-prefix`, default `vllm:`), served next to the tapwire_* series.
 */
import { SpecDecodeMetrics } from "@tapwire/client";
import type { EcMediaMetrics } from "../ec/media.js";
import type { EngineMetrics } from "../engine/engine-metrics.js";

/** The vLLM-named exposition of one run. */
export class VllmExport {
  /** The spec-decode counters (per verification: `observe(k, accepted)`). */
  readonly spec: SpecDecodeMetrics;
  #engine: EngineMetrics | null = null;
  #ec: EcMediaMetrics | null = null;
  #generatedSeen = 0;

  constructor(
    readonly prefix: string,
    numSpec: number,
  ) {
    this.spec = new SpecDecodeMetrics({
      prefix,
      numSpec,
      labels: { engine: "0", model_name: "tapwire-harness" },
    });
  }

  /** The sources read at scrape time: generated tokens, EC transfers. */
  attach(engine: EngineMetrics, ec: EcMediaMetrics): void {
    this.#engine = engine;
    this.#ec = ec;
  }

  /** One verification (the engine's `onVerified`). */
  readonly onVerified = (_d: unknown, depth: number, accepted: number): void => {
    this.spec.observe(depth, accepted);
  };

  /** Brings `generation_tokens_total` up to the engine's count. */
  sync(): void {
    const g = this.#engine?.tokensGenerated.value ?? 0;
    if (g > this.#generatedSeen) this.spec.generated(g - this.#generatedSeen);
    this.#generatedSeen = Math.max(g, this.#generatedSeen);
  }

  /** Prometheus text: spec decode, then `ec_transfers_total`, `ec_transfer_bytes_total`, `ec_wait_seconds_{sum,count}`. */
  exposition(): string {
    this.sync();
    const p = this.prefix;
    const lab = '{engine="0",model_name="tapwire-harness"}';
    const ec = this.#ec;
    const series = (name: string, type: string, help: string, lines: [string, number][]): string =>
      `# HELP ${p}${name} ${help}\n# TYPE ${p}${name} ${type}\n${lines.map(([s, v]) => `${p}${name}${s}${lab} ${v}`).join("\n")}\n`;
    return (
      this.spec.exposition() +
      series("ec_transfers_total", "counter", "Encoder-cache embedding transfers completed.", [
        ["", ec?.transfers.value ?? 0],
      ]) +
      series("ec_transfer_bytes_total", "counter", "Bytes of completed encoder-cache transfers.", [
        ["", ec?.bytes.value ?? 0],
      ]) +
      series("ec_wait_seconds", "summary", "Time requests waited for their media embeddings.", [
        ["_sum", ec?.wait.sum ?? 0],
        ["_count", ec?.wait.count ?? 0],
      ])
    );
  }
}
