// Shared test environment: the scheme matrix, deterministic payloads. Socket paths and TLS
// credentials come from the private @tapwire/testing package.
import { makeTlsCredentials, uniqueSocketPath } from "@tapwire/testing";
import { serverConfig } from "../../src/config.js";
import {
  type ClientOptions,
  type Handler,
  type listen,
  parseEndpoint,
  type RpcServer,
  type ServerOptions,
} from "../../src/index.js";
import { StreamServer } from "../../src/stream-server.js";

export { uniqueSocketPath };

/** TLS material for tests (openssl-generated once per process by @tapwire/testing). */
export function tlsCreds(): ReturnType<typeof makeTlsCredentials> {
  return makeTlsCredentials();
}

/** One transport under test: where to listen and the options each side needs. */
export interface Case {
  scheme: string;
  listen(): string;
  server: ServerOptions;
  client: ClientOptions;
  /** Stream schemes share the u32 length-prefix framing; ZeroMQ frames messages itself. */
  stream: boolean;
  /** How to start a server (default: the public `listen`). */
  listenFn?: typeof listen;
}

/**
 * Like `listen` for tcp/unix, but the server reads through 'data' events: the fallback taken when
 * Node does not honour the handle move that gives accepted sockets `onread` (stream-server.ts).
 */
export async function listenDataEvents(
  endpoint: string,
  handler: Handler,
  options: ServerOptions = {},
): Promise<RpcServer> {
  const ep = parseEndpoint(endpoint);
  const s = new StreamServer(ep, handler, { ...serverConfig(ep, options), dataEvents: true });
  await s.start();
  return s;
}

/**
 * Like `listen` for stream schemes, with the receive buffers allocated by `allocate` (to make
 * an allocation fail on purpose, CONTRACT 11).
 */
export async function listenWithAllocator(
  endpoint: string,
  handler: Handler,
  options: ServerOptions,
  allocate: (size: number) => Buffer,
): Promise<RpcServer> {
  const ep = parseEndpoint(endpoint);
  const s = new StreamServer(ep, handler, { ...serverConfig(ep, options), allocate });
  await s.start();
  return s;
}

/** tcp and unix cases whose servers read through 'data' events (see listenDataEvents). */
export function dataEventCases(): Case[] {
  return matrix()
    .filter((c) => c.scheme === "tcp" || c.scheme === "unix")
    .map((c) => ({ ...c, scheme: `${c.scheme} (data events)`, listenFn: listenDataEvents }));
}

/** One case of {@link matrix} by scheme. */
export function caseOf(scheme: string): Case {
  const t = matrix().find((c) => c.scheme === scheme);
  if (t === undefined) throw new Error(`no test case for scheme ${scheme}`);
  return t;
}

/** Every scheme, with port 0 / unique socket paths (CONTRACT 3). */
export function matrix(): Case[] {
  const c = tlsCreds();
  return [
    { scheme: "tcp", listen: () => "tcp://127.0.0.1:0", server: {}, client: {}, stream: true },
    { scheme: "unix", listen: () => `unix://${uniqueSocketPath("u")}`, server: {}, client: {}, stream: true },
    {
      scheme: "tls",
      listen: () => "tls://127.0.0.1:0",
      server: { tls: { cert: c.serverCert, key: c.serverKey } },
      client: { tls: { ca: c.ca } },
      stream: true,
    },
    { scheme: "zmq+tcp", listen: () => "zmq+tcp://127.0.0.1:0", server: {}, client: {}, stream: false },
    {
      scheme: "zmq+ipc",
      listen: () => `zmq+ipc://${uniqueSocketPath("z")}`,
      server: {},
      client: {},
      stream: false,
    },
    // issue 23: a unix doorbell and shared memory; the client-side semantics are the stream ones
    {
      scheme: "shm+unix",
      listen: () => `shm+unix://${uniqueSocketPath("m")}`,
      server: {},
      client: {},
      stream: true,
    },
  ];
}

/** Deterministic bytes for content checks. */
export function pattern(n: number, seed: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  let x = (seed * 2654435761) >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    b[i] = x & 0xff;
  }
  return b;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
