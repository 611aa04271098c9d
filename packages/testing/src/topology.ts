import { TestingError, TestingErrorCode } from "./errors.js";
import type { LinkSpec } from "./link-spec.js";
import { LINK_NONE, linkNeedsRelay, parseLinkSpec, tbfBurstBytes } from "./link-spec.js";
import type { Namespace } from "./netns.js";
import {
  addVethPair,
  createNamespace,
  removeNamespace,
  requireRoot,
  runNetCommand,
  shapeEgress,
} from "./netns.js";

/** Options of {@link createStarTopology}. */
export interface StarTopologyOptions {
  /** Roles of the leaf namespaces (`engine`, `worker0`, `encoder0`…), each joined to the hub by a veth pair. */
  leaves: readonly string[];
  /**
   * Leaves that serve (their servers are connected to). When the link needs a relay, the hub takes
   * over their addresses so every connection to them ends at the relay, which forwards it to the
   * real server (see {@link relayLeafPort}). Default: every leaf but the first.
   */
  servers?: readonly string[];
  /** The link of every veth: a spec string or a parsed {@link LinkSpec} (default none). */
  link?: LinkSpec | string;
  /** Role of the middle namespace (default `router`). */
  hub?: string;
}

/** One leaf of a star topology: its namespace and the veth pair to the hub. */
export interface StarLeaf {
  /** The role given in {@link StarTopologyOptions.leaves}. */
  readonly role: string;
  /** The leaf's namespace name. */
  readonly netns: string;
  /** Its device (`eth0`). */
  readonly dev: string;
  /** Its IPv4 address (`198.18.<i+1>.2`): what its servers bind and what peers connect to. */
  readonly address: string;
  /** The hub's device towards this leaf (`to-<role>`). */
  readonly hubDev: string;
  /** The hub's address on this link (`198.18.<i+1>.1`), the leaf's default gateway. */
  readonly hubAddress: string;
}

/**
 * Everything a process needs to use a star topology another process created (JSON-serialisable:
 * the harness passes it to itself re-executed inside the engine's namespace).
 */
export interface StarTopologyPlan {
  /** The hub (router) namespace. */
  readonly hub: { readonly role: string; readonly netns: string };
  /** The leaves, in the order given. */
  readonly leaves: readonly StarLeaf[];
  /** The link every veth has. */
  readonly link: LinkSpec;
  /** Roles whose addresses the hub takes over for the relay (empty: plain IP forwarding). */
  readonly relayed: readonly string[];
}

/** A star topology created by {@link createStarTopology}. */
export interface StarTopology {
  /** What was created. */
  readonly plan: StarTopologyPlan;
  /** The leaf of `role` (`TESTING_BAD_OPTION` if there is none). */
  leaf(role: string): StarLeaf;
  /** Removes every namespace (and with them every veth and every process inside). */
  close(): Promise<void>;
}

/** The policy-routing table through which the relay reaches the real servers. */
const RELAY_TABLE = "100";

/** The leaf of `role` in `plan`. @throws TestingError `TESTING_BAD_OPTION` when there is none. */
export function planLeaf(plan: StarTopologyPlan, role: string): StarLeaf {
  const l = plan.leaves.find((x) => x.role === role);
  if (l === undefined) {
    throw new TestingError(
      TestingErrorCode.BAD_OPTION,
      `no leaf ${JSON.stringify(role)} (leaves: ${plan.leaves.map((x) => x.role).join(", ")})`,
    );
  }
  return l;
}

/**
 * Creates a star: a hub ("router") namespace and one namespace per leaf, each leaf joined to the
 * hub by a veth pair on its own /24 of {@link TEST_NET} (leaf `i`: hub `198.18.<i+1>.1`, leaf
 * `198.18.<i+1>.2`, default route via the hub). The hub forwards IPv4 between the leaves. A link
 * `rate` puts a tbf on both ends of every veth. A link needing a relay (delay, jitter, stall)
 * makes the hub own each server leaf's address on its loopback, so connections to it end in the
 * hub, and adds a source rule (`from <hub address> lookup 100`, consulted before the local table)
 * through which a relay bound to the hub's address reaches the real server over the veth.
 * Start the relay with {@link startRelay} in `plan.hub.netns`, then {@link relayLeafPort} per port.
 *
 * Anything created is removed again if a step fails.
 *
 * @throws TestingError `TESTING_NOT_ROOT`, `TESTING_BAD_OPTION` (roles, link), `TESTING_NETNS`.
 */
export async function createStarTopology(opts: StarTopologyOptions): Promise<StarTopology> {
  requireRoot("a star topology of network namespaces");
  const leaves = opts.leaves;
  if (!Array.isArray(leaves) || leaves.length === 0 || leaves.length > 200) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, "option leaves must be 1 to 200 roles");
  }
  if (new Set(leaves).size !== leaves.length) {
    throw new TestingError(
      TestingErrorCode.BAD_OPTION,
      `option leaves ${JSON.stringify(leaves)} repeats a role`,
    );
  }
  const servers = opts.servers ?? leaves.slice(1);
  for (const s of servers) {
    if (!leaves.includes(s)) {
      throw new TestingError(
        TestingErrorCode.BAD_OPTION,
        `option servers: ${JSON.stringify(s)} is not a leaf`,
      );
    }
  }
  const link = typeof opts.link === "string" ? parseLinkSpec(opts.link) : (opts.link ?? LINK_NONE);
  const relayed = linkNeedsRelay(link) ? [...servers] : [];
  const made: Namespace[] = [];
  try {
    const hub = await createNamespace(opts.hub ?? "router");
    made.push(hub);
    const planLeaves: StarLeaf[] = [];
    for (const [i, role] of leaves.entries()) {
      const ns = await createNamespace(role);
      made.push(ns);
      const leaf: StarLeaf = {
        role,
        netns: ns.name,
        dev: "eth0",
        address: `198.18.${i + 1}.2`,
        hubDev: `to-${role}`,
        hubAddress: `198.18.${i + 1}.1`,
      };
      await addVethPair(
        { netns: ns.name, dev: leaf.dev, address: `${leaf.address}/24` },
        { netns: hub.name, dev: leaf.hubDev, address: `${leaf.hubAddress}/24` },
      );
      await runNetCommand("ip", ["-n", ns.name, "route", "add", "default", "via", leaf.hubAddress]);
      if (link.rateBitsPerSec !== null) {
        const burst = tbfBurstBytes(link);
        await shapeEgress(ns.name, leaf.dev, link.rateBitsPerSec, burst);
        await shapeEgress(hub.name, leaf.hubDev, link.rateBitsPerSec, burst);
      }
      planLeaves.push(leaf);
    }
    await hub.exec("sysctl", ["-qw", "net.ipv4.ip_forward=1"]);
    if (relayed.length > 0) {
      for (const role of relayed) {
        const l = planLeaves.find((x) => x.role === role)!;
        await runNetCommand("ip", ["-n", hub.name, "addr", "add", `${l.address}/32`, "dev", "lo"]);
        await runNetCommand("ip", [
          "-n",
          hub.name,
          "route",
          "add",
          `${l.address}/32`,
          "dev",
          l.hubDev,
          "src",
          l.hubAddress,
          "table",
          RELAY_TABLE,
        ]);
        await runNetCommand("ip", [
          "-n",
          hub.name,
          "rule",
          "add",
          "pref",
          "10",
          "from",
          l.hubAddress,
          "lookup",
          RELAY_TABLE,
        ]);
      }
      // The local table after the source rules, so the relay's own connections to a taken-over
      // address leave through the veth instead of looping back to the relay.
      await runNetCommand("ip", ["-n", hub.name, "rule", "add", "pref", "100", "lookup", "local"]);
      await runNetCommand("ip", ["-n", hub.name, "rule", "del", "pref", "0"]);
    }
    const plan: StarTopologyPlan = {
      hub: { role: hub.role, netns: hub.name },
      leaves: planLeaves,
      link,
      relayed,
    };
    let closing: Promise<void> | null = null;
    return {
      plan,
      leaf: (role) => planLeaf(plan, role),
      close: () => {
        closing ??= (async () => {
          for (const ns of [...made].reverse()) await removeNamespace(ns.name);
        })();
        return closing;
      },
    };
  } catch (err) {
    for (const ns of [...made].reverse()) await removeNamespace(ns.name).catch(() => {});
    throw err;
  }
}
