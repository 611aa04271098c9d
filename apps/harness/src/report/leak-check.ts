/**
 * The end-of-run leak check (EC-CONTRACT 8): no pin, no grant, no block in flight or retired on
 * either side of the encoder cache, each side measured (never an invented 0).
 */
import type { ConsumerConnector, EcAdminClient } from "@tapwire/ec-connector";

const EC_STATUS_COUNTERS: ReadonlyArray<[string, string]> = [
  ["OK", "consumer_acks_ok"],
  ["NACK_MISSING", "consumer_nacks_missing"],
  ["NACK_NOT_READY", "consumer_nacks_not_ready"],
  ["NACK_INCOMPAT", "consumer_nacks_incompat"],
  ["NACK_VERSION", "consumer_nacks_version"],
  ["NACK_INTERNAL", "consumer_nacks_internal"],
  ["ack_timeout", "consumer_ack_timeouts"],
  ["read_failed", "consumer_read_failures"],
  ["checksum_failed", "consumer_checksum_failures"],
  ["quarantined", "consumer_quarantines"],
  ["settled", "consumer_settles"],
  ["peer_down", "consumer_peer_down"],
];

/** XferAck statuses (EC-CONTRACT 3) and transfer outcomes as the consumer counted them. */
export function ecStatusCounts(c: Record<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [name, key] of EC_STATUS_COUNTERS) out[name] = c[key] ?? 0;
  return out;
}

export interface EndState {
  ok: boolean;
  /** none: both sides measured clean; leaked; unknown: a side could not be measured; not_applicable: no EC. */
  status: "none" | "leaked" | "unknown" | "not_applicable";
  /** null: not measured (never an invented 0). */
  consumerPinnedBlocks: number | null;
  consumerInFlightBlocks: number | null;
  consumerRetiredBlocks: number | null;
  producerPinnedBlocks: number | null;
  producerGrants: number | null;
  producerCounters: Record<string, number>;
  notes: string[];
}

/**
 * EC-CONTRACT 8 at the end of a run: once settled, no pin remains and the free counts return to
 * their initial values on both sides. The consumer frees its ready entries and proves its
 * bookkeeping; the producer is asked over its admin channel (its grants are released by completion
 * notifications, which may still be in flight: polled for up to 3 s).
 */
export async function endState(
  connector: ConsumerConnector | null,
  admin: EcAdminClient | null,
  drained: boolean,
): Promise<EndState> {
  const st: EndState = {
    ok: true,
    status: "not_applicable",
    consumerPinnedBlocks: null,
    consumerInFlightBlocks: null,
    consumerRetiredBlocks: null,
    producerPinnedBlocks: null,
    producerGrants: null,
    producerCounters: {},
    notes: [],
  };
  if (!connector || !admin) return st;
  st.status = "none";
  if (!drained) st.notes.push("transfers still in flight 10 s after the run");
  const cache = connector.cache;
  for (const k of cache.keys()) if (cache.isReady(k)) connector.free(k);
  try {
    cache.check();
  } catch (e) {
    st.ok = false;
    st.notes.push(`consumer cache check failed: ${e instanceof Error ? e.message : String(e)}`);
  }
  st.consumerPinnedBlocks = cache.pinnedBlocks;
  st.consumerRetiredBlocks = cache.retiredBlocks;
  st.consumerInFlightBlocks = cache.numBlocks - cache.freeBlocks - cache.retiredBlocks;
  if (
    st.consumerPinnedBlocks + st.consumerInFlightBlocks + st.consumerRetiredBlocks > 0 ||
    connector.pendingCount > 0
  ) {
    st.ok = false;
  }
  const end = performance.now() + 3000;
  for (;;) {
    try {
      const s = await admin.stats(2000);
      const c = s["cache"] as Record<string, unknown> | undefined;
      const grants = Number(s["grants"]);
      const pinned = Number(c?.["pinnedBlocks"]);
      if (!Number.isFinite(grants) || !Number.isFinite(pinned)) {
        throw new Error(
          `stats reply without grants / cache.pinnedBlocks: ${JSON.stringify(s).slice(0, 200)}`,
        );
      }
      st.producerGrants = grants;
      st.producerPinnedBlocks = pinned;
      const m = s["metrics"] as { counters?: Record<string, number> } | undefined;
      st.producerCounters = m?.counters ?? {};
      if ((grants === 0 && pinned === 0) || performance.now() > end) break;
    } catch (e) {
      // the producer side could not be measured: say so, never report zeros it did not see
      st.producerGrants = null;
      st.producerPinnedBlocks = null;
      st.notes.push(
        `producer side not measured: stats unavailable: ${e instanceof Error ? e.message : String(e)}`,
      );
      st.ok = false;
      st.status = "unknown";
      return st;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const problem = await admin.check(2000).catch((e: unknown) => (e instanceof Error ? e.message : String(e)));
  if (problem !== null) {
    st.ok = false;
    st.notes.push(`producer cache check failed: ${problem}`);
  }
  if ((st.producerGrants ?? 0) > 0 || (st.producerPinnedBlocks ?? 0) > 0) st.ok = false;
  if (!st.ok) st.status = "leaked";
  return st;
}
