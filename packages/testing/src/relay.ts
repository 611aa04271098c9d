import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { TestingError, TestingErrorCode } from "./errors.js";
import type { FaultProxyStats } from "./fault-proxy.js";
import type { LinkSpec } from "./link-spec.js";
import { formatLinkSpec, parseLinkSpec } from "./link-spec.js";
import type { ChildHandle } from "./spawn.js";
import { spawnBin } from "./spawn.js";
import type { StarLeaf } from "./topology.js";

/** Options of {@link startRelay}. */
export interface RelayOptions {
  /** Network namespace the relay runs in (the router of a star topology); default: this one. */
  netns?: string;
  /** The delay, jitter and stalls of every forward (a spec string or parsed; `rate` is ignored here: tbf's job). */
  link?: LinkSpec | string;
  /** How long the relay may take to start and to answer each command, ms (default 20000). */
  timeoutMs?: number;
}

/** One forward of a relay and its counters (those of the fault proxy behind it). */
export interface RelayForwardStats {
  /** `host:port` the relay listens on. */
  listen: string;
  /** `host:port` it forwards to. */
  target: string;
  /** Bytes, connections and the impairment applied. */
  stats: FaultProxyStats;
}

/** A relay process started by {@link startRelay}. */
export interface Relay {
  /** The relay's process. */
  readonly child: ChildHandle;
  /** The link it applies. */
  readonly link: LinkSpec;
  /**
   * Listens on `listen` (port 0: any) and forwards every connection to `target`, from
   * `localAddress` when given; resolves with the port it listens on.
   */
  forward(
    listen: { host: string; port: number },
    target: { host: string; port: number },
    localAddress?: string,
  ): Promise<number>;
  /** Stops one forward (its open connections are dropped). */
  unforward(listen: { host: string; port: number }): Promise<void>;
  /** Counters of every forward. */
  stats(): Promise<RelayForwardStats[]>;
  /** Stops the relay (closing its stdin; SIGKILL if it does not exit within the timeout). */
  close(): Promise<void>;
}

/** The relay's main script: `dist/relay-child.js` (also when this module runs from `src/` in tests). */
function relayMain(): string {
  const here = fileURLToPath(import.meta.url);
  const dir = dirname(here);
  const main = here.endsWith(".ts") ? join(dir, "..", "dist", "relay-child.js") : join(dir, "relay-child.js");
  if (!existsSync(main)) {
    throw new TestingError(
      TestingErrorCode.SPAWN,
      `relay script ${main} is missing: build @tapwire/testing first (pnpm --filter @tapwire/testing build)`,
    );
  }
  return main;
}

let commandId = 0;

/**
 * Starts a relay as a child process, inside `netns` when given (`ip netns exec`): a set of TCP
 * forwards, each a fault proxy ({@link startFaultProxy}) applying the link's delay, jitter and
 * stalls to every chunk in both directions. Used in the router namespace of a star topology so
 * every byte between the engine and a server crosses two real veths and the relay
 * ({@link relayLeafPort}). The relay exits when this process dies (its stdin reaches EOF).
 *
 * @throws TestingError `TESTING_BAD_OPTION` (link), `TESTING_SPAWN`, `TESTING_TIMEOUT`.
 */
export async function startRelay(opts: RelayOptions = {}): Promise<Relay> {
  const link = typeof opts.link === "string" ? parseLinkSpec(opts.link) : (opts.link ?? parseLinkSpec(""));
  const timeoutMs = opts.timeoutMs ?? 20_000;
  if (!(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, `option timeoutMs ${timeoutMs} must be > 0`);
  }
  const child = await spawnBin(relayMain(), ["--link", formatLinkSpec(link)], {
    openStdin: true,
    timeoutMs,
    ...(opts.netns === undefined ? {} : { netns: opts.netns }),
  });
  const ask = async (cmd: Record<string, unknown>): Promise<Record<string, unknown>> => {
    const id = ++commandId;
    const stdin = child.child.stdin;
    if (stdin === null || child.child.exitCode !== null) {
      throw new TestingError(TestingErrorCode.RELAY, `relay ${child.pid} is not running`);
    }
    const answer = child.waitFor((l) => l.json?.id === id, timeoutMs);
    stdin.write(`${JSON.stringify({ id, ...cmd })}\n`);
    const r = (await answer).json!;
    if (r.ok !== true) {
      throw new TestingError(TestingErrorCode.RELAY, `relay ${String(cmd.op)} failed: ${String(r.error)}`);
    }
    return r;
  };
  let closing: Promise<void> | null = null;
  return {
    child,
    link,
    async forward(listen, target, localAddress) {
      const r = await ask({
        op: "forward",
        listen,
        target,
        ...(localAddress === undefined ? {} : { localAddress }),
      });
      return r.port as number;
    },
    async unforward(listen) {
      await ask({ op: "unforward", listen });
    },
    async stats() {
      return (await ask({ op: "stats" })).forwards as RelayForwardStats[];
    },
    close() {
      closing ??= (async () => {
        child.child.stdin?.end();
        const timer = setTimeout(() => void child.kill("SIGKILL"), timeoutMs);
        await child.exited;
        clearTimeout(timer);
      })();
      return closing;
    },
  };
}

/**
 * Routes connections to `leaf.address:port` through `relay` (in the hub of a star topology whose
 * plan lists the leaf in `relayed`): the relay listens on the leaf's address (owned by the hub)
 * and forwards to the real server from the hub's address on the leaf's veth. With `relay` null
 * (a link without delay, jitter or stalls) nothing is needed: the hub forwards packets.
 */
export async function relayLeafPort(relay: Relay | null, leaf: StarLeaf, port: number): Promise<void> {
  if (relay === null) return;
  await relay.forward({ host: leaf.address, port }, { host: leaf.address, port }, leaf.hubAddress);
}
