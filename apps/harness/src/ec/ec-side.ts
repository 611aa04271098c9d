/**
 * The encoder side of a run with media: the encoder process, the engine's consumer connector,
 * the producer's admin client (EC-CONTRACT 9) and the media source reading through them.
 */
import { ConsumerConnector, EcAdminClient } from "@tapwire/ec-connector";
import { createLogger, type Registry } from "@tapwire/stats";
import { type EcGeometry, ecGeometry, type RunScope, startEncoder } from "../procs/children.js";
import type { ChildService } from "../procs/procs.js";
import type { RunHooks } from "../run.js";
import { EcMedia, type EcMediaMetrics } from "./media.js";
import { Placement } from "./placement.js";

/**
 * Test-only: with this environment variable set to 1 the engine flips one bit of the first
 * transferred embedding it reads, and the run must then fail the lossless check (exit 1).
 */
export const CORRUPT_ENV = "TAPWIRE_HARNESS_TEST_CORRUPT_EMBEDDING";

/** The encoder side of a run with media: the encoder, the consumer connector, admin, the media. */
export interface EcSide {
  encoder: ChildService;
  connector: ConsumerConnector;
  admin: EcAdminClient;
  adminEndpoint: string;
  media: EcMedia;
  fallbacks: string[];
  /** `--encoders N` (N >= 2): the encoders, their events and the directory placing transfers (EC-CONTRACT 10). */
  placement: Placement | null;
}

async function connectConsumer(
  scope: RunScope,
  geo: EcGeometry,
  ecRegistry: Registry,
  placement: Placement | null,
): Promise<ConsumerConnector> {
  const ecLogger = createLogger({
    name: "tapwire-ec",
    level: scope.cfg.verbose ? "info" : "error",
    destination: 2,
  });
  const connector = await ConsumerConnector.create({
    numBlocks: geo.cacheBlocks,
    blockBytes: geo.compat.blockBytes,
    name: "harness-engine",
    compatibility: geo.compat,
    ackTimeoutMs: 1000,
    readTimeoutMs: 3000,
    quarantineTimeoutMs: 5000,
    retry: { initialMs: 10, maxMs: 100 },
    heartbeat: geo.hb,
    registry: ecRegistry,
    logger: ecLogger,
    ...(placement === null ? {} : { placement: placement.directory }),
    // --ec-data shm: read through the producers' rings (docs/ec-protocol.md 3.4)
    ...(scope.cfg.ecData === "shm" ? { dataShm: true } : {}),
  });
  scope.cleanups.push(() => connector.close());
  return connector;
}

/** The encoder (EC producer), the consumer connector and the media source. */
export async function startEc(
  scope: RunScope,
  hooks: RunHooks,
  ecRegistry: Registry,
  ecMetrics: EcMediaMetrics,
): Promise<EcSide> {
  const { cfg } = scope;
  const geo = ecGeometry(cfg);
  const placement = cfg.encoders > 1 ? await Placement.start(scope, geo, cfg.encoders, ecRegistry) : null;
  const {
    encoder,
    producerEndpoint,
    listening: el,
  } = placement === null
    ? await startEncoder(scope, geo)
    : {
        encoder: placement.encoders[0] as ChildService,
        producerEndpoint: placement.producers[0] as string,
        listening: (placement.encoders[0] as ChildService).listening ?? {},
      };
  if (scope.urls.encoder !== null) {
    scope.note(`encoder metrics on ${scope.urls.encoder} (also /healthz, /readyz)`);
    await hooks.onEncoderMetrics?.(scope.urls.encoder);
  }
  const connector = await connectConsumer(scope, geo, ecRegistry, placement);
  // EC-CONTRACT 9: admin has its own loopback socket when the producer reports one
  const adminEndpoint = typeof el["admin"] === "string" ? el["admin"] : producerEndpoint;
  const fallbacks: string[] = [];
  const media = new EcMedia({
    connector,
    producer: producerEndpoint,
    nbytes: cfg.embeddingBytes,
    deadlineMs: cfg.ecDeadlineMs,
    metrics: ecMetrics,
    corruptFirstLoad: process.env[CORRUPT_ENV] === "1",
    ...(placement === null ? {} : { placement }),
    onFallback: (h, why) => {
      if (fallbacks.length < 20) fallbacks.push(`${h.slice(0, 12)}: ${why}`);
    },
  });
  const ec: EcSide = {
    encoder,
    connector,
    admin: new EcAdminClient(adminEndpoint),
    adminEndpoint,
    media,
    fallbacks,
    placement,
  };
  scope.cleanups.push(() => ec.admin.close());
  return ec;
}
