/**
 * The scripted worker's listener (client mode): node:net streams with the little-endian prefix
 * of CONTRACT 3, or a ZeroMQ ROUTER, turned into one queue of events (a connection opened, a
 * message, a connection closed) that the cases read in order.
 */
import * as net from "node:net";
import * as zmq from "zeromq";
import type { Endpoint } from "../conn.js";
import { parseEndpoint } from "../conn.js";
import { ConformanceError } from "../errors.js";
import { lePrefix, u32 } from "../frames.js";

/** A client connection as the scripted worker sees it. */
export interface ServerConn {
  readonly id: number;
  /** Sends one message (stream: with its LE prefix). */
  send(msg: Uint8Array): void;
  /** Stream: raw bytes (a reply cut short). ZeroMQ: one message. */
  sendRaw(bytes: Uint8Array): void;
  /** Closes the connection (ZeroMQ: forgets the peer). */
  close(): void;
  readonly closed: boolean;
}

/** One event of the listener. */
export type ServerEvent =
  | { kind: "open"; conn: ServerConn; at: number }
  | { kind: "msg"; conn: ServerConn; msg: Uint8Array; at: number }
  | { kind: "close"; conn: ServerConn; byPeer: boolean; at: number }
  | { kind: "bad-prefix"; conn: ServerConn; prefix: Uint8Array; at: number };

/** The listener. */
export class ScriptedListener {
  private q: ServerEvent[] = [];
  private waiters: (() => void)[] = [];
  private nextId = 1;
  private closers: (() => Promise<void>)[] = [];
  /** The endpoint actually bound (a tcp port 0 resolved). */
  endpoint = "";
  /** False on ZeroMQ, where a peer's "connection" has no close to observe. */
  stream = true;

  private push(e: ServerEvent): void {
    this.q.push(e);
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** Next event, or null after `ms`. */
  next(ms: number): Promise<ServerEvent | null> {
    const e = this.q.shift();
    if (e !== undefined) return Promise.resolve(e);
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== f);
        resolve(null);
      }, ms);
      const f = (): void => {
        const x = this.q.shift();
        if (x === undefined) {
          this.waiters.push(f);
          return;
        }
        clearTimeout(t);
        resolve(x);
      };
      this.waiters.push(f);
    });
  }

  /** Binds `url` (tcp, unix, zmq+tcp, zmq+ipc). */
  async listen(url: string): Promise<void> {
    const ep = parseEndpoint(url);
    if (ep.scheme === "zmq+tcp" || ep.scheme === "zmq+ipc") await this.#listenZmq(url, ep);
    else await this.#listenStream(url, ep);
  }

  /** A ROUTER: each routing id is one connection (a ROUTER never sees a peer close). */
  async #listenZmq(url: string, ep: Endpoint): Promise<void> {
    const r = new zmq.Router({ linger: 0 });
    const addr = ep.scheme === "zmq+tcp" ? `tcp://${ep.host}:${ep.port}` : `ipc://${ep.path}`;
    await r.bind(addr);
    this.endpoint = url;
    this.stream = false;
    const peers = new Map<string, ServerConn>();
    void (async () => {
      for (;;) {
        let parts: Buffer[];
        try {
          parts = await r.receive();
        } catch {
          return;
        }
        const rid = parts[0]!;
        const key = rid.toString("hex");
        let c = peers.get(key);
        if (c === undefined || c.closed) {
          let closed = false;
          const id = this.nextId++;
          c = {
            id,
            send: (m) => {
              if (!closed) void r.send([rid, m]).catch(() => undefined);
            },
            sendRaw: (m) => {
              if (!closed) void r.send([rid, m]).catch(() => undefined);
            },
            close: () => {
              closed = true;
            },
            get closed() {
              return closed;
            },
          };
          peers.set(key, c);
          this.push({ kind: "open", conn: c, at: performance.now() });
        }
        this.push({
          kind: "msg",
          conn: c,
          msg: new Uint8Array(Buffer.concat(parts.slice(1))),
          at: performance.now(),
        });
      }
    })();
    this.closers.push(async () => {
      r.close();
    });
  }

  /** tcp or unix: u32 little-endian length-prefixed messages (CONTRACT 3). */
  async #listenStream(url: string, ep: Endpoint): Promise<void> {
    if (ep.scheme === "tls")
      throw new ConformanceError(
        "CONFORMANCE_BAD_ENDPOINT",
        "client mode listens on tcp://, unix://, zmq+tcp:// or zmq+ipc://",
      );
    const sockets = new Set<net.Socket>();
    const server = net.createServer((sock) => {
      sockets.add(sock);
      if (ep.scheme === "tcp") sock.setNoDelay(true);
      const id = this.nextId++;
      let closed = false;
      let byUs = false;
      const conn: ServerConn = {
        id,
        send: (m) => {
          if (!closed) sock.write(Buffer.concat([lePrefix(m.length), m]));
        },
        sendRaw: (m) => {
          if (!closed) sock.write(m);
        },
        close: () => {
          if (closed) return;
          closed = true;
          byUs = true;
          sock.destroy();
        },
        get closed() {
          return closed;
        },
      };
      this.push({ kind: "open", conn, at: performance.now() });
      let buf: Buffer = Buffer.alloc(0);
      sock.on("data", (d: Buffer) => {
        buf = buf.length === 0 ? d : Buffer.concat([buf, d]);
        while (buf.length >= 4) {
          const len = u32(buf, 0);
          if (len > 64 * 1024 * 1024) {
            this.push({
              kind: "bad-prefix",
              conn,
              prefix: new Uint8Array(buf.subarray(0, 4)),
              at: performance.now(),
            });
            conn.close();
            return;
          }
          if (buf.length < 4 + len) return;
          const m = new Uint8Array(buf.subarray(4, 4 + len));
          buf = buf.subarray(4 + len);
          this.push({ kind: "msg", conn, msg: m, at: performance.now() });
        }
      });
      const end = () => {
        sockets.delete(sock);
        closed = true;
        this.push({ kind: "close", conn, byPeer: !byUs, at: performance.now() });
      };
      sock.once("close", end);
      sock.on("error", () => undefined);
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      if (ep.scheme === "unix") server.listen(ep.path, () => resolve());
      else server.listen(ep.port, ep.host, () => resolve());
    });
    const a = server.address();
    this.endpoint = ep.scheme === "unix" ? url : `tcp://${ep.host}:${(a as net.AddressInfo).port}`;
    this.closers.push(
      () =>
        new Promise<void>((r) => {
          for (const s of sockets) s.destroy();
          server.close(() => r());
        }),
    );
  }

  /** Closes the listener and every connection. */
  async close(): Promise<void> {
    for (const c of this.closers) await c();
    this.closers = [];
  }
}
