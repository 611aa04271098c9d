import type { Counter, Gauge, Registry } from "@tapwire/stats";
import { TlsFailureReason } from "./options.js";

/** Server-side metrics (stable names; the registry adds its prefix, and `_total` to counters in Prometheus). */
export interface ServerMetrics {
  connections: Counter;
  open: Gauge;
  requests: Counter;
  bytesIn: Counter;
  bytesOut: Counter;
  errors: Counter;
  tooLarge: Counter;
  placedMessages: Counter;
  placedBytes: Counter;
  placedCopiedBytes: Counter;
  placedScatterReads: Counter;
  allocFailures: Counter;
  bufferedBytes: Gauge;
  budgetWaits: Counter;
  budgetRefused: Counter;
  connectionsRefused: Counter;
  connectionsEvicted: Counter;
  boundEvicted: Counter;
  unbound: Gauge;
  unboundIdleClosed: Counter;
  oversizeReplies: Counter;
  tlsFailures: Counter;
  tlsFailuresBy: Readonly<Record<TlsFailureReason, Counter>>;
}

export function serverMetrics(r: Registry): ServerMetrics {
  return {
    connections: r.counter("transport_server_connections", "connections accepted"),
    open: r.gauge("transport_server_connections_open", "connections open now"),
    requests: r.counter("transport_server_requests", "requests handled"),
    bytesIn: r.counter("transport_server_bytes_in", "bytes received, length prefixes included"),
    bytesOut: r.counter("transport_server_bytes_out", "bytes sent, length prefixes included"),
    errors: r.counter(
      "transport_server_errors",
      "connections ended by an error: handler threw, bad reply, truncated request, socket error",
    ),
    tooLarge: r.counter("transport_server_too_large", "messages refused above maxMessageBytes"),
    placedMessages: r.counter(
      "transport_server_placed_messages",
      "requests whose rest a receiveInto hook placed, handed to the handler",
    ),
    placedBytes: r.counter(
      "transport_server_placed_bytes",
      "bytes of placed requests written into receiveInto segments (read straight into them or copied)",
    ),
    placedCopiedBytes: r.counter(
      "transport_server_placed_copied_bytes",
      "the part of transport_server_placed_bytes copied from a read buffer, not read in place",
    ),
    placedScatterReads: r.counter(
      "transport_server_placed_scatter_reads",
      "readv(2) calls that read placed bytes into several receiveInto segments at once (with koffi)",
    ),
    allocFailures: r.counter(
      "transport_server_alloc_failures",
      "connections closed because a receive buffer could not be allocated",
    ),
    bufferedBytes: r.gauge(
      "transport_server_buffered_bytes",
      "receive bytes charged to maxBufferedBytes now (reassembly buffers, ZeroMQ messages in flight)",
    ),
    budgetWaits: r.counter(
      "transport_server_budget_waits",
      "times a bound connection was paused until its next message fit maxBufferedBytes",
    ),
    budgetRefused: r.counter(
      "transport_server_budget_refused",
      "unbound connections closed because their next message did not fit maxBufferedBytes",
    ),
    connectionsRefused: r.counter(
      "transport_server_connections_refused",
      "new connections refused at maxConnections (no unbound connection to evict)",
    ),
    connectionsEvicted: r.counter(
      "transport_server_connections_evicted",
      "unbound connections closed to make room for a new one (maxConnections)",
    ),
    boundEvicted: r.counter(
      "transport_server_bound_evicted",
      "ZeroMQ only: bound peers idle longest forgotten to make room for a new one at maxConnections (no unbound peer to evict)",
    ),
    unbound: r.gauge("transport_server_connections_unbound", "connections open now and not bound"),
    unboundIdleClosed: r.counter(
      "transport_server_unbound_idle_closed",
      "unbound connections closed after unboundIdleMs without a whole message",
    ),
    oversizeReplies: r.counter(
      "transport_server_oversize_replies",
      "replies written by onOversize before closing an unbound connection",
    ),
    tlsFailures: r.counter("transport_server_tls_failures", "TLS handshakes refused or failed"),
    tlsFailuresBy: Object.fromEntries(
      Object.values(TlsFailureReason).map((reason) => [
        reason,
        r.counter(`transport_server_tls_failures_${reason}`, `TLS handshakes failed: ${reason}`),
      ]),
    ) as Record<TlsFailureReason, Counter>,
  };
}

/** Client-side metrics. */
export interface ClientMetrics {
  connects: Counter;
  requests: Counter;
  bytesIn: Counter;
  bytesOut: Counter;
  timeouts: Counter;
  errors: Counter;
  gatheredWrites: Counter;
}

export function clientMetrics(r: Registry): ClientMetrics {
  return {
    connects: r.counter("transport_client_connects", "successful connects"),
    requests: r.counter("transport_client_requests", "requests completed with a reply"),
    bytesIn: r.counter("transport_client_bytes_in", "reply bytes received, length prefixes included"),
    bytesOut: r.counter("transport_client_bytes_out", "request bytes sent, length prefixes included"),
    timeouts: r.counter("transport_client_timeouts", "requests that timed out"),
    errors: r.counter("transport_client_errors", "requests failed for any reason but timeout or busy"),
    gatheredWrites: r.counter(
      "transport_client_gathered_writes",
      "requests of many parts written with one writev(2) from the caller's buffers (tcp/unix, with koffi)",
    ),
  };
}
