/**
 * `--encoders N --placement-discovery etcd` (issue 22 x issue 21): the placement run's encoders
 * register in an etcd child (`tapwire-ec-producer --register`, records carrying their residency
 * endpoints), and the directory learns them from etcd (`etcdDirectorySource`) instead of the
 * static list. With `--faults` the records' events endpoints are swapped for the lossy relays'
 * (a restarted encoder's new events endpoint, which has no relay, is used directly).
 */
import { type EtcdDirectorySource, etcdDirectorySource } from "@tapwire/discovery";
import type { DirectorySource, ProducerRecord } from "@tapwire/ec-connector";
import { type EtcdChild, startEtcd } from "@tapwire/testing";
import type { RunScope } from "../procs/children.js";

/** The key prefix of the placement run's records. */
export const PLACEMENT_PREFIX = "/tapwire-harness/v1/";
/** Lease TTL of the encoders' records, seconds (a SIGKILLed encoder leaves within it). */
export const PLACEMENT_TTL_S = 5;

/** The etcd side of a placement run. */
export interface PlacementEtcd {
  readonly etcd: EtcdChild;
  /** The flags each encoder gets (`--register …`). */
  readonly registerArgs: string[];
  /** The etcd watch (records seen, `connected`). */
  readonly source: EtcdDirectorySource;
  /** A directory source over the watch, events endpoints replaced by `relays` (events → relay). */
  relayed(relays: ReadonlyMap<string, string>): DirectorySource;
}

/** Starts the etcd child (cleaned up with the run) and the watch of the encoders' records. */
export async function startPlacementEtcd(scope: RunScope): Promise<PlacementEtcd> {
  const etcd = await startEtcd();
  scope.cleanups.push(() => etcd.close());
  const source = etcdDirectorySource({
    etcd: etcd.endpoint,
    prefix: PLACEMENT_PREFIX,
    backoffMs: 100,
    backoffMaxMs: 1000,
  });
  scope.cleanups.push(() => source.close());
  return {
    etcd,
    registerArgs: [
      "--register",
      etcd.endpoint,
      "--register-prefix",
      PLACEMENT_PREFIX,
      "--register-ttl",
      String(PLACEMENT_TTL_S),
    ],
    source,
    relayed(relays) {
      return {
        watch(on) {
          return source.watch((records) =>
            on(records.map((r): ProducerRecord => ({ ...r, events: relays.get(r.events) ?? r.events }))),
          );
        },
      };
    },
  };
}
