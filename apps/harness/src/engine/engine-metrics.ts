/** The engine's metrics (tapwire_harness_*), served on the harness's `/metrics`. */
import { BUCKETS, type Counter, type Histogram, type Registry } from "@tapwire/stats";

/** Metrics of the engine, in its registry (served by `--metrics-port`). */
export class EngineMetrics {
  readonly requestsArrived: Counter;
  readonly requestsCompleted: Counter;
  readonly tokensGenerated: Counter;
  readonly promptTokens: Counter;
  readonly rounds: Counter;
  readonly roundsWithDrafts: Counter;
  readonly roundsTargetOnly: Counter;
  readonly targetForwards: Counter;
  readonly targetSteps: Counter;
  readonly draftsReceived: Counter;
  readonly draftsVerified: Counter;
  readonly draftsAccepted: Counter;
  readonly draftsSkipped: Counter;
  readonly verificationsWithDrafts: Counter;
  readonly acceptedLengthSum: Counter;
  readonly budgetSum: Counter;
  readonly resyncs: Counter;
  readonly deferred: Counter;
  readonly roundTime: Histogram;
  readonly linkTime: Histogram;
  readonly verifyTime: Histogram;
  readonly stepRtt: Histogram;
  readonly running;
  readonly queued;
  readonly waitingMedia;
  private readonly outcomes = new Map<string, Counter>();

  constructor(readonly registry: Registry) {
    const c = (n: string, h: string) => registry.counter(n, h);
    this.requestsArrived = c("requests_arrived", "requests that arrived");
    this.requestsCompleted = c("requests_completed", "requests that finished generating");
    this.tokensGenerated = c("tokens_generated", "tokens generated (speculative run)");
    this.promptTokens = c("prompt_tokens", "prompt tokens prefilled");
    this.rounds = c("rounds", "decode rounds");
    this.roundsWithDrafts = c("rounds_with_drafts", "rounds in which at least one request got drafts");
    this.roundsTargetOnly = c("rounds_target_only", "rounds without any draft");
    this.targetForwards = c("target_forwards", "verification passes (one per running request per round)");
    this.targetSteps = c("target_steps", "target token steps in verification");
    this.draftsReceived = c("drafts_received", "draft tokens received from the worker");
    this.draftsVerified = c("drafts_verified", "draft tokens the depth policy chose to verify");
    this.draftsAccepted = c("drafts_accepted", "draft tokens accepted by verification");
    this.draftsSkipped = c("drafts_skipped_by_policy", "draft tokens left unverified by the depth policy");
    this.verificationsWithDrafts = c(
      "verifications_with_drafts",
      "verification passes with at least one draft",
    );
    this.acceptedLengthSum = c("accepted_length_sum", "sum of (accepted + 1) over verifications with drafts");
    this.budgetSum = c("budget_sum", "sum of per-round verification budgets");
    this.resyncs = c("resync_entries", "STEP entries sent with RESYNC (CONTRACT 7.5)");
    this.deferred = c("deferred_entries", "STEP entries deferred past max_rows_per_step");
    // round and STEP times share the drafter link's buckets (20 µs … 1 s, @tapwire/stats BUCKETS)
    const h = (n: string, help: string) =>
      registry.histogram(n, { help, unit: "seconds", buckets: BUCKETS.STEP_RTT_SECONDS });
    this.roundTime = h("round_seconds", "wall time of a decode round");
    this.linkTime = h("draft_link_seconds", "time a round waits for the drafter link");
    this.verifyTime = h("verify_seconds", "time a round spends in target verification");
    this.stepRtt = h("step_rtt_seconds", "STEP round trip time");
    this.running = registry.gauge("running_requests", "requests holding a slot");
    this.queued = registry.gauge("queued_requests", "requests waiting for a slot");
    this.waitingMedia = registry.gauge("waiting_media_requests", "requests waiting for embeddings");
  }

  /** Counts one link outcome (CONTRACT 9.2 reason). */
  outcome(reason: string): void {
    let ctr = this.outcomes.get(reason);
    if (!ctr) {
      ctr = this.registry.counter(
        `link_outcome_${reason.replace(/[^a-zA-Z0-9_]/g, "_")}`,
        `link rounds with outcome ${reason}`,
      );
      this.outcomes.set(reason, ctr);
    }
    ctr.inc();
  }

  /** Link outcome counts by reason. */
  outcomeCounts(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [k, v] of this.outcomes) out[k] = v.value;
    return out;
  }
}
