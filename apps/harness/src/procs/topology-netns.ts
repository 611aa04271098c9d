/**
 * `--topology netns`: the engine, the worker and the encoder each in its own network namespace,
 * joined to a router namespace by veth pairs on 198.18.0.0/15 (only inside namespaces the run
 * created), with the `--link` impairment: `rate` as tbf on every veth, delay / jitter / stalls by
 * a relay in the router that every connection to a server passes through.
 *
 * Node cannot move its own sockets into another namespace, and the engine runs inside the
 * harness process; so the harness supervises: the process started by the operator (root) builds
 * the namespaces, then runs itself again under `ip netns exec <engine namespace>` with the plan in
 * {@link NETNS_PLAN_ENV}. That second process is the whole run as with `--topology local` (engine,
 * children, report), with every socket of the engine in the engine's namespace; it starts the
 * servers with `ip netns exec` in theirs and the relay in the router. The supervisor waits, passes
 * signals on, and removes every namespace (and whatever still runs inside) when the run ends; a
 * supervisor killed with SIGKILL leaves them to the next netns run, which removes them first. The
 * run process watches its stdin (a pipe from the supervisor) and stops when it closes.
 */
import { type ChildProcess, spawn } from "node:child_process";
import {
  createStarTopology,
  type Relay,
  relayLeafPort,
  requireRoot,
  type StarLeaf,
  type StarTopologyPlan,
  startRelay,
  TestingError,
} from "@tapwire/testing";
import type { HarnessConfig } from "../cli/cli.js";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import type { ServerRole, Topology, TopologyReport } from "./topology.js";

/** The environment variable carrying the plan (JSON) to the run process inside the engine's namespace. */
export const NETNS_PLAN_ENV = "TAPWIRE_HARNESS_NETNS_PLAN";

/** The namespaces of a netns run: the engine's (the client side) and one per server. */
const LEAVES = ["engine", "worker", "encoder"] as const;

/** True in the run process the supervisor started (inside the engine's namespace). */
export function isNetnsRun(): boolean {
  return process.env[NETNS_PLAN_ENV] !== undefined;
}

let inner: ChildProcess | null = null;

/** Passes `sig` to the run process when this process supervises one; false otherwise. */
export function forwardSignal(sig: NodeJS.Signals): boolean {
  if (inner === null || inner.exitCode !== null || inner.signalCode !== null) return false;
  inner.kill(sig);
  return true;
}

const SIGNAL_CODES: Record<string, number> = { SIGINT: 130, SIGTERM: 143, SIGKILL: 137, SIGHUP: 129 };

/**
 * The supervisor of a netns run: builds the namespaces for `cfg.link`, runs `binPath argv` inside
 * the engine's namespace with the plan, waits for it, removes everything, and resolves with the
 * run's exit status (a signal: 128 + its number).
 *
 * @throws HarnessError `HARNESS_USAGE` when not root (the message says why and what to do).
 */
export async function superviseNetns(
  cfg: HarnessConfig,
  binPath: string,
  argv: readonly string[],
  log: (m: string) => void,
): Promise<number> {
  try {
    requireRoot("--topology netns");
  } catch (e) {
    if (e instanceof TestingError) throw new HarnessError(HarnessErrorCode.USAGE, e.message);
    throw e;
  }
  const topo = await createStarTopology({ leaves: LEAVES, servers: ["worker", "encoder"], link: cfg.link });
  try {
    const engine = topo.leaf("engine");
    log(
      `netns topology: ${topo.plan.leaves.map((l) => `${l.role} ${l.address} (${l.netns})`).join(", ")}; router ${topo.plan.hub.netns}; link ${cfg.link}`,
    );
    const child = spawn("ip", ["netns", "exec", engine.netns, process.execPath, binPath, ...argv], {
      stdio: ["pipe", "inherit", "inherit"],
      env: { ...process.env, [NETNS_PLAN_ENV]: JSON.stringify(topo.plan) },
    });
    inner = child;
    const code = await new Promise<number>((resolve) => {
      child.once("error", (e) => {
        log(`cannot start the run in ${engine.netns}: ${e.message}`);
        resolve(3);
      });
      child.once("exit", (c, s) => resolve(c ?? SIGNAL_CODES[s ?? ""] ?? 128));
    });
    inner = null;
    return code;
  } finally {
    await topo.close();
  }
}

/** The netns topology as the run process (inside the engine's namespace) sees it. */
export class NetnsTopology implements Topology {
  readonly kind = "netns" as const;
  readonly remote = true;
  readonly #exposed = new Set<string>();

  private constructor(
    readonly plan: StarTopologyPlan,
    readonly relay: Relay | null,
    readonly linkText: string,
  ) {}

  /**
   * Reads the plan the supervisor passed, starts the relay in the router when the link needs one,
   * and stops the run (SIGTERM to itself) when the supervisor goes away (stdin closes).
   *
   * @throws HarnessError `HARNESS_USAGE` when this process was not started by a supervisor.
   */
  static async fromEnvironment(cfg: HarnessConfig): Promise<NetnsTopology> {
    const raw = process.env[NETNS_PLAN_ENV];
    if (raw === undefined) {
      throw new HarnessError(
        HarnessErrorCode.USAGE,
        `--topology netns runs through its supervisor (the bin); ${NETNS_PLAN_ENV} is not set`,
      );
    }
    const plan = JSON.parse(raw) as StarTopologyPlan;
    // the supervisor holds our stdin: when it dies, however it died, the run stops
    process.stdin.on("end", () => process.kill(process.pid, "SIGTERM"));
    process.stdin.on("error", () => process.kill(process.pid, "SIGTERM"));
    process.stdin.resume();
    (process.stdin as { unref?: () => void }).unref?.();
    const relay =
      plan.relayed.length > 0 ? await startRelay({ netns: plan.hub.netns, link: plan.link }) : null;
    return new NetnsTopology(plan, relay, cfg.link);
  }

  #leaf(role: ServerRole): StarLeaf {
    const l = this.plan.leaves.find((x) => x.role === role);
    if (l === undefined) throw new HarnessError(HarnessErrorCode.INTERNAL, `netns plan has no ${role}`);
    return l;
  }

  bindHost(): string {
    return "0.0.0.0";
  }

  address(role: ServerRole): string {
    return this.#leaf(role).address;
  }

  netnsOf(role: ServerRole): string {
    return this.#leaf(role).netns;
  }

  async expose(role: ServerRole, port: number): Promise<void> {
    const key = `${role}:${port}`;
    if (this.#exposed.has(key)) return; // a restart on the same port: the forward is still there
    await relayLeafPort(this.relay, this.#leaf(role), port);
    this.#exposed.add(key);
  }

  describe(): string {
    const where = this.plan.leaves.map((l) => `${l.role} ${l.address}`).join(", ");
    return `netns topology: ${where}; link ${this.linkText}${this.relay ? ` (relay pid ${this.relay.child.pid} in the router)` : ""}`;
  }

  async report(): Promise<TopologyReport> {
    const hosts: TopologyReport["hosts"] = {};
    for (const l of this.plan.leaves) hosts[l.role] = { netns: l.netns, address: l.address };
    let relay: TopologyReport["relay"] = null;
    if (this.relay !== null) {
      relay = (await this.relay.stats()).map((f) => ({
        listen: f.listen,
        connections: f.stats.connections,
        bytesUp: f.stats.bytesUp,
        bytesDown: f.stats.bytesDown,
        delayedChunks: f.stats.link.delayed,
        stalls: f.stats.link.stalls,
      }));
    }
    return { kind: "netns", link: this.linkText, hosts, relay };
  }

  async close(): Promise<void> {
    await this.relay?.close();
  }
}
