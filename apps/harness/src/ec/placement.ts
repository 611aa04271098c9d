/**
 * `--encoders N` (N >= 2): media items spread over N encoders, each publishing its residency
 * events (EC-CONTRACT 10.1, 10.2); the engine's consumer places every transfer through an
 * `EcDirectory` (10.3, 10.4): it asks only a producer whose trusted view holds the item, and an
 * item no trusted view holds is encoded on its owner encoder (by hash) and placed once its
 * `stored` event arrives. With `--faults` the directory reads the events through a lossy relay
 * (dropped messages, closed by replay), the first encoder is restarted by the fault schedule (a
 * new incarnation) and a second directory starts late (the snapshot path).
 */
import type { ConsumerConnector, DirectoryChange, ProducerRecord } from "@tapwire/ec-connector";
import { EcAdminClient, EcDirectory } from "@tapwire/ec-connector";
import type { Registry } from "@tapwire/stats";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import { type LossyZmtp, startLossyZmtp } from "../faults/lossy-zmtp.js";
import { type EcGeometry, type RunScope, startEncoder } from "../procs/children.js";
import type { ChildService } from "../procs/procs.js";
import { type PlacementEtcd, startPlacementEtcd } from "./placement-etcd.js";

/** Share of PUB messages the `--faults` relay drops. */
export const EVENTS_LOSS = 0.05;
/** Hello period of the harness encoders (ms): gaps at the tail are seen within one. */
export const EVENTS_HEARTBEAT_MS = 250;

/** What placement did in a run (the report's "placement" section). */
export interface PlacementReport {
  encoders: number;
  /** Where the directory learnt the encoders (`--placement-discovery`): `static` or `etcd` (their records). */
  discovery: "static" | "etcd";
  /** With etcd: encoder records the directory's watch held at the end. */
  etcdRecords: number;
  /** Transfers sent to a trusted holder. */
  placed: number;
  /** Placed transfers whose round-robin guess (one encoder after another) lacked the item: a NACK_MISSING round trip avoided. */
  nackMissingAvoided: number;
  /** Lookups no trusted view held (the item was then encoded on its owner). */
  notResident: number;
  /** Encodes asked of an owner encoder. */
  encodesAsked: number;
  /** Items encoded locally because no encoder held them by their deadline. */
  timedOut: number;
  /** Requests sent to a producer whose trusted view lacked the item (must be 0). */
  sentWithoutHolder: number;
  /** NACK_MISSING the consumer received (the view is advice: an eviction after the event). */
  nackMissingReceived: number;
  /** Gaps the directory closed, and the time from losing trust to trusting again. */
  gaps: number;
  trustAfterGapMs: { count: number; mean: number; max: number };
  snapshots: number;
  /** PUB messages the lossy relay dropped (`--faults`). */
  droppedEvents: number;
  /** The late directory (`--faults`): snapshots it applied and how its views differ from the main one at the end. */
  late: { snapshots: number; differences: number; trusted: number } | null;
}

/** N encoders with events, their admin clients and the directory that follows them. */
export class Placement {
  readonly encoders: ChildService[] = [];
  readonly producers: string[] = [];
  readonly admins: EcAdminClient[] = [];
  readonly records: ProducerRecord[] = [];
  directory!: EcDirectory;
  late: EcDirectory | null = null;
  /** With `--placement-discovery etcd`: the etcd child and the watch of the encoders' records. */
  etcd: PlacementEtcd | null = null;
  readonly relays: LossyZmtp[] = [];
  readonly asked = new Map<string, number>();
  readonly stats = {
    placed: 0,
    nackMissingAvoided: 0,
    notResident: 0,
    encodesAsked: 0,
    timedOut: 0,
    sentWithoutHolder: 0,
  };
  private readonly untrustedAt = new Map<string, number>();
  private readonly trustTimes: number[] = [];
  private rr = 0;

  /** Starts `n` encoders and the directory (through lossy relays with `faults`). */
  static async start(scope: RunScope, geo: EcGeometry, n: number, ecRegistry: Registry): Promise<Placement> {
    const p = new Placement();
    const random = seeded(scope.cfg.seed);
    if (scope.cfg.placementDiscovery === "etcd") p.etcd = await startPlacementEtcd(scope);
    const relayOf = new Map<string, string>();
    for (let i = 0; i < n; i++) {
      const started = await startEncoder(scope, geo, {
        ...(i === 0 ? {} : { name: `encoder${i + 1}` }),
        args: [
          "--events-listen",
          "tcp://127.0.0.1:0",
          "--replay-listen",
          "tcp://127.0.0.1:0",
          "--events-heartbeat-ms",
          String(EVENTS_HEARTBEAT_MS),
          ...(p.etcd?.registerArgs ?? []),
        ],
      });
      const el = started.listening;
      const events = String(el["events"]);
      const replay = String(el["replay"]);
      let sub = events;
      if (scope.cfg.faults) {
        const relay = await startLossyZmtp(events, EVENTS_LOSS, random);
        scope.cleanups.push(() => relay.close());
        p.relays.push(relay);
        sub = relay.endpoint;
        relayOf.set(events, sub);
      }
      p.encoders.push(started.encoder);
      p.producers.push(started.producerEndpoint);
      const admin = new EcAdminClient(String(el["admin"]));
      scope.cleanups.push(() => admin.close());
      p.admins.push(admin);
      p.records.push({ control: started.producerEndpoint, events: sub, replay });
    }
    const source = p.etcd?.relayed(relayOf);
    p.directory = new EcDirectory({
      ...(source === undefined ? { producers: p.records } : { source }),
      registry: ecRegistry,
    });
    if (p.etcd !== null) {
      // issue 22: the encoders found through their etcd records (the directory is the watcher)
      const end = performance.now() + 30_000;
      while (!p.producers.every((c) => p.directory.view(c) !== undefined)) {
        if (performance.now() > end) {
          p.directory.close();
          throw new HarnessError(
            HarnessErrorCode.PROCESS,
            `--placement-discovery etcd: ${p.producers.length} encoders started, ${p.etcd.source.records().length} records in etcd after 30 s`,
          );
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    p.directory.onChange = (c) => p.onChange(c);
    scope.cleanups.push(() => {
      p.directory.close();
      p.late?.close();
    });
    if (scope.cfg.faults) {
      // a subscriber that starts while the run is under way: its views come from snapshots
      const t = setTimeout(() => {
        p.late = new EcDirectory(source === undefined ? { producers: p.records } : { source });
      }, 1500);
      t.unref();
      scope.cleanups.push(() => clearTimeout(t));
    }
    return p;
  }

  /** The encoder an item belongs to (by its hash): items are spread evenly. */
  owner(mmHash: string): number {
    return Number.parseInt(mmHash.slice(0, 8), 16) % this.producers.length;
  }

  /**
   * EC-CONTRACT 10.4: one placement attempt for `mmHash`: `"pending"` (sent to a trusted holder),
   * `"ready"` (already local), `"waiting"` (no trusted holder yet: encoding on its owner) or
   * `"fallback"` (none by the deadline: encode locally).
   */
  place(
    connector: ConsumerConnector,
    mmHash: string,
    nbytes: number,
    deadlineMs: number,
    now: number,
  ): "ready" | "pending" | "waiting" | "fallback" {
    const holders = this.directory.holders(mmHash);
    if (holders.length === 0) {
      if (!this.asked.has(mmHash)) {
        this.stats.notResident++;
        this.asked.set(mmHash, now);
        this.stats.encodesAsked++;
        this.admins[this.owner(mmHash)]?.encode(mmHash, nbytes, deadlineMs).catch(() => undefined);
      }
      if (now - (this.asked.get(mmHash) ?? now) > deadlineMs) {
        this.asked.delete(mmHash);
        this.stats.timedOut++;
        return "fallback";
      }
      return "waiting";
    }
    const guess = this.producers[this.rr++ % this.producers.length] as string;
    const r = connector.requestPlaced(mmHash, nbytes, now + deadlineMs, now);
    if (r === "not-resident") return "waiting";
    this.asked.delete(mmHash);
    if (r === "pending") {
      this.stats.placed++;
      if (!holders.includes(guess)) this.stats.nackMissingAvoided++;
      // requestPlaced asks holders[0] of the same trusted view: check it did hold the item
      if (!this.directory.holders(mmHash).includes(holders[0] as string)) this.stats.sentWithoutHolder++;
    }
    return r;
  }

  private onChange(c: DirectoryChange): void {
    if (c.kind === "untrusted" || c.kind === "gone") {
      if (!this.untrustedAt.has(c.producer)) this.untrustedAt.set(c.producer, performance.now());
    } else if (c.kind === "trusted") {
      const at = this.untrustedAt.get(c.producer);
      this.untrustedAt.delete(c.producer);
      if (at !== undefined) this.trustTimes.push(performance.now() - at);
    }
  }

  /**
   * The end-state check of the encoders after the first (the run's leak check covers that one):
   * no pinned block and no grant within 3 s. Returns the problems found.
   */
  async leakCheck(): Promise<string[]> {
    const problems: string[] = [];
    for (const [i, admin] of this.admins.entries()) {
      if (i === 0) continue;
      const end = performance.now() + 3000;
      for (;;) {
        let pinned = -1;
        let grants = -1;
        try {
          const st = await admin.stats(2000);
          pinned = Number((st["cache"] as Record<string, unknown> | undefined)?.["pinnedBlocks"] ?? -1);
          grants = Number(st["grants"] ?? -1);
        } catch (e) {
          problems.push(`encoder${i + 1}: stats failed: ${e instanceof Error ? e.message : String(e)}`);
          break;
        }
        if (pinned === 0 && grants === 0) break;
        if (performance.now() > end) {
          problems.push(`encoder${i + 1}: ${pinned} pinned blocks, ${grants} grants at the end`);
          break;
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    return problems;
  }

  /** How the late directory's trusted views differ from the main one's, now. */
  #lateDiff(): { differences: number; trusted: number } {
    let differences = 0;
    let trusted = 0;
    if (this.late === null) return { differences, trusted };
    for (const v of this.late.views()) {
      const main = this.directory.view(v.producer);
      if (!v.trusted || main?.trusted !== true) continue;
      trusted++;
      const a = this.late.residentSet(v.producer);
      const b = this.directory.residentSet(v.producer);
      for (const h of a) if (!b.has(h)) differences++;
      for (const h of b) if (!a.has(h)) differences++;
    }
    return { differences, trusted };
  }

  /**
   * Before the report: the two directories are separate subscribers, so an event published in the
   * last moment may have reached one and not yet the other. Waits (at most `ms`, polling) until
   * they agree; a real disagreement stays and is reported.
   */
  async settleLate(ms = 3_000): Promise<void> {
    const end = performance.now() + ms;
    while (this.late !== null && this.#lateDiff().differences > 0 && performance.now() < end) {
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** The report section (`consumerCounters`: the connector registry's counters). */
  report(consumerCounters: Record<string, number>): PlacementReport {
    const views = this.directory.views();
    const t = this.trustTimes;
    let late: PlacementReport["late"] = null;
    if (this.late !== null) {
      const { differences, trusted } = this.#lateDiff();
      late = { snapshots: this.late.views().reduce((n, v) => n + v.snapshots, 0), differences, trusted };
    }
    return {
      encoders: this.producers.length,
      discovery: this.etcd === null ? "static" : "etcd",
      etcdRecords: this.etcd?.source.records().length ?? 0,
      ...this.stats,
      nackMissingReceived: consumerCounters["consumer_nacks_missing"] ?? 0,
      gaps: views.reduce((n, v) => n + v.gaps, 0),
      trustAfterGapMs: {
        count: t.length,
        mean: t.length === 0 ? 0 : t.reduce((a, b) => a + b, 0) / t.length,
        max: t.length === 0 ? 0 : Math.max(...t),
      },
      snapshots: views.reduce((n, v) => n + v.snapshots, 0),
      droppedEvents: this.relays.reduce((n, r) => n + r.dropped, 0),
      late,
    };
  }
}

/** mulberry32: the relay's losses replay with the run's seed. */
function seeded(seed: number): () => number {
  let a = (seed ^ 0x22) >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = a;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4_294_967_296;
  };
}
