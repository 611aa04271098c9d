import { execFile, execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { promisify } from "node:util";
import { TestingError, TestingErrorCode } from "./errors.js";

const execFileP = promisify(execFile);

/**
 * Every namespace these helpers create is named `twnet-<pid>-<start>-<n>-<role>`: the creating
 * process's pid and start time (clock ticks since boot, `/proc/<pid>/stat` field 22), so a later
 * run can tell a dead run's namespaces from a live one's, even after the pid was reused.
 */
export const NETNS_PREFIX = "twnet-";

/**
 * The address range of every link these helpers create: 198.18.0.0/15, the block reserved for
 * network benchmark tests (RFC 2544), used only inside namespaces a test created.
 */
export const TEST_NET = "198.18.0.0/15";

const ROLE_RE = /^[a-z][a-z0-9]{0,11}$/;
const NAME_RE = /^twnet-(\d+)-(\d+)-\d+-[a-z][a-z0-9]*$/;

/** Start time of a process in clock ticks since boot, or null when it is gone. */
function startTimeOf(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // comm (field 2) may hold spaces and parentheses: split after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return fields[19] ?? null; // field 22 overall
  } catch {
    return null;
  }
}

let ownerCache: string | null = null;
function owner(): string {
  if (ownerCache === null) ownerCache = `${process.pid}-${startTimeOf(process.pid) ?? "0"}`;
  return ownerCache;
}

/**
 * Throws unless the process runs as root: network namespaces, veths and tc need it. `what` names
 * the caller in the message ("the netns topology", "netns.test.ts").
 *
 * @throws TestingError `TESTING_NOT_ROOT`.
 */
export function requireRoot(what: string): void {
  const uid = process.getuid?.() ?? -1;
  if (uid !== 0) {
    throw new TestingError(
      TestingErrorCode.NOT_ROOT,
      `${what} needs root (uid 0; this process runs as uid ${uid}): network namespaces, veth pairs and tc qdiscs are root-only. Run it as root (CI does) or in a root container.`,
    );
  }
}

/**
 * Runs `ip` or `tc` (or any command) and returns its stdout.
 *
 * @throws TestingError `TESTING_NETNS` with the command line and its stderr.
 */
export async function runNetCommand(cmd: string, args: readonly string[]): Promise<string> {
  try {
    const { stdout } = await execFileP(cmd, [...args], { encoding: "utf8" });
    return stdout;
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new TestingError(
      TestingErrorCode.NETNS,
      `${cmd} ${args.join(" ")} failed: ${(e.stderr ?? "").trim() || e.message}`,
      { cause: err },
    );
  }
}

/** The command line that runs `argv` inside namespace `netns`: `ip netns exec <netns> ...argv` (same pid). */
export function netnsCommand(netns: string, argv: readonly string[]): string[] {
  return ["ip", "netns", "exec", netns, ...argv];
}

/** Names of every network namespace on the host (`ip netns list`). */
export async function listNamespaces(): Promise<string[]> {
  const out = await runNetCommand("ip", ["netns", "list"]);
  return parseNetnsList(out);
}

function parseNetnsList(out: string): string[] {
  return out
    .split("\n")
    .map((l) => l.trim().split(" ")[0] ?? "")
    .filter((n) => n !== "");
}

/** Namespaces of this process (created and not yet removed): removed at exit if still there. */
const owned = new Set<string>();
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once("exit", () => {
    for (const name of owned) removeNamespaceSync(name);
  });
}

function removeNamespaceSync(name: string): void {
  try {
    const pids = execFileSync("ip", ["netns", "pids", name], { encoding: "utf8", stdio: "pipe" });
    for (const p of pids.split(/\s+/).filter((x) => x !== "")) {
      try {
        process.kill(Number(p), "SIGKILL");
      } catch {
        // already gone
      }
    }
    execFileSync("ip", ["netns", "del", name], { stdio: "pipe" });
  } catch {
    // gone already, or removed by someone else
  }
  owned.delete(name);
}

/**
 * Removes namespace `name`: SIGKILLs every process still inside it (`ip netns pids`), then
 * `ip netns del`. The kernel deletes its veths with it (their peers in other namespaces too).
 * Removing a namespace that is already gone is not an error.
 */
export async function removeNamespace(name: string): Promise<void> {
  let pids: string[] = [];
  try {
    pids = (await runNetCommand("ip", ["netns", "pids", name])).split(/\s+/).filter((x) => x !== "");
  } catch {
    owned.delete(name);
    return; // no such namespace
  }
  for (const p of pids) {
    try {
      process.kill(Number(p), "SIGKILL");
    } catch {
      // already gone
    }
  }
  try {
    await runNetCommand("ip", ["netns", "del", name]);
  } catch (err) {
    if ((await listNamespaces()).includes(name)) throw err;
  }
  owned.delete(name);
}

/**
 * Removes the namespaces a dead run left behind: every `twnet-<pid>-<start>-…` whose creating
 * process no longer exists (or is another process with a reused pid), with the processes still
 * inside it. Namespaces of live processes (parallel test files, other runs) are left alone.
 * Called by {@link createNamespace} on its first use in a process; returns the names removed.
 */
export async function removeStaleNamespaces(): Promise<string[]> {
  const removed: string[] = [];
  for (const name of await listNamespaces()) {
    const m = NAME_RE.exec(name);
    if (m === null) continue;
    if (startTimeOf(Number(m[1])) === m[2]) continue; // its creator still runs
    await removeNamespace(name);
    removed.push(name);
  }
  return removed;
}

/** A network namespace created by {@link createNamespace}. */
export interface Namespace {
  /** The namespace's name (`twnet-<pid>-<start>-<n>-<role>`), as `ip netns` knows it. */
  readonly name: string;
  /** The role given at creation (`engine`, `router`, `worker0`…). */
  readonly role: string;
  /** Runs `cmd args` inside the namespace and returns its stdout (`TESTING_NETNS` on failure). */
  exec(cmd: string, args: readonly string[]): Promise<string>;
  /** Removes the namespace and everything in it ({@link removeNamespace}). */
  remove(): Promise<void>;
}

let counter = 0;
let staleSwept = false;

/**
 * Creates a uniquely named network namespace for `role` (`[a-z][a-z0-9]{0,11}`) with its loopback
 * up. The first call in a process first removes stale namespaces of dead runs
 * ({@link removeStaleNamespaces}). Namespaces still there when the process exits are removed by an
 * exit hook; a SIGKILLed run's are removed by the next run's first call.
 *
 * @throws TestingError `TESTING_NOT_ROOT`, `TESTING_BAD_OPTION` (role), `TESTING_NETNS`.
 */
export async function createNamespace(role: string): Promise<Namespace> {
  requireRoot("a network namespace");
  if (typeof role !== "string" || !ROLE_RE.test(role)) {
    throw new TestingError(
      TestingErrorCode.BAD_OPTION,
      `namespace role ${JSON.stringify(role)} must match [a-z][a-z0-9]{0,11}`,
    );
  }
  if (!staleSwept) {
    staleSwept = true;
    await removeStaleNamespaces();
  }
  installExitHook();
  const name = `${NETNS_PREFIX}${owner()}-${++counter}-${role}`;
  await runNetCommand("ip", ["netns", "add", name]);
  owned.add(name);
  try {
    await runNetCommand("ip", ["-n", name, "link", "set", "lo", "up"]);
  } catch (err) {
    await removeNamespace(name);
    throw err;
  }
  return {
    name,
    role,
    exec: (cmd, args) => runNetCommand("ip", ["netns", "exec", name, cmd, ...args]),
    remove: () => removeNamespace(name),
  };
}

/** One end of a veth pair: the namespace, the device name inside it, its IPv4 address. */
export interface VethEnd {
  /** Namespace name. */
  readonly netns: string;
  /** Device name inside the namespace (at most 15 bytes). */
  readonly dev: string;
  /** IPv4 address with prefix length, e.g. `198.18.1.2/24`. */
  readonly address: string;
}

const DEV_RE = /^[a-zA-Z][a-zA-Z0-9_-]{0,14}$/;

/**
 * Creates a veth pair straight into two namespaces (the devices never exist in the host's
 * namespace), gives each end its address and brings both up.
 *
 * @throws TestingError `TESTING_BAD_OPTION` (device name), `TESTING_NETNS`.
 */
export async function addVethPair(a: VethEnd, b: VethEnd): Promise<void> {
  for (const e of [a, b]) {
    if (!DEV_RE.test(e.dev)) {
      throw new TestingError(
        TestingErrorCode.BAD_OPTION,
        `veth device ${JSON.stringify(e.dev)} must match ${DEV_RE}`,
      );
    }
    if (!/^\d+\.\d+\.\d+\.\d+\/\d+$/.test(e.address)) {
      throw new TestingError(
        TestingErrorCode.BAD_OPTION,
        `veth address ${JSON.stringify(e.address)} is not a.b.c.d/len`,
      );
    }
  }
  await runNetCommand("ip", [
    "link",
    "add",
    "name",
    a.dev,
    "netns",
    a.netns,
    "type",
    "veth",
    "peer",
    "name",
    b.dev,
    "netns",
    b.netns,
  ]);
  for (const e of [a, b]) {
    await runNetCommand("ip", ["-n", e.netns, "addr", "add", e.address, "dev", e.dev]);
    await runNetCommand("ip", ["-n", e.netns, "link", "set", e.dev, "up"]);
  }
}

/**
 * Shapes the egress of `dev` in `netns` with a token bucket: `tc qdisc replace ... root tbf rate
 * <bits>bit burst <bytes> latency 50ms` (this kernel has no netem; delay is the relay's job).
 *
 * @throws TestingError `TESTING_BAD_OPTION` (rate, burst), `TESTING_NETNS`.
 */
export async function shapeEgress(
  netns: string,
  dev: string,
  rateBitsPerSec: number,
  burstBytes: number,
): Promise<void> {
  if (!(Number.isFinite(rateBitsPerSec) && rateBitsPerSec >= 8000)) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, `rate ${rateBitsPerSec} bit/s must be >= 8000`);
  }
  if (!(Number.isInteger(burstBytes) && burstBytes >= 1600)) {
    throw new TestingError(
      TestingErrorCode.BAD_OPTION,
      `burst ${burstBytes} bytes must be an integer >= 1600`,
    );
  }
  await runNetCommand("tc", [
    "-n",
    netns,
    "qdisc",
    "replace",
    "dev",
    dev,
    "root",
    "tbf",
    "rate",
    `${Math.round(rateBitsPerSec)}bit`,
    "burst",
    String(burstBytes),
    "latency",
    "50ms",
  ]);
}

/** Byte and packet counters of a device inside a namespace (`/sys/class/net/<dev>/statistics`). */
export interface DevCounters {
  /** Bytes received. */
  rxBytes: number;
  /** Bytes sent. */
  txBytes: number;
}

/** Reads `dev`'s rx/tx byte counters inside `netns` (`ip -s -j link show`). */
export async function devCounters(netns: string, dev: string): Promise<DevCounters> {
  const out = await runNetCommand("ip", ["-n", netns, "-s", "-j", "link", "show", "dev", dev]);
  const parsed = JSON.parse(out) as { stats64?: { rx: { bytes: number }; tx: { bytes: number } } }[];
  const s = parsed[0]?.stats64;
  if (s === undefined) throw new TestingError(TestingErrorCode.NETNS, `no counters for ${dev} in ${netns}`);
  return { rxBytes: s.rx.bytes, txBytes: s.tx.bytes };
}
