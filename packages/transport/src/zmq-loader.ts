// zeromq is an optional peer dependency (issue 15): loaded on first use of a zmq+ endpoint, so
// tcp/unix/tls users install and import nothing of it.
import type * as Zmq from "zeromq";
import type { Endpoint } from "./endpoint.js";
import { TransportError } from "./errors.js";

/** The zeromq module, as `import("zeromq")` gives it. */
export type ZmqModule = typeof Zmq;

/** What a user whose install lacks zeromq reads (TRANSPORT_ZMQ_MISSING). */
export const ZMQ_MISSING_MESSAGE =
  'zmq+tcp:// and zmq+ipc:// endpoints need the optional peer dependency "zeromq" (6.x): ' +
  "install it next to @tapwire/transport with `npm i zeromq` or `pnpm add zeromq`; pnpm 12 " +
  "runs its install script only when allowed, so also add `allowBuilds: { zeromq: true }` to " +
  "pnpm-workspace.yaml";

let loader: () => Promise<ZmqModule> = () => import("zeromq");
let loaded: ZmqModule | null = null;
let loading: Promise<ZmqModule> | null = null;

/** The module once loaded, else null (so a connect after the first needs no await). */
export function loadedZmq(): ZmqModule | null {
  return loaded;
}

/**
 * Loads zeromq once.
 * @throws {TransportError} `TRANSPORT_ZMQ_MISSING` naming the install command when it cannot be loaded.
 */
export function loadZmq(): Promise<ZmqModule> {
  if (loaded !== null) return Promise.resolve(loaded);
  if (loading === null) {
    loading = loader().then(
      (m) => {
        // CommonJS through import(): the namespace may carry it as `default`.
        const mod = (
          typeof (m as { Router?: unknown }).Router === "function"
            ? m
            : (m as unknown as { default: ZmqModule }).default
        ) as ZmqModule;
        loaded = mod;
        return mod;
      },
      (e: unknown) => {
        loading = null;
        throw new TransportError("TRANSPORT_ZMQ_MISSING", ZMQ_MISSING_MESSAGE, { cause: e });
      },
    );
  }
  return loading;
}

/** Internal, for tests: replaces how zeromq is imported (and forgets a loaded module). */
export function setZmqLoader(fn: () => Promise<ZmqModule>): void {
  loader = fn;
  loaded = null;
  loading = null;
}

/** ZeroMQ address of an endpoint; port 0 becomes `*` (any free port). */
export function zmqAddress(ep: Endpoint): string {
  if ("path" in ep) return `ipc://${ep.path}`;
  const host = ep.host.includes(":") ? `[${ep.host}]` : ep.host;
  return `tcp://${host}:${ep.port === 0 ? "*" : ep.port}`;
}

export function isIpv6(ep: Endpoint): boolean {
  return "host" in ep && ep.host.includes(":");
}
