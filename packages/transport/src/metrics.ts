import type { MetricsRegistry } from "./options.js";

type CounterLike = ReturnType<MetricsRegistry["counter"]>;
type GaugeLike = ReturnType<MetricsRegistry["gauge"]>;

class Cell {
  value = 0;
  inc(n = 1): void {
    this.value += n;
  }
  dec(n = 1): void {
    this.value -= n;
  }
  set(v: number): void {
    this.value = v;
  }
}

/** Fallback registry when the caller gives none: plain numbers, same names. */
export class LocalRegistry implements MetricsRegistry {
  private readonly cells = new Map<string, Cell>();
  counter(name: string): Cell {
    let c = this.cells.get(name);
    if (c === undefined) {
      c = new Cell();
      this.cells.set(name, c);
    }
    return c;
  }
  gauge(name: string): Cell {
    return this.counter(name);
  }
}

/** Server-side metrics (names are stable; a registry prefix is prepended by the registry). */
export interface ServerMetrics {
  connections: CounterLike;
  open: GaugeLike;
  requests: CounterLike;
  bytesIn: CounterLike;
  bytesOut: CounterLike;
  errors: CounterLike;
  tooLarge: CounterLike;
}

export function serverMetrics(r: MetricsRegistry): ServerMetrics {
  return {
    connections: r.counter("transport_server_connections_total", "connections accepted"),
    open: r.gauge("transport_server_connections_open", "connections open now"),
    requests: r.counter("transport_server_requests_total", "requests handled"),
    bytesIn: r.counter("transport_server_bytes_in_total", "bytes received, length prefixes included"),
    bytesOut: r.counter("transport_server_bytes_out_total", "bytes sent, length prefixes included"),
    errors: r.counter(
      "transport_server_errors_total",
      "connections ended by an error: handler threw, bad reply, protocol, socket error",
    ),
    tooLarge: r.counter("transport_server_too_large_total", "messages refused above maxMessageBytes"),
  };
}

/** Client-side metrics. */
export interface ClientMetrics {
  connects: CounterLike;
  requests: CounterLike;
  bytesIn: CounterLike;
  bytesOut: CounterLike;
  timeouts: CounterLike;
  errors: CounterLike;
}

export function clientMetrics(r: MetricsRegistry): ClientMetrics {
  return {
    connects: r.counter("transport_client_connects_total", "successful connects"),
    requests: r.counter("transport_client_requests_total", "requests completed with a reply"),
    bytesIn: r.counter("transport_client_bytes_in_total", "reply bytes received, length prefixes included"),
    bytesOut: r.counter("transport_client_bytes_out_total", "request bytes sent, length prefixes included"),
    timeouts: r.counter("transport_client_timeouts_total", "requests that timed out"),
    errors: r.counter("transport_client_errors_total", "requests failed for any reason but timeout or busy"),
  };
}
