/**
 * `tapwire-ec-producer --register etcd://…` (issue 21): the producer's discovery record (kind
 * `encoder`) kept under an etcd lease, revoked on a clean stop. `@tapwire/discovery` is an
 * optional peer of this package, loaded with a dynamic import only when `--register` is given.
 */
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import type { Logger } from "@tapwire/stats";
import { advertiseControl } from "../advertise.js";
import type { EcProducer } from "../producer.js";

/** The discovery flags, spread into the bin's FLAGS table. */
export const REGISTER_FLAGS = {
  register: {
    kind: "string",
    arg: "<etcd://host:port>",
    help: "keep a record of this producer in etcd under a lease (needs @tapwire/discovery; off when not given)",
  },
  "register-prefix": { kind: "string", arg: "<prefix>", help: "etcd key prefix", def: "/tapwire/v1/" },
  "register-ttl": {
    kind: "int",
    arg: "<s>",
    help: "lease TTL in seconds (revoked on a clean stop)",
    def: 10,
  },
} as const;

interface DiscoveryModule {
  register(options: {
    etcd: string;
    prefix?: string;
    ttlSeconds?: number;
    logger?: Logger;
    record: {
      kind: "encoder";
      endpoints: readonly string[];
      name?: string;
      identities?: Record<string, string>;
      geometry?: Record<string, number | string | readonly string[]>;
      capacity?: Record<string, number>;
      residency?: { events: string; replay: string; incarnation?: string };
    };
  }): { key: string; record: { incarnation: string }; close(): Promise<void> };
}

const DISCOVERY_PACKAGE = "@tapwire/discovery";

async function importDiscovery(): Promise<DiscoveryModule> {
  for (const base of [import.meta.url, pathToFileURL(join(process.cwd(), "package.json")).href]) {
    let path: string;
    try {
      path = createRequire(base).resolve(DISCOVERY_PACKAGE);
    } catch {
      continue;
    }
    return (await import(pathToFileURL(path).href)) as DiscoveryModule;
  }
  throw new Error(
    `--register needs ${DISCOVERY_PACKAGE}, which is not installed; install it with: npm install ${DISCOVERY_PACKAGE}`,
  );
}

/** Registers the producer when `--register` is given; returns the stop (revoke) function or null. */
export async function startRegistration(
  v: {
    register?: unknown;
    "register-prefix"?: unknown;
    "register-ttl"?: unknown;
    name?: unknown;
    advertise?: unknown;
  },
  p: EcProducer,
  log: Logger,
): Promise<(() => Promise<void>) | null> {
  if (v.register === undefined) return null;
  const d = await importDiscovery();
  const hex = /^[0-9a-f]+$/i.test(String(p.compatibilityHash))
    ? String(p.compatibilityHash).toLowerCase()
    : null;
  const advertise = v.advertise === undefined ? undefined : String(v.advertise);
  // issue 22: the residency stream, advertised like the control endpoint (HOST of --advertise, bound port)
  const residency =
    p.events === null
      ? undefined
      : {
          events: advertiseControl(p.events.eventsEndpoint, advertise).endpoint,
          replay: advertiseControl(p.events.replayEndpoint, advertise).endpoint,
          incarnation: p.events.incarnation,
        };
  const reg = d.register({
    etcd: String(v.register),
    prefix: String(v["register-prefix"] ?? REGISTER_FLAGS["register-prefix"].def),
    ttlSeconds: Number(v["register-ttl"] ?? REGISTER_FLAGS["register-ttl"].def),
    logger: log,
    record: {
      kind: "encoder",
      // control ROUTER first (what consumers dial), then the data server
      endpoints: [p.advertised.control.endpoint, p.dataEndpoint],
      name: String(v.name ?? ""),
      identities: hex !== null ? { ec_compat: hex } : {},
      geometry: { data_kind: String(p.data.kind) },
      capacity: { num_blocks: p.cache.numBlocks, block_bytes: p.cache.blockBytes },
      ...(residency === undefined ? {} : { residency }),
    },
  });
  return () => reg.close();
}
