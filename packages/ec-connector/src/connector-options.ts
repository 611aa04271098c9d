import type { Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import type { EmbeddingCache } from "./cache.js";
import type { CurveClientOptions } from "./curve.js";
import { checkCurveKey } from "./curve.js";
import type { DataTlsOptions, ShmDataOptions } from "./data/socket.js";
import type { DataTransport } from "./data/transport.js";
import { EcError } from "./errors.js";
import type { CompatibilityInfo } from "./protocol.js";
import type { HeartbeatOptions } from "./zmq.js";
import { ZmqDealerClient } from "./zmq.js";

// The public option and result shapes of ConsumerConnector (EC-CONTRACT 7), apart from its logic.

/** The consumer's control connection to one producer (a ZeroMQ DEALER, or a fake in tests). */
export interface ControlClient {
  /** Queues one message; never blocks or throws. */
  send(payload: Uint8Array): void;
  /** Drains received messages without blocking. */
  poll(): Uint8Array[];
  /** Closes the connection; no callback fires afterwards. */
  close(): void;
  /** Set by the connector: called when the peer is seen down (heartbeat timeout, disconnect). */
  onPeerDown: ((why: string) => void) | null;
  /** Set by the connector: called when a message arrives. */
  onMessage: (() => void) | null;
}

/** Retry policy for retryable outcomes (NOT_READY, ack timeout, peer down), bounded by each request's deadline. */
export interface RetryPolicy {
  /** First delay (default 10 ms). */
  initialMs?: number;
  /** Largest delay (default 200 ms). */
  maxMs?: number;
  /** Growth per attempt (default 2). */
  multiplier?: number;
}

/** Default {@link RetryPolicy}. */
export const RETRY_DEFAULTS = { initialMs: 10, maxMs: 200, multiplier: 2 } as const;

/** EC-CONTRACT 10.4: the placement a connector asks (an `EcDirectory` is one). */
export interface Placement {
  /** Control endpoints of the producers whose trusted view holds `mmHash`, best first. */
  holders(mmHash: string): string[];
}

/** Options of {@link ConsumerConnector}. */
export interface ConsumerConnectorOptions {
  /**
   * EC-CONTRACT 10.4: where `requestPlaced` finds the producers holding an item: an `EcDirectory`
   * (or anything answering `holders(mmHash)` from trusted views, most free blocks first).
   */
  placement?: Placement;
  /** The local cache (the single owner of the blocks reads land in). */
  cache: EmbeddingCache;
  /** The local data plane over `cache.region`. */
  data: DataTransport;
  /** Compatibility inputs (EC-CONTRACT 2) or a precomputed hash. `blockBytes` must equal the cache's. */
  compatibility: CompatibilityInfo | string;
  /** `ack_timeout_s` in ms: an XferReq without an ack by then is retried (default 2 000, EC-CONTRACT 6.3). */
  ackTimeoutMs?: number;
  /** `read_timeout_s` in ms: a read still PROC after it is quarantined (default 20 000, EC-CONTRACT 6.3). */
  readTimeoutMs?: number;
  /** `quarantine_timeout_s` in ms: a quarantined read still PROC after it is released (default 60 000, EC-CONTRACT 6.3). */
  quarantineTimeoutMs?: number;
  /** Verify each read's CRC-32 (default true). */
  verifyChecksum?: boolean;
  /**
   * Read-ahead (docs/ec-protocol.md 3.2 and 3.3, default true since issue 23): open each read with
   * its XferReq when the producer offers it, and take the ack from the data connection when the
   * producer offers that (`ack_ahead`): the transfer then costs one ZeroMQ hop and one data-plane
   * hop instead of two round trips (docs/benchmarks/ec-connector.md). `false`: the 1.1 sequence.
   */
  readAhead?: boolean;
  /**
   * Requests on the data connection (docs/ec-protocol.md 3.5, default true; only with `readAhead`):
   * once a producer offers `data_req`, each transfer's request is an XFER_REQ frame on a data
   * connection and the producer answers there (one round trip, no ZeroMQ hop); ZeroMQ stays the
   * fallback. `false`: requests always go on ZeroMQ (sections 3.2, 3.3).
   */
  dataRequests?: boolean;
  /** Delays between re-requests of retryable outcomes (default {@link RETRY_DEFAULTS}). */
  retry?: RetryPolicy;
  /** Close a producer's session after this long without requests (default 60 000 ms). */
  idleCloseMs?: number;
  /** ZeroMQ heartbeats of the DEALERs (default 2/4/8 s). */
  heartbeat?: HeartbeatOptions;
  /**
   * EC-CONTRACT 9.4: authenticate every DEALER with this CURVE key pair; `serverKey` is the
   * producer's public key (a function of the producer address for several producers).
   */
  curve?: CurveClientOptions;
  /** Monotonic clock (ms) used when `poll()` is called without `now` (default `performance.now`). */
  now?: () => number;
  /** Builds the control connection to a producer (default: a ZeroMQ DEALER). */
  connect?: (producer: string) => ControlClient;
  /** Where the `connector_*`, `consumer_*` and `data_*` metrics go (default: a fresh `@tapwire/stats` Registry). */
  registry?: Registry;
  /** pino logger (default: silent). */
  logger?: Logger;
}

/** Options of {@link ConsumerConnector.create}: the cache and a socket data plane are built for you. */
export interface CreateConsumerConnectorOptions extends Omit<ConsumerConnectorOptions, "cache" | "data"> {
  /** Blocks of the local cache (integer >= 1). */
  numBlocks: number;
  /** Bytes per block (integer >= 1); must equal the producer's (it is part of the compatibility hash). */
  blockBytes: number;
  /** Agent name (default "ec-consumer"). */
  name?: string;
  /** Run a data server too (`tcp://…` or `unix://…`); a consumer only reads, so it is optional. */
  dataListen?: string;
  /**
   * Checksum on a worker thread (a `SharedArrayBuffer` cache region) so the CRC-32 overlaps the
   * receive; worth it with a spare core (default false). `true` uses the thread only where this
   * process's CRC-32 runs below `CHECKSUM_THREAD_MAX_INLINE_GBPS` (a faster one stays inline,
   * which is then cheaper); `"always"` uses it regardless (`SocketDataTransport` `checksumThread`).
   */
  checksumThread?: boolean | "always";
  /** EC-CONTRACT 9.4: the client certificate, key and trusted producer certificates for `tls://` data planes. */
  tls?: DataTlsOptions;
  /**
   * docs/ec-protocol.md 3.4: read through shm rings from producers on this host that offer them
   * (`tapwire-ec-producer --data shm+unix:///path`); needs the optional peer `koffi`, else (and
   * with producers that do not offer it) the socket carries the bytes (default false).
   */
  dataShm?: boolean | ShmDataOptions;
}

/** A request that will not complete: compute the embedding locally. */
export interface FailedRequest {
  /** The embedding's content hash. */
  mmHash: string;
  /** Why it failed, in words (the NACK name, a read failure, a checksum mismatch, the deadline, an allocation failure...). */
  reason: string;
}

/** EC-CONTRACT 7: what a scheduler needs per step. */
export interface ConnectorStepResults {
  /** Promoted to ready local entries this step: read them with `cache.view(mmHash)`. */
  loaded: string[];
  /** Given up this step (NACK, read failure, checksum, deadline, cache full...). */
  failed: FailedRequest[];
  /** Still in progress after this step. */
  pending: string[];
}

/**
 * The default control connection: a ZeroMQ DEALER per producer with these heartbeats and, with
 * `curve`, its key pair and the producer's public key (EC-CONTRACT 9.4). Validates `curve`.
 */
export function dealerFactory(
  hb: HeartbeatOptions | undefined,
  curve: CurveClientOptions | undefined,
  log: Logger,
  holdMs?: number,
): (producer: string) => ControlClient {
  if (curve !== undefined) {
    if (curve === null || typeof curve !== "object")
      throw new EcError("EC_BAD_OPTION", "option curve: expected an object");
    checkCurveKey("curve.publicKey", curve.publicKey);
    checkCurveKey("curve.secretKey", curve.secretKey);
    if (typeof curve.serverKey !== "function") checkCurveKey("curve.serverKey", curve.serverKey);
  }
  return (addr) =>
    new ZmqDealerClient(addr, {
      logger: log,
      ...(holdMs === undefined ? {} : { holdMs }),
      ...(hb === undefined ? {} : { heartbeat: hb }),
      ...(curve === undefined
        ? {}
        : {
            curve: {
              publicKey: curve.publicKey,
              secretKey: curve.secretKey,
              serverKey: typeof curve.serverKey === "function" ? curve.serverKey(addr) : curve.serverKey,
            },
          }),
    });
}
