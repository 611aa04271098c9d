/**
 * `tapwire-worker --register etcd://…` (issue 21, CONTRACT 12.2): the worker's discovery record
 * kept under an etcd lease. `@tapwire/discovery` (and its etcd client) is an optional peer of
 * this package, loaded with a dynamic import only when `--register` is given.
 */
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import type { Logger } from "@tapwire/stats";
import { Capability } from "@tapwire/wire";
import type { Drafter } from "../drafter.js";
import type { Worker } from "../worker.js";
import type { ParsedFlags } from "./flags.js";
import { intFlag, strFlag, UsageError } from "./flags.js";

/** What this bin uses of @tapwire/discovery (no type dependency: it is an optional peer). */
interface DiscoveryModule {
  register(options: {
    etcd: string;
    prefix?: string;
    ttlSeconds?: number;
    logger?: Logger;
    record: {
      kind: "worker";
      endpoints: readonly string[];
      name?: string;
      identities?: Record<string, string>;
      geometry?: Record<string, number | string | readonly string[]>;
      capacity?: Record<string, number>;
    };
  }): { key: string; record: { incarnation: string }; close(): Promise<void> };
}

const DISCOVERY_PACKAGE = "@tapwire/discovery";

/** @tapwire/discovery from next to this worker, else from the project in the current directory. */
export async function importDiscovery(): Promise<DiscoveryModule> {
  for (const base of [import.meta.url, pathToFileURL(join(process.cwd(), "package.json")).href]) {
    let path: string;
    try {
      path = createRequire(base).resolve(DISCOVERY_PACKAGE);
    } catch {
      continue;
    }
    return (await import(pathToFileURL(path).href)) as DiscoveryModule;
  }
  throw new UsageError(
    `--register needs ${DISCOVERY_PACKAGE}, which is not installed; install it with: npm install ${DISCOVERY_PACKAGE}`,
  );
}

/** Usage checks of the discovery flags (no I/O, nothing loaded): a bad value is a usage error. */
export function checkRegisterFlags(p: ParsedFlags): void {
  const url = strFlag(p, "register");
  if (url !== undefined && !/^etcd:\/\/[^,/\s]+:\d{1,5}(,[^,/\s]+:\d{1,5})*$/.test(url)) {
    throw new UsageError(`--register ${url}: expected etcd://host:port[,host:port…]`);
  }
  const prefix = strFlag(p, "register-prefix");
  if (prefix !== undefined && !(prefix.startsWith("/") && prefix.endsWith("/"))) {
    throw new UsageError(`--register-prefix ${prefix}: must start and end with "/"`);
  }
}

/** A running registration: `stop()` revokes the record (a clean stop) and waits the drain. */
export interface WorkerRegistration {
  /** The record's key. */
  readonly key: string;
  /** The record's incarnation. */
  readonly incarnation: string;
  /** Revokes, then waits `--register-drain-ms` so that pools move their slots before the close. */
  stop(): Promise<void>;
}

/** Registers the worker when `--register` is given; null otherwise. */
export async function startRegistration(
  p: ParsedFlags,
  worker: Worker,
  drafter: Drafter,
  log: Logger,
  endpoints: readonly string[] = worker.endpoints,
): Promise<WorkerRegistration | null> {
  const url = strFlag(p, "register");
  if (url === undefined) return null;
  const d = await importDiscovery();
  const modes = (drafter.capabilities & Capability.TOP32) !== 0 ? ["greedy", "top32"] : ["greedy"];
  const reg = d.register({
    etcd: url,
    prefix: strFlag(p, "register-prefix")!,
    ttlSeconds: intFlag(p, "register-ttl")!,
    logger: log,
    record: {
      kind: "worker",
      // what the bin reports in its "listening" line (the advertised addresses, --advertise)
      endpoints,
      name: worker.core.name,
      identities: {
        drafter: Buffer.from(drafter.drafterIdentity).toString("hex"),
        markov: Buffer.from(drafter.markovIdentity).toString("hex"),
      },
      geometry: {
        window: drafter.window,
        num_spec: drafter.numSpec,
        vocab_size: drafter.vocabSize,
        row_bytes: drafter.numTaps * drafter.hidden * 2,
        num_taps: drafter.numTaps,
        hidden: drafter.hidden,
        sample_modes: modes,
      },
      capacity: {
        max_sessions: intFlag(p, "max-sessions") ?? 1,
        max_slots: worker.core.maxSlots,
        max_rows_per_step: worker.core.maxRowsPerStep,
      },
    },
  });
  const drainMs = intFlag(p, "register-drain-ms")!;
  return {
    key: reg.key,
    incarnation: reg.record.incarnation,
    async stop() {
      await reg.close();
      if (drainMs > 0) {
        log.info({ drainMs }, `record revoked; serving ${drainMs} ms more while pools move their slots`);
        await new Promise((r) => setTimeout(r, drainMs));
      }
    },
  };
}
