import type { Counter, Gauge, Histogram, InfoValue } from "@tapwire/stats";
import { BUCKETS, Registry } from "@tapwire/stats";
import type { Logger } from "pino";
import pino from "pino";
import { crc32Info } from "./crc.js";

/** The default Prometheus prefix of registries this package creates. */
export const EC_METRICS_PREFIX = "tapwire_ec_";

/** A registry with the package prefix (internal default). */
export function defaultRegistry(): Registry {
  return new Registry({ prefix: EC_METRICS_PREFIX });
}

/** A logger that logs nothing (internal default: libraries stay quiet unless given a logger). */
export function silentLogger(): Logger {
  return pino({ level: "silent" });
}

/**
 * Registers the `crc_impl` info value (`<prefix>crc_impl_info{value="@node-rs/crc32"} 1`): which
 * CRC-32 implementation this process uses (see `crc32Info`).
 */
export function crcImplInfo(r: Registry): InfoValue {
  const v = r.info(
    "crc_impl",
    "the CRC-32 implementation in use (libisal, @node-rs/crc32, node:zlib or table)",
  );
  v.set(crc32Info.impl);
  return v;
}

/** Producer-side control-plane metrics (EC-CONTRACT 4). */
export interface ProducerMetrics {
  requests: Counter;
  grants: Counter;
  /** OK acks delivered only as an ACK frame on the data plane (docs/ec-protocol.md 3.3). */
  dataAcks: Counter;
  /** XferReqs received as XFER_REQ frames on the data plane (docs/ec-protocol.md 3.5). */
  dataRequests: Counter;
  regrants: Counter;
  nacks: Record<number, Counter>;
  completions: Counter;
  unknownNotifs: Counter;
  leaseExpiries: Counter;
  malformed: Counter;
  adminRequests: Counter;
  adminRefused: Counter;
  grantsRefusedQuota: Counter;
  controlDisconnects: Counter;
  curveRefused: Counter;
  grantSeconds: Histogram;
  activeGrants: Gauge;
  pinnedBlocks: Gauge;
  freeBlocks: Gauge;
  cacheEntries: Gauge;
  evictions: Counter;
  crcImpl: InfoValue;
}

/** Registers (idempotently) and returns the producer metrics. */
export function producerMetrics(r: Registry): ProducerMetrics {
  return {
    requests: r.counter("producer_requests", "XferReqs received (EC-CONTRACT 4.2)"),
    grants: r.counter("producer_grants", "OK acks sent: blocks pinned and granted"),
    dataAcks: r.counter(
      "producer_data_acks",
      "OK acks delivered as an ACK frame on the data plane only, no control-plane copy (docs/ec-protocol.md 3.3)",
    ),
    dataRequests: r.counter(
      "producer_data_requests",
      "XferReqs received as XFER_REQ frames on a data connection (docs/ec-protocol.md 3.5)",
    ),
    regrants: r.counter("producer_regrants", "re-requests of a held grant (old pin released first)"),
    nacks: {
      1: r.counter("producer_nacks_missing", "NACK_MISSING sent"),
      2: r.counter("producer_nacks_not_ready", "NACK_NOT_READY sent"),
      3: r.counter("producer_nacks_incompat", "NACK_INCOMPAT sent"),
      4: r.counter("producer_nacks_version", "NACK_VERSION sent"),
      5: r.counter("producer_nacks_internal", "NACK_INTERNAL sent"),
    },
    completions: r.counter("producer_completions", "completion notifications that released a grant"),
    unknownNotifs: r.counter("producer_unknown_notifications", "notifications for no live grant (4.3)"),
    leaseExpiries: r.counter("producer_lease_expiries", "grants revoked and unpinned past their lease (4.4)"),
    malformed: r.counter("producer_malformed_messages", "control messages dropped as malformed (3)"),
    adminRequests: r.counter(
      "producer_admin_requests",
      "admin requests served on the admin socket (EC-CONTRACT 9.3)",
    ),
    adminRefused: r.counter(
      "producer_admin_refused",
      "admin requests that arrived on the control socket, dropped (EC-CONTRACT 9.3)",
    ),
    grantsRefusedQuota: r.counter(
      "producer_grants_refused_quota",
      "requests answered NACK_NOT_READY for a pin quota: per peer, per session, pinned fraction (EC-CONTRACT 9.2)",
    ),
    controlDisconnects: r.counter(
      "producer_control_disconnects",
      "control connections the ROUTER dropped: an over-64-KiB message (EC-CONTRACT 9.1), a heartbeat timeout or a peer gone",
    ),
    curveRefused: r.counter(
      "producer_curve_handshakes_refused",
      "CURVE handshakes the ZAP handler refused: client key not allowed (EC-CONTRACT 9.4)",
    ),
    grantSeconds: r.histogram("producer_grant_seconds", {
      help: "grant to completion notification: how long a transfer held its pin (EC-CONTRACT 4.3)",
      unit: "seconds",
      buckets: BUCKETS.EC_TRANSFER_SECONDS,
    }),
    activeGrants: r.gauge("producer_active_grants", "grants currently held"),
    pinnedBlocks: r.gauge("producer_pinned_blocks", "cache blocks pinned by grants"),
    freeBlocks: r.gauge("producer_free_blocks", "free cache blocks"),
    cacheEntries: r.gauge("producer_cache_entries", "entries in the producer cache"),
    evictions: r.counter("producer_evictions", "cache entries evicted (LRU)"),
    crcImpl: crcImplInfo(r),
  };
}

/** Consumer-side metrics (EC-CONTRACT 6, 7). */
export interface ConsumerMetrics {
  requests: Counter;
  acksOk: Counter;
  nacks: Record<number, Counter>;
  ignoredAcks: Counter;
  ackTimeouts: Counter;
  reads: Counter;
  readsCompleted: Counter;
  readBytes: Counter;
  readSeconds: Histogram;
  readFailures: Counter;
  /** READ_AHEADs posted with an XferReq (docs/ec-protocol.md 3.2). */
  readAheads: Counter;
  /** READ_AHEADs that failed and were replaced by a READ after the ack. */
  readAheadFallbacks: Counter;
  /** XferAcks taken from an ACK frame on the data plane (docs/ec-protocol.md 3.3). */
  dataAcks: Counter;
  /** Acks ignored because their `xfer_id` names another request (docs/ec-protocol.md 3.3). */
  staleAcks: Counter;
  /** Requests sent as XFER_REQ frames on a data connection (docs/ec-protocol.md 3.5). */
  dataRequests: Counter;
  /** XFER_REQs whose connection failed before the answer (retried on the control plane). */
  dataRequestFailures: Counter;
  checksumFailures: Counter;
  sourceMismatches: Counter;
  quarantines: Counter;
  settles: Counter;
  quarantineTimeouts: Counter;
  blocksRetired: Counter;
  malformed: Counter;
  peerDown: Counter;
  crcImpl: InfoValue;
}

/** Registers (idempotently) and returns the consumer session metrics. */
export function consumerMetrics(r: Registry): ConsumerMetrics {
  return {
    requests: r.counter("consumer_requests", "XferReqs sent (EC-CONTRACT 6.1)"),
    acksOk: r.counter("consumer_acks_ok", "OK acks received"),
    nacks: {
      1: r.counter("consumer_nacks_missing", "NACK_MISSING received"),
      2: r.counter("consumer_nacks_not_ready", "NACK_NOT_READY received"),
      3: r.counter("consumer_nacks_incompat", "NACK_INCOMPAT received"),
      4: r.counter("consumer_nacks_version", "NACK_VERSION received"),
      5: r.counter("consumer_nacks_internal", "NACK_INTERNAL received"),
    },
    ignoredAcks: r.counter("consumer_ignored_acks", "unknown, duplicate or foreign-session acks (6.2)"),
    ackTimeouts: r.counter("consumer_ack_timeouts", "requests without an ack in ack_timeout (6.3)"),
    reads: r.counter("consumer_reads", "data-plane reads posted"),
    readsCompleted: r.counter("consumer_reads_completed", "reads DONE with a valid checksum"),
    readBytes: r.counter("consumer_read_bytes", "bytes of completed reads"),
    readSeconds: r.histogram("consumer_read_seconds", {
      help: "read time from post to DONE",
      unit: "seconds",
      buckets: BUCKETS.EC_TRANSFER_SECONDS,
    }),
    readFailures: r.counter("consumer_read_failures", "reads ending READ_FAILED"),
    readAheads: r.counter(
      "consumer_read_aheads",
      "reads opened with the XferReq, before the ack (docs/ec-protocol.md 3.2)",
    ),
    readAheadFallbacks: r.counter(
      "consumer_read_ahead_fallbacks",
      "read-aheads that failed and were replaced by a read after the ack",
    ),
    dataAcks: r.counter(
      "consumer_data_acks",
      "XferAcks taken from an ACK frame on the data plane (docs/ec-protocol.md 3.3)",
    ),
    staleAcks: r.counter(
      "consumer_stale_acks",
      "acks ignored: their xfer_id names an earlier request (docs/ec-protocol.md 3.3)",
    ),
    dataRequests: r.counter(
      "consumer_data_requests",
      "requests sent as XFER_REQ frames on a data connection (docs/ec-protocol.md 3.5)",
    ),
    dataRequestFailures: r.counter(
      "consumer_data_request_failures",
      "XFER_REQs whose data connection failed before the answer (retried on the control plane)",
    ),
    checksumFailures: r.counter("consumer_checksum_failures", "reads whose CRC-32 differed from the ack's"),
    sourceMismatches: r.counter(
      "consumer_source_mismatches",
      "shared-region reads whose bytes came from other than the ack's blocks (docs/ec-protocol.md 3.4)",
    ),
    quarantines: r.counter("consumer_quarantines", "reads quarantined (PROC past deadline or peer down)"),
    settles: r.counter("consumer_settles", "quarantined reads that left PROC (blocks freed)"),
    quarantineTimeouts: r.counter(
      "consumer_quarantine_timeouts",
      "quarantined reads released after the timeout",
    ),
    blocksRetired: r.counter(
      "consumer_blocks_retired",
      "blocks retired: released without a no-write guarantee",
    ),
    malformed: r.counter("consumer_malformed_messages", "acks dropped as malformed (3)"),
    peerDown: r.counter("consumer_peer_down", "peer-down events (heartbeat or disconnect)"),
    crcImpl: crcImplInfo(r),
  };
}

/** Data-plane metrics (EC-CONTRACT 5), reader and server side. */
export interface DataMetrics {
  served: Counter;
  refused: Counter;
  bytesSent: Counter;
  malformed: Counter;
  notifications: Counter;
  connections: Gauge;
  readErrors: Counter;
  bytesReceived: Counter;
  staleNotifications: Counter;
  connectionsRefused: Counter;
  idleClosed: Counter;
  allocFailures: Counter;
  tlsRefused: Counter;
  /** READ_AHEADs that waited for their grant (docs/ec-protocol.md 3.2). */
  readAheadParked: Counter;
  /** READ_AHEADs served (docs/ec-protocol.md 3.2). */
  readAheadServed: Counter;
  /** ACK frames written before DATA (docs/ec-protocol.md 3.3). */
  ackFrames: Counter;
  /** XFER_REQ frames received (docs/ec-protocol.md 3.5). */
  xferRequests: Counter;
}

/** Registers (idempotently) and returns the data-plane metrics. */
export function dataMetrics(r: Registry): DataMetrics {
  return {
    served: r.counter("data_reads_served", "data-plane reads served (EC-CONTRACT 5.3)"),
    readAheadParked: r.counter(
      "data_read_ahead_waited",
      "READ_AHEADs that arrived before their grant and waited for it (docs/ec-protocol.md 3.2)",
    ),
    readAheadServed: r.counter(
      "data_read_ahead_served",
      "READ_AHEADs served under their grant (docs/ec-protocol.md 3.2)",
    ),
    ackFrames: r.counter(
      "data_ack_frames",
      "XferAcks sent as an ACK frame before DATA on a READ_AHEAD (docs/ec-protocol.md 3.3)",
    ),
    xferRequests: r.counter(
      "data_xfer_requests",
      "XFER_REQ frames received: transfer requests on a data connection (docs/ec-protocol.md 3.5)",
    ),
    refused: r.counter("data_reads_refused", "data-plane reads refused: no grant, wrong blocks, expired"),
    bytesSent: r.counter("data_sent_bytes", "block bytes streamed by the data server"),
    malformed: r.counter("data_malformed_frames", "data-plane frames dropped as malformed"),
    notifications: r.counter("data_notifications", "completion notifications received"),
    connections: r.gauge("data_server_connections", "open data-server connections"),
    readErrors: r.counter("data_read_errors", "reads that ended ERR at this reader"),
    bytesReceived: r.counter("data_received_bytes", "block bytes received by this reader"),
    staleNotifications: r.counter(
      "data_stale_notifications",
      "notifications dropped because their grant was replaced or revoked meanwhile",
    ),
    connectionsRefused: r.counter(
      "data_connections_refused",
      "data-server connections refused: over the cap at accept, or the oldest never-served one when half the cap is unproven (EC-CONTRACT 9.5)",
    ),
    idleClosed: r.counter("data_idle_closed", "data-server connections closed idle (EC-CONTRACT 9.5)"),
    allocFailures: r.counter(
      "data_alloc_failures",
      "data connections closed because a receive buffer could not be allocated (EC-CONTRACT 9.5)",
    ),
    tlsRefused: r.counter(
      "data_tls_handshakes_refused",
      "TLS handshakes the data server refused: no or unknown client certificate (EC-CONTRACT 9.4)",
    ),
  };
}

/** Connector-level metrics (EC-CONTRACT 7). */
export interface ConnectorMetrics {
  requests: Counter;
  loaded: Counter;
  failed: Counter;
  retries: Counter;
  evictions: Counter;
  pending: Gauge;
  sessions: Gauge;
  freeBlocks: Gauge;
  pinnedBlocks: Gauge;
  retiredBlocks: Gauge;
}

/** Registers (idempotently) and returns the connector metrics. */
export function connectorMetrics(r: Registry): ConnectorMetrics {
  return {
    requests: r.counter("connector_requests", "requests accepted by the connector (EC-CONTRACT 7)"),
    loaded: r.counter("connector_loaded", "embeddings promoted to ready local entries"),
    failed: r.counter("connector_failed", "requests given up (compute locally)"),
    retries: r.counter("connector_retries", "re-requests after NOT_READY, ack timeout or peer down"),
    evictions: r.counter("consumer_evictions", "local cache entries evicted (LRU)"),
    pending: r.gauge("connector_pending", "requests in progress"),
    sessions: r.gauge("connector_sessions", "producer sessions open"),
    freeBlocks: r.gauge("consumer_free_blocks", "free local cache blocks"),
    pinnedBlocks: r.gauge("consumer_pinned_blocks", "pinned local cache blocks"),
    retiredBlocks: r.gauge("consumer_retired_blocks", "retired local cache blocks (never reused)"),
  };
}
