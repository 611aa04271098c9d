/** The ec-consumer mode against tapwire's ConsumerConnector (a poll loop asking for fresh embeddings). */
import { ConsumerConnector } from "@tapwire/ec-connector";
import { describe, expect, it } from "vitest";
import { ecCompatibilityHash, runEcConsumerSuite } from "../src/index.js";

const HASH = ecCompatibilityHash("synthetic-encoder", "bfloat16", 4096, 4096);

async function withConsumer<T>(
  ackTimeoutMs: number,
  f: (onListening: (control: string) => void) => Promise<T>,
): Promise<T> {
  let stop = false;
  let loop: Promise<void> = Promise.resolve();
  try {
    return await f((control) => {
      loop = (async () => {
        const c = await ConsumerConnector.create({
          numBlocks: 64,
          blockBytes: 4096,
          compatibility: HASH,
          ackTimeoutMs,
        });
        let n = 0;
        while (!stop) {
          const now = performance.now();
          if (c.pendingCount < 1) c.request(`m${n++}`, control, 10_000, now + 2500, now);
          const res = c.poll(now);
          for (const h of res.loaded) c.free(h);
          await new Promise((r) => setTimeout(r, 5));
        }
        await c.close();
      })();
    });
  } finally {
    stop = true;
    await loop;
  }
}

describe("tapwire-conformance ec-consumer against ConsumerConnector", () => {
  it("a consumer re-requesting sooner than the ack timeout it was said to have FAILS 6.3.1", async () => {
    const rep = await withConsumer(300, (onListening) =>
      runEcConsumerSuite(
        {
          listen: "tcp://127.0.0.1:*",
          compatibilityHash: HASH,
          ackTimeoutMs: 2000,
          timeoutMs: 3000,
          onListening,
        },
        { cases: "6.3.1" },
      ),
    );
    expect(rep.results.map((r) => [r.id, r.verdict])).toEqual([["6.3.1", "FAILED"]]);
    expect(rep.results[0]!.expected).toMatch(/after ack_timeout/);
  });
  it("no case FAILED: stray, foreign-session, duplicate, wrong-size and malformed acks read nothing", async () => {
    let stop = false;
    let loop: Promise<void> = Promise.resolve();
    const rep = await runEcConsumerSuite({
      listen: "tcp://127.0.0.1:*",
      compatibilityHash: HASH,
      blocks: 64,
      blockBytes: 4096,
      ackTimeoutMs: 300,
      timeoutMs: 3000,
      onListening: (control) => {
        loop = (async () => {
          const c = await ConsumerConnector.create({
            numBlocks: 64,
            blockBytes: 4096,
            compatibility: HASH,
            ackTimeoutMs: 300,
          });
          let n = 0;
          while (!stop) {
            const now = performance.now();
            if (c.pendingCount < 1) c.request(`m${n++}`, control, 10_000, now + 2500, now);
            const res = c.poll(now);
            for (const h of res.loaded) c.free(h);
            await new Promise((r) => setTimeout(r, 5));
          }
          await c.close();
        })();
      },
    });
    stop = true;
    await loop;
    expect(
      rep.results.filter((r) => r.verdict === "FAILED").map((r) => `${r.id}: ${r.expected}; got ${r.got}`),
    ).toEqual([]);
    expect(rep.results.length).toBeGreaterThanOrEqual(18);
  });
});
