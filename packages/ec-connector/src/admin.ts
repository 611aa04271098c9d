import { EcError } from "./errors.js";
import { packMsg, unpackReply } from "./protocol.js";
import { ZmqDealerClient } from "./zmq.js";

/**
 * A small client for the producer's admin requests (a tapwire extension on the control plane, see
 * docs/ec-protocol.md): `stats`, `encode`, `check`, `ping`. One request at a time per client is
 * answered in order.
 */
export class EcAdminClient {
  readonly #dealer: ZmqDealerClient;
  readonly #waiting: {
    resolve: (m: Record<string, unknown>) => void;
    reject: (e: Error) => void;
    timer: NodeJS.Timeout;
  }[] = [];
  #closed = false;

  /** Connects a DEALER to the producer's control endpoint. */
  constructor(endpoint: string) {
    this.#dealer = new ZmqDealerClient(endpoint, { heartbeat: { intervalMs: 0 } });
    this.#dealer.onMessage = () => {
      for (const raw of this.#dealer.poll()) {
        const w = this.#waiting.shift();
        if (w === undefined) continue;
        clearTimeout(w.timer);
        try {
          w.resolve(unpackReply(raw, "admin reply"));
        } catch (err) {
          w.reject(err as Error);
        }
      }
    };
  }

  /** Sends `{op, ...fields}` and resolves with the reply map; rejects with `EC_DATA` after `timeoutMs`. */
  request(
    op: string,
    fields: Record<string, unknown> = {},
    timeoutMs = 5_000,
  ): Promise<Record<string, unknown>> {
    if (this.#closed) return Promise.reject(new EcError("EC_CLOSED", "admin client: closed"));
    const err = new EcError("EC_DATA", `admin ${op}: no reply within ${timeoutMs} ms`);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        const i = this.#waiting.findIndex((w) => w.timer === timer);
        if (i >= 0) this.#waiting.splice(i, 1);
        reject(err);
      }, timeoutMs);
      this.#waiting.push({ resolve, reject, timer });
      this.#dealer.send(packMsg({ ...fields, op }));
    });
  }

  /** The producer's stats snapshot (metrics, cache, grants). */
  async stats(timeoutMs?: number): Promise<Record<string, unknown>> {
    return (await this.request("stats", {}, timeoutMs)).stats as Record<string, unknown>;
  }

  /** Asks the producer to encode `mmHash` (`nbytes`); resolves with "ready" | "encoding" | "exists" | "full". */
  async encode(mmHash: string, nbytes: number, timeoutMs?: number): Promise<string> {
    return String((await this.request("encode", { mm_hash: mmHash, nbytes }, timeoutMs)).result);
  }

  /** EC-CONTRACT 10.5: evicts `mmHash`; resolves with "evicted" | "missing" | "pinned". */
  async evict(mmHash: string, timeoutMs?: number): Promise<string> {
    return String((await this.request("evict", { mm_hash: mmHash }, timeoutMs)).result);
  }

  /** Runs the producer cache's `check()`; resolves with `null` when sound, else the problem. */
  async check(timeoutMs?: number): Promise<string | null> {
    const r = await this.request("check", {}, timeoutMs);
    return r.ok === true ? null : String(r.error);
  }

  /** Closes the DEALER; later calls fail. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    for (const w of this.#waiting.splice(0)) {
      clearTimeout(w.timer);
      w.reject(new EcError("EC_CLOSED", "admin client: closed"));
    }
    this.#dealer.close();
  }
}
