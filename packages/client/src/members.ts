// Where a WorkerPool's members come from (CONTRACT 12.2): a static list or a discovery source.
// The shapes are structural so that @tapwire/discovery implements them without depending on
// this package (etcd3 is installed only by those who ask for discovery).
import { ClientError } from "./errors.js";

/**
 * What a member record says it serves (a discovery record's identities and geometry). A pool
 * ignores a member whose values differ from its own HELLO (CONTRACT 12.2: a pool's workers have
 * the same identities, window, num_spec, vocab_size, row_bytes and sample mode); an absent field
 * is not compared.
 */
export interface PoolMemberCompat {
  /** SHA-256 of the drafter's weights, lower-case hex (64 characters). */
  readonly drafterIdentity?: string;
  /** SHA-256 of the Markov head's weights, lower-case hex. */
  readonly markovIdentity?: string;
  /** Window `W`. */
  readonly window?: number;
  /** Draft tokens per request `N`. */
  readonly numSpec?: number;
  /** Vocabulary size. */
  readonly vocabSize?: number;
  /** Bytes of one tap row. */
  readonly rowBytes?: number;
  /** Sample modes served (`"greedy"`, `"top32"`). */
  readonly sampleModes?: readonly string[];
}

/** One member as a {@link MemberSource} lists it. The endpoint is its key in the pool. */
export interface PoolMemberInfo {
  /** Endpoint URL (CONTRACT 3). Two records with the same endpoint are one member. */
  readonly endpoint: string;
  /** The server process's incarnation (a restarted server has a new one), when known. */
  readonly incarnation?: string;
  /** What the member serves, when known (checked against the pool's HELLO). */
  readonly compat?: PoolMemberCompat;
}

/**
 * A source of pool members (CONTRACT 12.2): a static list ({@link staticMembers}) or a
 * discovery watch (`@tapwire/discovery`'s `etcdMembers`). `subscribe` calls `onMembers` with the
 * whole current list (at once or soon) and again on every change; a member missing from a later
 * list is drained by the pool. A source must never throw into the pool and never make a round
 * wait: a lost discovery service keeps the last list.
 */
export interface MemberSource {
  /** True when members can appear later: a pool over a dynamic source is never disabled for having none. */
  readonly dynamic: boolean;
  /** Starts delivering member lists; returns the function that stops it. */
  subscribe(onMembers: (members: readonly PoolMemberInfo[]) => void): () => void;
}

/**
 * A fixed list of endpoints as a {@link MemberSource} (the embedded default: nothing needs a
 * discovery service unless asked).
 *
 * @throws ClientError `CLIENT_BAD_OPTION` for an empty list or an entry that is not a string.
 */
export function staticMembers(endpoints: readonly string[]): MemberSource {
  if (!Array.isArray(endpoints) || endpoints.length === 0) {
    throw new ClientError(
      "CLIENT_BAD_OPTION",
      "members must be a non-empty list of endpoints or a MemberSource",
    );
  }
  const list: PoolMemberInfo[] = [];
  for (const [i, e] of endpoints.entries()) {
    if (typeof e !== "string" || e.length === 0) {
      throw new ClientError("CLIENT_BAD_OPTION", `members[${i}] must be an endpoint URL, got ${String(e)}`);
    }
    list.push({ endpoint: e });
  }
  Object.freeze(list);
  return {
    dynamic: false,
    subscribe(onMembers) {
      onMembers(list);
      return () => {};
    },
  };
}

/** The first difference between a member's record and the pool's HELLO, or null when compatible. */
export function compatProblem(
  compat: PoolMemberCompat | undefined,
  own: {
    drafterIdentity: string;
    markovIdentity: string;
    window: number;
    numSpec: number;
    vocabSize: number;
    rowBytes: number;
    sampleMode: string;
  },
): string | null {
  if (compat === undefined) return null;
  const pairs: [string, unknown, unknown][] = [
    ["drafter identity", compat.drafterIdentity?.toLowerCase(), own.drafterIdentity],
    ["markov identity", compat.markovIdentity?.toLowerCase(), own.markovIdentity],
    ["window", compat.window, own.window],
    ["num_spec", compat.numSpec, own.numSpec],
    ["vocab_size", compat.vocabSize, own.vocabSize],
    ["row_bytes", compat.rowBytes, own.rowBytes],
  ];
  for (const [name, theirs, ours] of pairs) {
    if (theirs !== undefined && theirs !== ours) return `${name} ${String(theirs)} (pool: ${String(ours)})`;
  }
  if (compat.sampleModes !== undefined && !compat.sampleModes.includes(own.sampleMode)) {
    return `sample modes ${compat.sampleModes.join(",")} (pool: ${own.sampleMode})`;
  }
  return null;
}
