/**
 * Issue 21: the harness side of the etcd keeper (`etcd-main.ts`): a loopback etcd that never
 * outlives the harness (the keeper is an `--exit-with-parent` child), stopped and started again
 * by the fault schedule.
 */
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { HarnessError, HarnessErrorCode } from "../errors.js";
import { ChildService, type LogLine } from "./procs.js";

/** The keeper's script: next to this file once built, else the built one (vitest runs the sources). */
function keeperScript(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const sibling = join(here, "etcd-main.js");
  return existsSync(sibling) ? sibling : join(here, "..", "..", "dist", "procs", "etcd-main.js");
}

/** A loopback etcd in a keeper process of the harness. */
export class EtcdProc {
  /** `etcd://127.0.0.1:<port>` (what `--register` takes). */
  readonly endpoint: string;
  /** `http://127.0.0.1:<port>`. */
  readonly clientUrl: string;
  /** Pids of every etcd process so far (a restart is a new one). */
  readonly etcdPids: number[] = [];
  private waiters: Array<(l: LogLine) => void> = [];

  private constructor(
    readonly svc: ChildService,
    first: LogLine,
  ) {
    this.endpoint = String(first["endpoint"]);
    this.clientUrl = String(first["clientUrl"]);
    if (typeof first["etcdPid"] === "number") this.etcdPids.push(first["etcdPid"]);
    svc.onLine = (l) => {
      if (l["msg"] !== "etcd") return;
      if (typeof l["etcdPid"] === "number") this.etcdPids.push(l["etcdPid"]);
      for (const w of this.waiters.splice(0)) w(l);
    };
  }

  /** Starts the keeper and its etcd (healthy once this resolves). */
  static async start(log?: (l: string) => void): Promise<EtcdProc> {
    const svc = new ChildService({
      name: "etcd",
      script: keeperScript(),
      args: [],
      exitWithParent: true,
      readyTimeoutMs: 40_000,
      ...(log !== undefined ? { log } : {}),
    });
    const first = await svc.start();
    if (typeof first["endpoint"] !== "string")
      throw new HarnessError(
        HarnessErrorCode.PROCESS,
        `etcd keeper: no endpoint in ${JSON.stringify(first)}`,
      );
    return new EtcdProc(svc, first);
  }

  /** The running etcd's pid (the last started). */
  get pid(): number | null {
    return this.etcdPids.at(-1) ?? null;
  }

  private command(cmd: "stop" | "start", timeoutMs = 30_000): Promise<void> {
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== done);
        reject(
          new HarnessError(HarnessErrorCode.PROCESS, `etcd keeper: no answer to ${cmd} in ${timeoutMs} ms`),
        );
      }, timeoutMs);
      const done = () => {
        clearTimeout(t);
        resolve();
      };
      this.waiters.push(done);
      if (!this.svc.send(JSON.stringify({ cmd }))) {
        clearTimeout(t);
        reject(new HarnessError(HarnessErrorCode.PROCESS, "etcd keeper is not running"));
      }
    });
  }

  /** Stops etcd (SIGTERM; its data dir and ports stay). */
  stop(): Promise<void> {
    return this.command("stop");
  }

  /** Starts etcd again on the same ports and data dir; resolves once healthy. */
  start(): Promise<void> {
    return this.command("start");
  }

  /** Stops the keeper, which kills etcd and removes its data dir. */
  close(): Promise<void> {
    return this.svc.kill("SIGTERM", 5000);
  }
}
