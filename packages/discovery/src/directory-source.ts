// Issue 22: the encoders of an etcd prefix as a directory source for @tapwire/ec-connector's
// EcDirectory (EC-CONTRACT 10.3). The shapes below match ec-connector's `DirectorySource` and
// `ProducerRecord` structurally (this package does not depend on ec-connector; a test there
// assigns one to the other so a drift fails the type check). Built on etcdMembers: the same
// list-then-watch, the same "etcd lost keeps the last list", the same relist after a loss.
import { badOption } from "./errors.js";
import type { MemberRecord } from "./record.js";
import type { EtcdMemberSource, EtcdMembersOptions, MemberInfo } from "./source.js";
import { etcdMembers } from "./source.js";
import { silentLogger } from "./url.js";

/** One encoder as a directory sees it (the shape of @tapwire/ec-connector's `ProducerRecord`). */
export interface EncoderDirectoryRecord {
  /** The producer's control ROUTER endpoint (the record's primary endpoint). */
  control: string;
  /** Its events PUB endpoint (the record's `residency.events`). */
  events: string;
  /** Its replay ROUTER endpoint (the record's `residency.replay`). */
  replay: string;
  /** The stream incarnation it registered (`residency.incarnation`), when not empty. */
  incarnation?: string;
}

/** A directory source (the shape of @tapwire/ec-connector's `DirectorySource`). */
export interface EncoderDirectorySource {
  /** Delivers the whole encoder list now or soon and on every change; returns the stop function. */
  watch(onRecords: (records: readonly EncoderDirectoryRecord[]) => void): () => void;
}

/** Options of {@link etcdDirectorySource}: those of `etcdMembers` (kind is always `encoder`) and a compat filter. */
export interface EtcdDirectorySourceOptions extends Omit<EtcdMembersOptions, "kind"> {
  /**
   * Keep only encoders whose `identities.ec_compat` equals this hex (the producers a consumer of
   * this compatibility hash may read from); others are ignored, logged once. Default: all.
   */
  ecCompat?: string;
}

/** An etcd watch of encoder records as an {@link EncoderDirectorySource}. */
export interface EtcdDirectorySource extends EncoderDirectorySource {
  /** The encoder list as last delivered. */
  records(): readonly EncoderDirectoryRecord[];
  /** The underlying member watch (its records, `connected`, `listings`). */
  readonly members: EtcdMemberSource;
  /** Stops the watch and closes the etcd client. */
  close(): Promise<void>;
}

/**
 * The directory record of an encoder member record, or null when it carries no residency stream
 * (a producer without `--events-listen`) or is not an encoder.
 */
export function directoryRecordOf(rec: MemberRecord): EncoderDirectoryRecord | null {
  if (rec.kind !== "encoder" || rec.residency === undefined) return null;
  const r = rec.residency;
  return {
    control: rec.endpoints[0]!,
    events: r.events,
    replay: r.replay,
    ...(r.incarnation !== "" ? { incarnation: r.incarnation } : {}),
  };
}

/**
 * Issue 22: encoders found through etcd for an `EcDirectory` (EC-CONTRACT 10.3): the `encoder`
 * records under `prefix` that carry a `residency` object, one per control endpoint (the newest
 * record wins when a restarted producer reuses one). A record that disappears (revoked on a clean
 * stop, or its lease expired) removes the producer from the list; while etcd is unreachable the
 * last list stays. Records without `residency`, or of another `ecCompat`, are ignored (logged
 * once per key).
 *
 * @throws DiscoveryError `DISCOVERY_BAD_OPTION` naming a bad option.
 */
export function etcdDirectorySource(options: EtcdDirectorySourceOptions): EtcdDirectorySource {
  if (options === null || typeof options !== "object") throw badOption("options", "an object", options);
  const { ecCompat, ...rest } = options;
  if (ecCompat !== undefined && (typeof ecCompat !== "string" || !/^[0-9a-f]{1,128}$/.test(ecCompat)))
    throw badOption("ecCompat", "lower-case hex", ecCompat);
  const log = options.logger ?? silentLogger;
  const members = etcdMembers({ ...rest, kind: "encoder" });
  const ignored = new Set<string>();
  let last: readonly EncoderDirectoryRecord[] = [];
  const once = (key: string, why: string): void => {
    if (ignored.has(key)) return;
    ignored.add(key);
    log.warn({ key, why }, `tapwire discovery: encoder ${key} not in the directory: ${why}`);
  };
  const map = (list: readonly MemberInfo[]): EncoderDirectoryRecord[] => {
    const out: EncoderDirectoryRecord[] = [];
    const seen = new Set<string>();
    // etcdMembers lists newest first: the first record of a control endpoint wins
    for (const m of list) {
      const rec = m.record;
      if (rec === undefined) continue;
      if (ecCompat !== undefined && rec.identities.ec_compat !== ecCompat) {
        once(rec.incarnation, `ec_compat ${rec.identities.ec_compat ?? "(none)"} is not ${ecCompat}`);
        continue;
      }
      const d = directoryRecordOf(rec);
      if (d === null) {
        once(rec.incarnation, "no residency endpoints (started without --events-listen)");
        continue;
      }
      if (seen.has(d.control)) continue;
      seen.add(d.control);
      out.push(d);
    }
    return out;
  };
  return {
    members,
    records: () => last,
    watch(onRecords) {
      return members.subscribe((list) => {
        last = map(list);
        onRecords(last);
      });
    },
    close: () => members.close(),
  };
}
