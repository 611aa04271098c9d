/**
 * Where the run's processes live and how the engine reaches their servers: the topology
 * interface, and the local topology (everything on this host's loopback). The netns topology is
 * `topology-netns.ts`.
 */
import type { HarnessConfig } from "../cli/cli.js";
import { NetnsTopology } from "./topology-netns.js";

/** The servers a run starts. */
export type ServerRole = "worker" | "encoder";

/** What the report says about the topology. */
export interface TopologyReport {
  /** `local` or `netns`. */
  kind: "local" | "netns";
  /** The link spec of every veth (`none` locally). */
  link: string;
  /** Role → namespace and address (netns only). */
  hosts: Record<string, { netns: string; address: string }>;
  /** The relay in the router namespace, when the link needs one: bytes and impairment per forward. */
  relay: Array<{
    listen: string;
    connections: number;
    bytesUp: number;
    bytesDown: number;
    delayedChunks: number;
    stalls: number;
  }> | null;
}

/**
 * A topology: where each server runs and binds, and what makes a port of it reachable from the
 * engine. The children (`children.ts`) ask it; the run (`run.ts`) closes it.
 */
export interface Topology {
  /** `local` or `netns`. */
  readonly kind: "local" | "netns";
  /**
   * The address a server of `role` binds its listening sockets to: `127.0.0.1`, or `0.0.0.0` in a
   * namespace of its own, as an operator would (it then advertises {@link Topology.address}).
   */
  bindHost(role: ServerRole): string;
  /** The address peers reach a server of `role` at (its `--advertise`; admin and metrics bind it). */
  address(role: ServerRole): string;
  /** True when the engine reaches the servers over a network (admin and metrics must bind non-loopback). */
  readonly remote: boolean;
  /** The network namespace a server of `role` runs in (`ip netns exec`), undefined for this one. */
  netnsOf(role: ServerRole): string | undefined;
  /** Makes `port` of a server of `role` reachable from the engine (a relay forward where the link needs one). */
  expose(role: ServerRole, port: number): Promise<void>;
  /** One line for the run's notes. */
  describe(): string;
  /** The report's view, read at the end of the run. */
  report(): Promise<TopologyReport>;
  /** Stops what the topology started in this process (the relay); namespaces belong to the supervisor. */
  close(): Promise<void>;
}

/** Everything on 127.0.0.1: nothing to route, nothing to start. */
export class LocalTopology implements Topology {
  readonly kind = "local" as const;
  readonly remote = false;

  bindHost(): string {
    return "127.0.0.1";
  }

  address(): string {
    return "127.0.0.1";
  }

  netnsOf(): string | undefined {
    return undefined;
  }

  async expose(): Promise<void> {}

  describe(): string {
    return "local topology: every process on 127.0.0.1";
  }

  async report(): Promise<TopologyReport> {
    return { kind: "local", link: "none", hosts: {}, relay: null };
  }

  async close(): Promise<void> {}
}

/** The topology of a run of `cfg` in this process: local, or the netns plan this process was started with. */
export async function openTopology(cfg: HarnessConfig): Promise<Topology> {
  if (cfg.topology === "local") return new LocalTopology();
  return NetnsTopology.fromEnvironment(cfg);
}
