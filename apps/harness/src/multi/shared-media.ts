/**
 * Issue 21: the media side of one engine process over the run's shared encoders. Its consumer
 * connector places every transfer through an `EcDirectory` (EC-CONTRACT 10.3, 10.4) fed by the
 * encoders' records: a static list from the harness, or their etcd records (`tapwire-ec-producer
 * --register`, `etcdDirectorySource`). An item a trusted view holds is asked of that holder
 * (`requestPlaced`); an item no view holds is "asked of an encoder" (10.4) as a transfer request
 * to its owner (by hash over the trusted encoders, the same choice in every engine), which
 * encodes it on the miss (`--encode-on-miss`) and publishes its `stored` event, so the next
 * engine to need it finds it resident there. A dead encoder's transfers fail and are encoded
 * locally (the same bytes: lossless); none trusted by the deadline: encoded locally too.
 */
import { type EtcdDirectorySource, etcdDirectorySource } from "@tapwire/discovery";
import {
  type ConsumerConnector,
  type DirectorySource,
  EcDirectory,
  type ProducerRecord,
  staticSource,
} from "@tapwire/ec-connector";
import type { Registry } from "@tapwire/stats";
import { HarnessError, HarnessErrorCode } from "../errors.js";

/** Options of {@link SharedPlacement}. */
export interface SharedPlacementOptions {
  /** Static records, or null to watch etcd. */
  records: readonly ProducerRecord[] | null;
  /** With `records` null: the etcd endpoint and prefix of the encoders' records. */
  etcd: { endpoint: string; prefix: string } | null;
  registry: Registry;
}

/** One engine's placement over the shared encoders (the `placement` of `EcMedia`). */
export class SharedPlacement {
  readonly directory: EcDirectory;
  readonly discovery: "static" | "etcd";
  /** Transfers asked of each encoder (control endpoint). */
  readonly byEncoder = new Map<string, number>();
  /** Encoders the directory ever trusted. */
  readonly seen = new Set<string>();
  readonly stats = { placed: 0, encodesAsked: 0, timedOut: 0 };
  private readonly source: EtcdDirectorySource | null;
  /** When each item was first found without a holder (its deadline runs from there). */
  private readonly asked = new Map<string, number>();

  constructor(o: SharedPlacementOptions) {
    let source: DirectorySource;
    if (o.records !== null) {
      this.source = null;
      this.discovery = "static";
      source = staticSource(o.records);
    } else if (o.etcd !== null) {
      this.source = etcdDirectorySource({
        etcd: o.etcd.endpoint,
        prefix: o.etcd.prefix,
        backoffMs: 100,
        backoffMaxMs: 1000,
      });
      this.discovery = "etcd";
      source = this.source;
    } else {
      throw new HarnessError(HarnessErrorCode.INTERNAL, "SharedPlacement: records or etcd needed");
    }
    this.directory = new EcDirectory({ source, registry: o.registry });
    this.directory.onChange = (c) => {
      if (c.kind === "trusted") this.seen.add(c.producer);
    };
  }

  /** Control endpoints of the encoders trusted now, sorted (the owner choice is the same everywhere). */
  trusted(): string[] {
    const out = this.directory
      .views()
      .filter((v) => v.trusted)
      .map((v) => v.producer)
      .sort();
    for (const p of out) this.seen.add(p);
    return out;
  }

  /** Resolves once `n` encoders are trusted (false after `timeoutMs`). */
  async waitTrusted(n: number, timeoutMs: number): Promise<boolean> {
    const end = performance.now() + timeoutMs;
    while (this.trusted().length < n) {
      if (performance.now() > end) return false;
      await new Promise((r) => setTimeout(r, 20));
    }
    return true;
  }

  /** EC-CONTRACT 10.4: one placement attempt for `mmHash` (see the file comment). */
  place(
    connector: ConsumerConnector,
    mmHash: string,
    nbytes: number,
    deadlineMs: number,
    now: number,
  ): "ready" | "pending" | "waiting" | "fallback" {
    const holder = this.directory.holders(mmHash)[0];
    const r = connector.requestPlaced(mmHash, nbytes, now + deadlineMs, now);
    if (r !== "not-resident") {
      this.asked.delete(mmHash);
      if (r === "pending" && holder !== undefined) {
        this.stats.placed++;
        this.count(holder);
      }
      return r;
    }
    const first = this.asked.get(mmHash) ?? now;
    this.asked.set(mmHash, first);
    if (now - first > deadlineMs) {
      this.asked.delete(mmHash);
      this.stats.timedOut++;
      return "fallback";
    }
    const encoders = this.trusted();
    if (encoders.length === 0) return "waiting"; // none trusted now (all restarting): asked again next poll
    const owner = encoders[Number.parseInt(mmHash.slice(0, 8), 16) % encoders.length] as string;
    const rr = connector.request(mmHash, owner, nbytes, now + deadlineMs, now);
    this.asked.delete(mmHash);
    if (rr === "pending") {
      this.stats.encodesAsked++;
      this.count(owner);
    }
    return rr;
  }

  private count(encoder: string): void {
    this.byEncoder.set(encoder, (this.byEncoder.get(encoder) ?? 0) + 1);
  }

  /** Stops the directory and its etcd watch. */
  async close(): Promise<void> {
    this.directory.close();
    await this.source?.close();
  }
}
