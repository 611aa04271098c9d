/**
 * The live view (`--ui`, issue 24, docs/harness.md "Live view"): a hand-written page (page.ts)
 * and its state as Server-Sent Events twice a second, served by @tapwire/stats' HTTP server while
 * the run goes. The state is read from the run's own counters on each event; nothing on the
 * engine's hot path changes. At the end the report's numbers are sent as the final state.
 */
import type { Histogram, MetricsServer, Registry, SseRoute } from "@tapwire/stats";
import { pageRoute, serveMetrics, sseRoute } from "@tapwire/stats";
import { uiListenOf } from "../cli/cli.js";
import type { HarnessConfig } from "../cli/config.js";
import type { DepthRunStats } from "../depth/depth-sim.js";
import type { EcMediaMetrics } from "../ec/media.js";
import type { EngineMetrics } from "../engine/engine-metrics.js";
import { histogramBins } from "../report/pictures.js";
import type { Report } from "../report/report.js";
import type { VllmExport } from "../report/vllm-metrics.js";
import { LIVE_PAGE } from "./page.js";

/** What the run hands the live view once its parts exist. */
export interface LiveSources {
  metrics: EngineMetrics;
  ecMetrics: EcMediaMetrics;
  client: Registry;
  ec: Registry;
  vllm: VllmExport;
  depth: () => DepthRunStats | null;
  total: number;
}

/** A histogram as log-spaced bins (milliseconds) estimated from its percentiles. */
export interface LiveHistogram {
  count: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  maxMs: number;
  /** Bin edges in ms (`edges.length === counts.length + 1`). */
  edges: number[];
  counts: number[];
}

function bins(h: Histogram): LiveHistogram {
  const b = histogramBins(h);
  return {
    count: h.count,
    p50Ms: h.percentile(50) * 1000,
    p90Ms: h.percentile(90) * 1000,
    p99Ms: h.percentile(99) * 1000,
    maxMs: h.max * 1000,
    edges: b.edgesMs,
    counts: b.counts,
  };
}

/** The page, its event stream and the state it shows. */
export class LiveView {
  readonly #server: MetricsServer;
  readonly #events: SseRoute;
  readonly #t0 = Date.now();
  readonly #lingerMs: number;
  #src: LiveSources | null = null;
  #phase: string | null = null;
  readonly #phaseOf: () => string;
  #final: Record<string, unknown> | null = null;

  private constructor(server: MetricsServer, events: SseRoute, lingerMs: number, phaseOf: () => string) {
    this.#phaseOf = phaseOf;
    this.#server = server;
    this.#events = events;
    this.#lingerMs = lingerMs;
  }

  /** The page's URL. */
  get url(): string {
    const h = this.#server.host.includes(":") ? `[${this.#server.host}]` : this.#server.host;
    return `http://${h}:${this.#server.port}/`;
  }

  /** Starts serving at `--ui-listen` (default 127.0.0.1:0). */
  static async start(cfg: HarnessConfig, registries: Registry[], phaseOf: () => string): Promise<LiveView> {
    const { host, port } = uiListenOf(cfg.uiListen ?? "127.0.0.1:0");
    let view: LiveView | null = null;
    const events = sseRoute(() => view?.state() ?? { phase: "starting" }, { intervalMs: 500 });
    const server = await serveMetrics(registries, port, host, {
      routes: {
        "/": pageRoute(LIVE_PAGE),
        "/events": events,
        "/state": (_req, res) => {
          res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" });
          res.end(JSON.stringify(view?.state() ?? {}));
        },
      },
    });
    view = new LiveView(server, events, cfg.uiLingerMs, phaseOf);
    return view;
  }

  /** The run's parts, once they exist. */
  attach(src: LiveSources): void {
    this.#src = src;
  }

  /** The state the page shows (JSON), live or final. */
  state(): Record<string, unknown> {
    const s = this.#src;
    const phase = this.#phase ?? this.#phaseOf();
    const base: Record<string, unknown> = { phase, elapsedMs: Date.now() - this.#t0, final: false };
    if (s === null) return base;
    const m = s.metrics;
    s.vllm.sync();
    const spec = s.vllm.spec.snapshot();
    const cs = s.client.snapshot();
    const ec = s.ec.snapshot().counters;
    const worker = (() => {
      try {
        return JSON.parse(cs.info["worker"] ?? "null") as { name?: string } | null;
      } catch {
        return null;
      }
    })();
    const out: Record<string, unknown> = {
      ...base,
      requests: { arrived: m.requestsArrived.value, completed: m.requestsCompleted.value, total: s.total },
      tokens: m.tokensGenerated.value,
      rounds: m.rounds.value,
      acceptance: {
        byPosition: spec.acceptanceByPosition,
        acceptedPerPosition: spec.acceptedPerPosition,
        numDrafts: spec.numDrafts,
        rate: spec.acceptanceRate,
        length: spec.acceptanceLength,
      },
      depths: s.depth()?.report(m.tokensGenerated.value).depthHistogram ?? [],
      stepRtt: bins(m.stepRtt),
      round: bins(m.roundTime),
      roundTime: {
        linkMs: m.linkTime.sum * 1000,
        verifyMs: m.verifyTime.sum * 1000,
        otherMs: Math.max(0, (m.roundTime.sum - m.linkTime.sum - m.verifyTime.sum) * 1000),
      },
      workers: [
        {
          name: worker?.name ?? "(not connected)",
          ready: cs.gauges["ready"] === 1,
          epoch: cs.gauges["epoch"] ?? 0,
          steps: cs.counters["steps"] ?? 0,
          ok: cs.counters["step_ok"] ?? 0,
          bytesSent: cs.counters["bytes_sent"] ?? 0,
          bytesReceived: cs.counters["bytes_received"] ?? 0,
          rttP50Ms: (cs.histograms["step_rtt_seconds"]?.p50 ?? 0) * 1000,
          lastError: cs.info["last_error"] ?? "",
        },
      ],
      encoders: [
        {
          name: "encoder",
          transfers: s.ecMetrics.transfers.value,
          bytes: s.ecMetrics.bytes.value,
          lookups: s.ecMetrics.lookups.value,
          cacheHits: s.ecMetrics.cacheHits.value,
          joined: s.ecMetrics.joined.value,
          fallbacks: s.ecMetrics.fallbacks.value,
          retries: ec["connector_retries"] ?? 0,
          waitP50Ms: s.ecMetrics.wait.percentile(50) * 1000,
        },
      ],
      ec: { transfers: s.ecMetrics.transfers.value, bytes: s.ecMetrics.bytes.value },
      lossless: { status: "pending" },
    };
    return this.#final !== null ? { ...out, ...this.#final, final: true } : out;
  }

  /** The run's report: its numbers become the final state, sent at once. */
  finish(report: Report): void {
    this.#phase = "finished";
    this.#final = {
      phase: "finished",
      lossless: {
        status: report.lossless.ok ? "ok" : "failed",
        mode: report.lossless.mode,
        checked: report.lossless.checked,
        mismatched: report.lossless.mismatched,
      },
      acceptance: {
        byPosition: report.specDecode?.acceptanceByPosition ?? [],
        acceptedPerPosition: report.specDecode?.acceptedPerPosition ?? [],
        numDrafts: report.specDecode?.numDrafts ?? 0,
        rate: report.specDecode?.acceptanceRate ?? 0,
        length: report.specDecode?.acceptanceLength ?? 0,
      },
      depths: report.depthPolicy?.depthHistogram ?? [],
    };
    this.#events.send("final", this.state());
  }

  /**
   * Ends the view: with `--ui-linger-ms`, first waits until every viewer has closed the page (or
   * that long), so that the final state can be read.
   */
  async close(): Promise<void> {
    const end = Date.now() + this.#lingerMs;
    while (this.#lingerMs > 0 && this.#events.clients > 0 && Date.now() < end) {
      await new Promise((r) => setTimeout(r, 100));
    }
    this.#events.close();
    await this.#server.close();
  }
}
