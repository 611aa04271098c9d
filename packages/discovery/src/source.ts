// Member sources for a WorkerPool (CONTRACT 12.2): a static list, and an etcd watch of a prefix.
// The shapes match @tapwire/client's MemberSource structurally (this package does not depend on
// the client). The etcd source lists the prefix, then watches it from the next revision; when
// the watch stream is lost it keeps the last list (a pool never waits on etcd and loses no
// member), and when it is back it lists again, so deletions made meanwhile are seen even after
// a compaction.
import { Etcd3, type IKeyValue, type Watcher } from "etcd3";
import { badOption } from "./errors.js";
import type { MemberRecord, RecordKind } from "./record.js";
import { DEFAULT_PREFIX, parseRecord, RECORD_KINDS } from "./record.js";
import type { DiscoveryLogger } from "./url.js";
import { checkPrefix, etcdHosts, positive, silentLogger } from "./url.js";

/** What a pool compares with its HELLO (the shape of @tapwire/client's `PoolMemberCompat`). */
export interface MemberCompat {
  /** Drafter identity, hex. */
  readonly drafterIdentity?: string;
  /** Markov identity, hex. */
  readonly markovIdentity?: string;
  /** Window `W`. */
  readonly window?: number;
  /** `N`. */
  readonly numSpec?: number;
  /** Vocabulary size. */
  readonly vocabSize?: number;
  /** Row bytes. */
  readonly rowBytes?: number;
  /** Sample modes served. */
  readonly sampleModes?: readonly string[];
}

/** One member as a pool sees it (the shape of @tapwire/client's `PoolMemberInfo`). */
export interface MemberInfo {
  /** Endpoint URL (the record's primary endpoint). */
  readonly endpoint: string;
  /** The record's incarnation. */
  readonly incarnation?: string;
  /** Identities and geometry from the record. */
  readonly compat?: MemberCompat;
  /** The whole record (etcd sources only). */
  readonly record?: MemberRecord;
}

/** A member source (the shape of @tapwire/client's `MemberSource`). */
export interface MemberSource {
  /** True when members may appear later. */
  readonly dynamic: boolean;
  /** Delivers the whole member list now or soon and on every change; returns the stop function. */
  subscribe(onMembers: (members: readonly MemberInfo[]) => void): () => void;
}

/**
 * A fixed endpoint list as a {@link MemberSource}.
 *
 * @throws DiscoveryError `DISCOVERY_BAD_OPTION` for an empty list or a non-string entry.
 */
export function staticMembers(endpoints: readonly string[]): MemberSource {
  if (!Array.isArray(endpoints) || endpoints.length === 0)
    throw badOption("endpoints", "a non-empty list", endpoints);
  for (const e of endpoints) if (typeof e !== "string" || e === "") throw badOption("endpoints", "URLs", e);
  const list = Object.freeze(endpoints.map((endpoint) => ({ endpoint })));
  return {
    dynamic: false,
    subscribe(on) {
      on(list);
      return () => {};
    },
  };
}

/** The pool's view of a worker record: its primary endpoint, incarnation and compat fields. */
export function memberInfoOf(rec: MemberRecord): MemberInfo {
  const g = rec.geometry;
  const num = (k: string): number | undefined => (typeof g[k] === "number" ? (g[k] as number) : undefined);
  const modes = g.sample_modes;
  const compat: MemberCompat = {
    ...(rec.identities.drafter !== undefined ? { drafterIdentity: rec.identities.drafter } : {}),
    ...(rec.identities.markov !== undefined ? { markovIdentity: rec.identities.markov } : {}),
    ...(num("window") !== undefined ? { window: num("window")! } : {}),
    ...(num("num_spec") !== undefined ? { numSpec: num("num_spec")! } : {}),
    ...(num("vocab_size") !== undefined ? { vocabSize: num("vocab_size")! } : {}),
    ...(num("row_bytes") !== undefined ? { rowBytes: num("row_bytes")! } : {}),
    ...(Array.isArray(modes) ? { sampleModes: modes as readonly string[] } : {}),
  };
  return { endpoint: rec.endpoints[0]!, incarnation: rec.incarnation, compat, record: rec };
}

/** Defaults of {@link EtcdMembersOptions}. */
export const ETCD_MEMBERS_DEFAULTS = {
  /** Key prefix. */
  prefix: DEFAULT_PREFIX,
  /** Records of this kind. */
  kind: "worker" as RecordKind,
  /** First relist delay after a failure, ms. */
  backoffMs: 250,
  /** Relist delay ceiling, ms. */
  backoffMaxMs: 5_000,
} as const;

/** Options of {@link etcdMembers}. */
export interface EtcdMembersOptions {
  /** etcd URL: `etcd://host:port[,host:port…]`. */
  etcd: string;
  /** Key prefix (default `/tapwire/v1/`). */
  prefix?: string;
  /** Record kind to list (default `"worker"`). */
  kind?: RecordKind;
  /** Logger (default silent). */
  logger?: DiscoveryLogger;
  /** First relist delay after a failure, ms (default 250; doubles up to `backoffMaxMs`). */
  backoffMs?: number;
  /** Relist delay ceiling, ms (default 5000). */
  backoffMaxMs?: number;
}

/** An etcd watch as a {@link MemberSource}, with what it saw (for tests and reports). */
export interface EtcdMemberSource extends MemberSource {
  /** Records currently known, by key. */
  records(): ReadonlyMap<string, MemberRecord>;
  /** True while the watch stream is connected. */
  readonly connected: boolean;
  /** Full listings done (1 + one per reconnect). */
  readonly listings: number;
  /** Stops the watch and closes the etcd client. */
  close(): Promise<void>;
}

class EtcdSource implements EtcdMemberSource {
  readonly dynamic = true;
  connected = false;
  listings = 0;
  readonly #client: Etcd3;
  readonly #prefix: string;
  readonly #kind: RecordKind;
  readonly #log: DiscoveryLogger;
  readonly #backoffMs: number;
  readonly #backoffMaxMs: number;
  readonly #records = new Map<string, MemberRecord>();
  readonly #badLogged = new Set<string>();
  readonly #listeners = new Set<(m: readonly MemberInfo[]) => void>();
  #watcher: Watcher | null = null;
  #started = false;
  #closed = false;
  #relisting = false;
  #lostLogged = false;
  #wake: () => void = () => {};
  #loop: Promise<void> | null = null;

  constructor(
    client: Etcd3,
    prefix: string,
    kind: RecordKind,
    log: DiscoveryLogger,
    backoffMs: number,
    backoffMaxMs: number,
  ) {
    this.#client = client;
    this.#prefix = prefix;
    this.#kind = kind;
    this.#log = log;
    this.#backoffMs = backoffMs;
    this.#backoffMaxMs = backoffMaxMs;
  }

  records(): ReadonlyMap<string, MemberRecord> {
    return this.#records;
  }

  subscribe(on: (m: readonly MemberInfo[]) => void): () => void {
    this.#listeners.add(on);
    if (this.listings > 0) on(this.#list());
    if (!this.#started) {
      this.#started = true;
      this.#loop = this.#run();
    }
    return () => {
      this.#listeners.delete(on);
    };
  }

  #list(): MemberInfo[] {
    // newest first: a restarted server's record wins over its predecessor's at the same endpoint
    return [...this.#records.values()]
      .filter((r) => r.kind === this.#kind)
      .sort((a, b) => Date.parse(b.startedAt) - Date.parse(a.startedAt))
      .map(memberInfoOf);
  }

  #emit(): void {
    const list = this.#list();
    for (const l of this.#listeners) {
      try {
        l(list);
      } catch (e) {
        this.#log.error({ err: String(e) }, "tapwire discovery: member listener failed");
      }
    }
  }

  #apply(kv: IKeyValue): boolean {
    const key = kv.key.toString();
    try {
      this.#records.set(key, parseRecord(kv.value));
      return true;
    } catch (e) {
      if (!this.#badLogged.has(key)) {
        this.#badLogged.add(key);
        this.#log.warn(
          { key, err: e instanceof Error ? e.message : String(e) },
          `tapwire discovery: record ${key} ignored: ${e instanceof Error ? e.message : String(e)}`,
        );
      }
      return this.#records.delete(key);
    }
  }

  async #relist(): Promise<string> {
    const res = await this.#client.getAll().prefix(this.#prefix).exec();
    this.#records.clear();
    for (const kv of res.kvs) this.#apply(kv);
    this.listings++;
    this.#emit();
    return res.header.revision;
  }

  async #run(): Promise<void> {
    let delay = this.#backoffMs;
    while (!this.#closed) {
      try {
        const rev = await this.#relist();
        const w = await this.#client
          .watch()
          .prefix(this.#prefix)
          .startRevision(String(BigInt(rev) + 1n))
          .create();
        if (this.#closed) {
          await w.cancel().catch(() => {});
          break;
        }
        this.#watcher = w;
        this.connected = true;
        if (this.#lostLogged) this.#log.info({ prefix: this.#prefix }, "tapwire discovery: etcd watch back");
        this.#lostLogged = false;
        delay = this.#backoffMs;
        w.on("put", (kv) => {
          this.#apply(kv);
          this.#emit();
        });
        w.on("delete", (kv) => {
          if (this.#records.delete(kv.key.toString())) this.#emit();
        });
        // the watcher reconnects by itself; after a loss list again (deletes made meanwhile)
        await new Promise<void>((resolve) => {
          this.#wake = resolve;
          w.on("disconnected", (e) => {
            this.connected = false;
            if (!this.#lostLogged) {
              this.#lostLogged = true;
              this.#log.warn(
                { err: e?.message },
                "tapwire discovery: etcd watch lost; keeping the last members",
              );
            }
          });
          w.on("connected", () => {
            if (this.connected || this.#relisting) return;
            this.#relisting = true;
            this.#relist()
              .then(() => {
                this.connected = true;
                this.#log.info(
                  { prefix: this.#prefix },
                  "tapwire discovery: etcd watch back; members listed again",
                );
                this.#lostLogged = false;
              })
              .catch(() => {})
              .finally(() => {
                this.#relisting = false;
              });
          });
          w.on("error", () => resolve());
          w.on("end", () => resolve());
        });
        this.connected = false;
        this.#watcher = null;
        await w.cancel().catch(() => {});
      } catch (e) {
        this.connected = false;
        if (!this.#lostLogged) {
          this.#lostLogged = true;
          this.#log.warn(
            { err: e instanceof Error ? e.message : String(e) },
            `tapwire discovery: cannot list ${this.#prefix}: ${e instanceof Error ? e.message : String(e)}; keeping the last members, retrying`,
          );
        }
      }
      if (this.#closed) break;
      await new Promise<void>((resolve) => {
        this.#wake = resolve;
        const t = setTimeout(resolve, delay);
        t.unref?.();
      });
      delay = Math.min(delay * 2, this.#backoffMaxMs);
    }
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#listeners.clear();
    this.#wake();
    const w = this.#watcher;
    if (w !== null) await w.cancel().catch(() => {});
    await this.#loop;
    this.#client.close();
  }
}

/**
 * Pool members from etcd (CONTRACT 12.2): the records of `kind` under `prefix`, watched. A lost
 * etcd keeps the last list and reconnects with backoff; records that are not valid schema-1
 * JSON are ignored (logged once per key).
 *
 * @throws DiscoveryError `DISCOVERY_BAD_OPTION` naming a bad option.
 */
export function etcdMembers(options: EtcdMembersOptions): EtcdMemberSource {
  if (options === null || typeof options !== "object") throw badOption("options", "an object", options);
  const hosts = etcdHosts(options.etcd);
  const prefix = checkPrefix(options.prefix ?? ETCD_MEMBERS_DEFAULTS.prefix);
  const kind = options.kind ?? ETCD_MEMBERS_DEFAULTS.kind;
  if (!(RECORD_KINDS as readonly string[]).includes(kind)) throw badOption("kind", "worker or encoder", kind);
  const backoffMs = positive("backoffMs", options.backoffMs, ETCD_MEMBERS_DEFAULTS.backoffMs);
  const backoffMaxMs = positive("backoffMaxMs", options.backoffMaxMs, ETCD_MEMBERS_DEFAULTS.backoffMaxMs);
  if (backoffMaxMs < backoffMs) throw badOption("backoffMaxMs", `>= backoffMs (${backoffMs})`, backoffMaxMs);
  const log = options.logger ?? silentLogger;
  const client = new Etcd3({ hosts, dialTimeout: 2_000 });
  return new EtcdSource(client, prefix, kind, log, backoffMs, backoffMaxMs);
}
