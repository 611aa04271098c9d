import type { ConsumerConnector } from "../../src/index.js";
import { syntheticEmbedding } from "../../src/index.js";
import { until } from "./proc.js";

/** Drives a connector's poll() on the event loop and records outcomes. */
export class Driver {
  readonly loaded = new Set<string>();
  readonly failed = new Map<string, string>();
  readonly mismatched: string[] = [];
  #timer: NodeJS.Timeout | null = null;

  constructor(
    readonly conn: ConsumerConnector,
    readonly sizes = new Map<string, number>(),
    readonly verify = true,
  ) {}

  start(everyMs = 1): this {
    const tick = () => {
      this.step();
      this.#timer = setTimeout(tick, everyMs);
    };
    tick();
    return this;
  }

  stop(): void {
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
  }

  step(): void {
    const r = this.conn.poll();
    for (const h of r.loaded) {
      this.loaded.add(h);
      const n = this.sizes.get(h);
      // EC-CONTRACT 8: every promoted embedding is byte-identical to the producer's.
      if (this.verify && n !== undefined) {
        const got = this.conn.cache.view(h);
        if (got.length !== n || !Buffer.from(got).equals(Buffer.from(syntheticEmbedding(h, n))))
          this.mismatched.push(h);
      }
    }
    for (const f of r.failed) this.failed.set(f.mmHash, f.reason);
  }

  /** Requests `h` and waits for its outcome: "loaded" or the failure reason. */
  async fetch(h: string, producer: string, nbytes: number, deadlineMs = 30_000): Promise<string> {
    this.sizes.set(h, nbytes);
    this.loaded.delete(h);
    this.failed.delete(h);
    const st = this.conn.request(h, producer, nbytes, performance.now() + deadlineMs);
    if (st === "ready") return "loaded";
    return until(
      () => (this.loaded.has(h) ? "loaded" : this.failed.get(h)),
      deadlineMs + 30_000,
      `outcome of ${h}`,
    );
  }
}
