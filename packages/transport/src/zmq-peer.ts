// One peer (routing id) of the ZeroMQ server's ROUTER, and the messages it has queued.
import type { Limited } from "./limits.js";
import type { ConnInfo } from "./options.js";
import type { ZmqServer } from "./zmq-server.js";

/** A message received from a peer, with the receive budget it holds until it is answered. */
export interface Held {
  msg: Buffer[];
  total: number;
}

/**
 * State kept per ROUTER peer (routing id): ZeroMQ's idea of a connection. Everything a peer
 * holds (queued messages, its reassembly buffer, its budget) goes when it is forgotten.
 */
export class Peer implements ConnInfo, Limited {
  readonly id: number;
  readonly remote: string;
  readonly routingId: Buffer;
  readonly key: string;
  busy = false;
  lastActive = 0;
  readonly queue: Held[] = [];
  /** Multipart reassembly buffer, kept only while the peer is bound (and charged meanwhile). */
  asm: Buffer | null = null;
  asmCharge = 0;
  forgotten = false;
  #bound = false;
  readonly #srv: ZmqServer;

  constructor(id: number, routingId: Buffer, key: string, srv: ZmqServer) {
    this.id = id;
    this.routingId = routingId;
    this.key = key;
    this.remote = `zmq:${routingId.toString("hex")}`;
    this.#srv = srv;
  }

  get isBusy(): boolean {
    return this.busy;
  }

  /** False once forgotten (evicted, idle, closed): a forgotten peer holds no binding. */
  get bound(): boolean {
    return this.#bound && !this.forgotten;
  }

  bind(): void {
    if (this.#bound || this.forgotten) return;
    this.#bound = true;
    this.#srv.limits.setBound(this, true);
  }

  unbind(): void {
    if (!this.#bound || this.forgotten) return;
    this.#bound = false;
    this.lastActive = Date.now();
    this.#srv.dropAsm(this);
    this.#srv.limits.setBound(this, false);
  }

  evict(): void {
    this.#srv.forget(this);
  }

  /** ZeroMQ cannot close one peer of a ROUTER: forget it and never answer it again. */
  close(): void {
    this.#srv.forget(this);
  }
}
