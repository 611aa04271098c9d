import { Registry } from "@tapwire/stats";
import { FakeClock } from "@tapwire/testing";
import type {
  ConsumerSessionOptions,
  ControlMessage,
  ControlServer,
  ProducerSessionOptions,
} from "../../src/index.js";
import {
  ConsumerSession,
  compatibilityHash,
  EmbeddingCache,
  LoopbackDataTransport,
  type LoopbackFabric,
  ProducerSession,
  syntheticEmbedding,
} from "../../src/index.js";

export const BLOCK = 64;
export const COMPAT = compatibilityHash({ modelId: "m", dtype: "bf16", hiddenSize: 16, blockBytes: BLOCK });

/** The fake clock (ms) of @tapwire/testing, starting at 1000. */
export class Clock extends FakeClock {
  constructor() {
    super(1000);
  }
}

/** In-memory ROUTER: consumers push requests, the session's replies go to per-identity inboxes. */
export class FakeRouter implements ControlServer {
  readonly endpoint = "fake://router";
  inbox: ControlMessage[] = [];
  readonly outbox = new Map<string, Uint8Array[]>();
  closed = false;
  poll(): ControlMessage[] {
    return this.inbox.splice(0);
  }
  send(identity: Uint8Array, payload: Uint8Array): void {
    const k = Buffer.from(identity).toString();
    const l = this.outbox.get(k) ?? [];
    l.push(payload);
    this.outbox.set(k, l);
  }
  take(identity: string): Uint8Array[] {
    const l = this.outbox.get(identity) ?? [];
    this.outbox.set(identity, []);
    return l;
  }
  async close(): Promise<void> {
    this.closed = true;
  }
}

export interface Producer {
  cache: EmbeddingCache;
  data: LoopbackDataTransport;
  router: FakeRouter;
  session: ProducerSession;
  registry: Registry;
  initialFree: number;
}

export function makeProducer(
  fabric: LoopbackFabric,
  clock: Clock,
  entries: [string, number][],
  extra: Partial<ProducerSessionOptions> = {},
  name = "encoder",
): Producer {
  const cache = new EmbeddingCache({ numBlocks: 64, blockBytes: BLOCK });
  for (const [h, n] of entries) {
    cache.allocate(h, n);
    cache.write(h, 0, syntheticEmbedding(h, n));
    cache.markReady(h);
  }
  const data = new LoopbackDataTransport({
    fabric,
    name,
    region: cache.region,
    numBlocks: 64,
    blockBytes: BLOCK,
  });
  const router = new FakeRouter();
  const registry = new Registry();
  const session = new ProducerSession({
    control: router,
    data,
    cache,
    compatibilityHash: COMPAT,
    pinLeaseMs: 5_000,
    now: clock.now,
    registry,
    ...extra,
  });
  return { cache, data, router, session, registry, initialFree: cache.freeBlocks };
}

export interface Consumer {
  cache: EmbeddingCache;
  data: LoopbackDataTransport;
  session: ConsumerSession;
  registry: Registry;
  identity: string;
  /** Messages dropped on the way to the producer when set. */
  dropRequests: boolean;
}

let ids = 0;
export function makeConsumer(
  fabric: LoopbackFabric,
  producer: { router: FakeRouter },
  extra: Partial<ConsumerSessionOptions> = {},
): Consumer {
  const cache = new EmbeddingCache({ numBlocks: 64, blockBytes: BLOCK });
  const identity = `consumer-${++ids}`;
  const data = new LoopbackDataTransport({
    fabric,
    name: identity,
    region: cache.region,
    numBlocks: 64,
    blockBytes: BLOCK,
  });
  const registry = new Registry();
  const c: Consumer = { cache, data, registry, identity, dropRequests: false } as Consumer;
  c.session = new ConsumerSession({
    addr: "fake://router",
    send: (payload) => {
      if (!c.dropRequests) producer.router.inbox.push({ identity: Buffer.from(identity), frames: [payload] });
    },
    data,
    compatibilityHash: COMPAT,
    numBlocks: 64,
    blockBytes: BLOCK,
    readTimeoutMs: 1_000,
    quarantineTimeoutMs: 3_000,
    registry,
    ...extra,
  });
  return c;
}

/** One engine step on both sides: producer polls, consumer polls its inbox. */
export function step(p: Producer, c: Consumer, clock: Clock, extraAcks: Uint8Array[] = []): void {
  p.session.pollStep();
  c.session.poll([...p.router.take(c.identity), ...extraAcks], clock.now());
}

/** Starts an xfer for mmHash with freshly allocated consumer blocks. */
export function start(
  c: Consumer,
  clock: Clock,
  mmHash: string,
  nbytes: number,
  ackTimeout = 2_000,
): readonly number[] {
  const blocks = c.cache.allocate(mmHash, nbytes);
  c.session.startXfer(mmHash, blocks, clock.now() + ackTimeout, nbytes);
  return blocks;
}
