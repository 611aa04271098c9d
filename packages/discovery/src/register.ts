// register(): a server's record under an etcd lease (TTL default 10 s), kept alive by the etcd3
// client, put again under a new lease when the old one is lost (etcd gone longer than 2 TTLs, or
// the lease expired), revoked on a clean stop so that pools drain the server at once. The
// server never waits on etcd: register() returns at once, `ready` resolves on the first put.
import { Etcd3, type Lease } from "etcd3";
import { badOption } from "./errors.js";
import type { MemberRecord, RecordInput } from "./record.js";
import { DEFAULT_PREFIX, encodeRecord, makeRecord, recordKey } from "./record.js";
import type { DiscoveryLogger } from "./url.js";
import { checkPrefix, etcdHosts, positive, silentLogger } from "./url.js";

/** Defaults of {@link RegisterOptions}. */
export const REGISTER_DEFAULTS = {
  /** Key prefix. */
  prefix: DEFAULT_PREFIX,
  /** Lease TTL, seconds. */
  ttlSeconds: 10,
  /** First retry delay after a failed put, ms (doubles up to `backoffMaxMs`). */
  backoffMs: 250,
  /** Retry delay ceiling, ms. */
  backoffMaxMs: 5_000,
  /** Time allowed for the revoke of a clean stop, ms. */
  revokeTimeoutMs: 2_000,
} as const;

/** Options of {@link register}. */
export interface RegisterOptions {
  /** etcd URL: `etcd://host:port[,host:port…]`. */
  etcd: string;
  /** Key prefix (default `/tapwire/v1/`). */
  prefix?: string;
  /** Lease TTL in seconds (default 10; etcd may raise very small values to its minimum). */
  ttlSeconds?: number;
  /** The record (kind, endpoints, identities, geometry, capacity). */
  record: RecordInput;
  /** Logger (default silent). */
  logger?: DiscoveryLogger;
  /** First retry delay after a failed put, ms (default 250). */
  backoffMs?: number;
  /** Retry delay ceiling, ms (default 5000). */
  backoffMaxMs?: number;
}

/** A live registration. */
export interface Registration {
  /** The record's key, `<prefix><kind>/<incarnation>`. */
  readonly key: string;
  /** The record as stored. */
  readonly record: MemberRecord;
  /** Resolves on the first successful put (never rejects; pending while etcd is unreachable). */
  readonly ready: Promise<void>;
  /** Successful puts so far (more than 1 after a lost lease). */
  readonly puts: number;
  /** True while the record is believed stored under a live lease. */
  readonly registered: boolean;
  /** Revokes the lease (the record disappears at once) and closes the etcd client. Idempotent. */
  close(): Promise<void>;
}

function sleep(ms: number, cancel: Promise<void>): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    t.unref?.();
    void cancel.then(() => {
      clearTimeout(t);
      resolve();
    });
  });
}

class Reg implements Registration {
  readonly key: string;
  readonly record: MemberRecord;
  readonly ready: Promise<void>;
  puts = 0;
  registered = false;
  readonly #client: Etcd3;
  readonly #value: string;
  readonly #ttl: number;
  readonly #log: DiscoveryLogger;
  readonly #backoffMs: number;
  readonly #backoffMaxMs: number;
  #lease: Lease | null = null;
  #closed = false;
  #closing: Promise<void> | null = null;
  #markReady: () => void = () => {};
  #signalClosed: () => void = () => {};
  readonly #closedP: Promise<void>;
  readonly #loop: Promise<void>;
  constructor(
    client: Etcd3,
    key: string,
    record: MemberRecord,
    o: Required<Omit<RegisterOptions, "etcd" | "record" | "prefix">>,
  ) {
    this.#client = client;
    this.key = key;
    this.record = record;
    this.#value = encodeRecord(record);
    this.#ttl = o.ttlSeconds;
    this.#log = o.logger;
    this.#backoffMs = o.backoffMs;
    this.#backoffMaxMs = o.backoffMaxMs;
    this.ready = new Promise((r) => {
      this.#markReady = r;
    });
    this.#closedP = new Promise((r) => {
      this.#signalClosed = r;
    });
    this.#loop = this.#run();
  }

  async #run(): Promise<void> {
    let delay = this.#backoffMs;
    let failing = 0;
    while (!this.#closed) {
      const lease = this.#client.lease(this.#ttl, { autoKeepAlive: true });
      this.#lease = lease;
      let lostErr: unknown = null;
      const lost = new Promise<void>((resolve) => {
        lease.once("lost", (e) => {
          lostErr = e;
          resolve();
        });
      });
      try {
        await Promise.race([
          lease.put(this.key).value(this.#value).exec(),
          lost.then(() => Promise.reject(lostErr)),
        ]);
        if (this.#closed) break;
        this.puts++;
        this.registered = true;
        delay = this.#backoffMs;
        this.#log.info(
          {
            key: this.key,
            incarnation: this.record.incarnation,
            ttl: this.#ttl,
            endpoints: this.record.endpoints,
            afterFailures: failing,
          },
          `tapwire discovery: registered ${this.key} (lease ${this.#ttl} s)`,
        );
        failing = 0;
        this.#markReady();
        await Promise.race([lost, this.#closedP]);
        if (this.#closed) break;
        this.registered = false;
        this.#log.warn(
          { key: this.key, err: lostErr instanceof Error ? lostErr.message : String(lostErr) },
          `tapwire discovery: lease of ${this.key} lost; registering again`,
        );
      } catch (e) {
        this.registered = false;
        failing++;
        if (failing === 1) {
          this.#log.warn(
            { key: this.key, err: e instanceof Error ? e.message : String(e) },
            `tapwire discovery: cannot register ${this.key}: ${e instanceof Error ? e.message : String(e)} (retrying with backoff)`,
          );
        }
        lease.release();
      }
      if (this.#closed) break;
      await sleep(delay, this.#closedP);
      delay = Math.min(delay * 2, this.#backoffMaxMs);
    }
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#closed = true;
      this.#signalClosed();
      const lease = this.#lease;
      if (lease !== null && this.registered) {
        try {
          await Promise.race([
            lease.revoke(),
            new Promise((_, reject) => {
              const t = setTimeout(
                () => reject(new Error("revoke timed out")),
                REGISTER_DEFAULTS.revokeTimeoutMs,
              );
              t.unref?.();
            }),
          ]);
          this.#log.info({ key: this.key }, `tapwire discovery: ${this.key} revoked`);
        } catch (e) {
          this.#log.warn(
            { key: this.key, err: e instanceof Error ? e.message : String(e) },
            `tapwire discovery: revoke of ${this.key} failed (the record expires with its lease)`,
          );
          lease.release();
        }
      } else lease?.release();
      this.registered = false;
      await this.#loop;
      this.#client.close();
    })();
    return this.#closing;
  }
}

/**
 * Registers a server's record in etcd under a lease and keeps it there until `close()`
 * (docs/operations.md "Discovery records"). Returns at once; the first put happens in the
 * background and is retried with backoff while etcd is unreachable (the server keeps serving).
 *
 * @throws DiscoveryError `DISCOVERY_BAD_OPTION` naming a bad option, `DISCOVERY_BAD_RECORD` for
 *   a bad record.
 */
export function register(options: RegisterOptions): Registration {
  if (options === null || typeof options !== "object") throw badOption("options", "an object", options);
  const hosts = etcdHosts(options.etcd);
  const prefix = checkPrefix(options.prefix ?? REGISTER_DEFAULTS.prefix);
  const ttl = positive("ttlSeconds", options.ttlSeconds, REGISTER_DEFAULTS.ttlSeconds);
  if (!Number.isInteger(ttl)) throw badOption("ttlSeconds", "a whole number of seconds", ttl);
  const backoffMs = positive("backoffMs", options.backoffMs, REGISTER_DEFAULTS.backoffMs);
  const backoffMaxMs = positive("backoffMaxMs", options.backoffMaxMs, REGISTER_DEFAULTS.backoffMaxMs);
  if (backoffMaxMs < backoffMs) throw badOption("backoffMaxMs", `>= backoffMs (${backoffMs})`, backoffMaxMs);
  if (options.record === null || typeof options.record !== "object")
    throw badOption("record", "an object", options.record);
  const record = makeRecord(options.record);
  const logger = options.logger ?? silentLogger;
  if (typeof logger.warn !== "function") throw badOption("logger", "a pino-compatible logger", logger);
  const client = new Etcd3({ hosts, dialTimeout: 2_000 });
  return new Reg(client, recordKey(prefix, record), record, {
    ttlSeconds: ttl,
    logger,
    backoffMs,
    backoffMaxMs,
  });
}
