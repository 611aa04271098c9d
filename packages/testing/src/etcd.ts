// A real etcd (Debian's etcd-server, /usr/bin/etcd, 3.4) as a child process on loopback with a
// temp data dir (on /dev/shm where it exists, see etcdDataParent), for @tapwire/discovery tests and
// the harness. etcd cannot listen on port 0 for its peer URL, so both ports come from freePort()
// and a start whose ports were taken in between (the process exits before it is healthy) is
// retried with new ones. stop() keeps the data dir
// and the ports so that start() brings the same member back (clients reconnect to it).
import { type ChildProcess, spawn } from "node:child_process";
import { accessSync, constants, existsSync, statSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TestingError, TestingErrorCode } from "./errors.js";
import { freePort } from "./paths.js";

/** Where Debian installs etcd (package etcd-server). */
export const ETCD_BIN = "/usr/bin/etcd";

/** Options of {@link startEtcd}. */
export interface StartEtcdOptions {
  /** The etcd binary (default {@link ETCD_BIN}, or `$ETCD_BIN`). */
  bin?: string;
  /** Give up waiting for `/health` after this many ms (default 20000). */
  timeoutMs?: number;
}

/** A running (or stopped) etcd child. */
export interface EtcdChild {
  /** The client URL, `http://127.0.0.1:<port>`. */
  readonly clientUrl: string;
  /** The same as a tapwire `--register` URL, `etcd://127.0.0.1:<port>`. */
  readonly endpoint: string;
  /** The temp data dir (removed by close()). */
  readonly dataDir: string;
  /** The process id while running, else null. */
  readonly pid: number | null;
  /** Stops the process (default SIGTERM) and waits for its exit; the data dir and ports stay. */
  stop(signal?: NodeJS.Signals): Promise<void>;
  /** Starts it again on the same ports and data dir; resolves once healthy. */
  start(): Promise<void>;
  /** Stops it (SIGKILL) and removes the data dir. */
  close(): Promise<void>;
  /** Everything the process wrote so far (stderr and stdout). */
  output(): string;
}

const running = new Set<ChildProcess>();
let hook = false;

function installHook(): void {
  if (hook) return;
  hook = true;
  process.once("exit", () => {
    for (const c of running) c.kill("SIGKILL");
  });
}

async function healthy(url: string): Promise<boolean> {
  try {
    const r = await fetch(`${url}/health`, { signal: AbortSignal.timeout(1000) });
    const j = (await r.json()) as { health?: string };
    return j.health === "true";
  } catch {
    return false;
  }
}

class Etcd implements EtcdChild {
  clientUrl = "";
  endpoint = "";
  peerUrl = "";
  readonly dataDir: string;
  readonly #bin: string;
  readonly #timeoutMs: number;
  #child: ChildProcess | null = null;
  #exited: Promise<void> | null = null;
  #out: string[] = [];
  constructor(dataDir: string, bin: string, timeoutMs: number) {
    this.dataDir = dataDir;
    this.#bin = bin;
    this.#timeoutMs = timeoutMs;
  }
  get pid(): number | null {
    return this.#child?.pid ?? null;
  }
  async ports(): Promise<void> {
    const c = await freePort();
    let p = await freePort();
    while (p === c) p = await freePort();
    this.clientUrl = `http://127.0.0.1:${c}`;
    this.endpoint = `etcd://127.0.0.1:${c}`;
    this.peerUrl = `http://127.0.0.1:${p}`;
  }
  // one attempt: true once healthy, false when the process exited first (ports taken)
  async #launch(): Promise<boolean> {
    const args = [
      "--name",
      "tapwire-test",
      "--data-dir",
      this.dataDir,
      "--listen-client-urls",
      this.clientUrl,
      "--advertise-client-urls",
      this.clientUrl,
      "--listen-peer-urls",
      this.peerUrl,
      "--initial-advertise-peer-urls",
      this.peerUrl,
      "--initial-cluster",
      `tapwire-test=${this.peerUrl}`,
      "--log-level",
      "warn",
    ];
    installHook();
    const child = spawn(this.#bin, args, { stdio: ["ignore", "pipe", "pipe"] });
    running.add(child);
    this.#child = child;
    let exited = false;
    this.#exited = new Promise((resolve) => {
      child.once("exit", () => {
        exited = true;
        running.delete(child);
        if (this.#child === child) this.#child = null;
        resolve();
      });
      child.once("error", (e) => {
        this.#out.push(String(e));
      });
    });
    const keep = (b: Buffer): void => {
      if (this.#out.length < 10_000) this.#out.push(b.toString());
    };
    child.stdout?.on("data", keep);
    child.stderr?.on("data", keep);
    const t0 = Date.now();
    while (Date.now() - t0 < this.#timeoutMs) {
      if (exited) return false;
      if (await healthy(this.clientUrl)) return true;
      await new Promise((r) => setTimeout(r, 100));
    }
    child.kill("SIGKILL");
    await this.#exited;
    throw new TestingError(
      TestingErrorCode.TIMEOUT,
      `etcd not healthy at ${this.clientUrl} within ${this.#timeoutMs} ms:\n${this.output().slice(-2000)}`,
    );
  }
  async first(): Promise<void> {
    for (let attempt = 0; attempt < 5; attempt++) {
      await this.ports();
      if (await this.#launch()) return;
    }
    throw new TestingError(TestingErrorCode.SPAWN, `etcd did not start:\n${this.output().slice(-2000)}`);
  }
  async start(): Promise<void> {
    if (this.#child !== null) return;
    for (let attempt = 0; attempt < 3; attempt++) {
      if (await this.#launch()) return;
      await new Promise((r) => setTimeout(r, 200)); // the old listener may linger a moment
    }
    throw new TestingError(TestingErrorCode.SPAWN, `etcd did not restart:\n${this.output().slice(-2000)}`);
  }
  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    const c = this.#child;
    if (c === null) return;
    c.kill(signal);
    await this.#exited;
  }
  async close(): Promise<void> {
    await this.stop("SIGKILL");
    await rm(this.dataDir, { recursive: true, force: true });
  }
  output(): string {
    return this.#out.join("");
  }
}

/**
 * Where the data dirs go: /dev/shm when it is a writable directory, else the temp dir. etcd
 * fsyncs its WAL on every write (3.4 has no flag to skip it), and on a disk a loaded CI machine
 * stalls those fsyncs for seconds: the likely cause of a CI flake where a record outlived its
 * producer's SIGTERM (a lease revoke past the registrar's 2 s timeout leaves it until its TTL). On tmpfs an fsync costs nothing; a
 * test etcd needs no durability. Each member preallocates a 64 MB WAL there (memory).
 */
function etcdDataParent(): string {
  try {
    if (statSync("/dev/shm").isDirectory()) {
      accessSync("/dev/shm", constants.W_OK);
      return "/dev/shm";
    }
  } catch {
    // no writable /dev/shm (not Linux, a locked-down container): the temp dir
  }
  return tmpdir();
}

/**
 * Starts a single-member etcd on loopback (free client and peer ports, a temp data dir) and
 * resolves once `/health` says true.
 *
 * @throws TestingError `SPAWN_FAILED` when etcd is missing or never starts, `TIMEOUT` when it is
 *   not healthy in time.
 */
export async function startEtcd(options: StartEtcdOptions = {}): Promise<EtcdChild> {
  const bin = options.bin ?? process.env.ETCD_BIN ?? ETCD_BIN;
  if (!existsSync(bin)) {
    throw new TestingError(
      TestingErrorCode.SPAWN,
      `etcd binary ${bin} not found (Debian package etcd-server)`,
    );
  }
  const timeoutMs = options.timeoutMs ?? 20_000;
  if (!(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
    throw new TestingError(TestingErrorCode.BAD_OPTION, `option timeoutMs ${timeoutMs} must be > 0`);
  }
  const dir = await mkdtemp(join(etcdDataParent(), "tapwire-etcd-"));
  const e = new Etcd(dir, bin, timeoutMs);
  try {
    await e.first();
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  return e;
}
