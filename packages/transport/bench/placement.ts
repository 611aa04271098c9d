/**
 * Receive placement benchmark (`tsx bench/placement.ts`, JSON on stdout): p50 round trip of a
 * 1.5 MiB request (a 2112-byte head then 64 x 24 576 bytes, the drafter link's 64-slot STEP)
 * answered with 8 bytes, by receive path, the four servers interleaved request by request:
 * reassembly only; reassembly plus the handler copying the 64 parts into 64 buffers (what the
 * worker did before placement); receiveInto placing the rest into one segment; into 64 segments
 * of 64 different buffers (what the worker does now). Run it under the repo's bench lock.
 */
import { tmpdir } from "node:os";
import { join } from "node:path";
import { listen, makeClient, type ReceiveInto } from "../src/index.js";

const SEG = 24_576;
const NSEG = 64;
const HEAD = 2_112;
const LEN = HEAD + SEG * NSEG;
const ITERS = Number(process.env.ITERS ?? 1500);

async function run(ep: string) {
  const dests = Array.from({ length: NSEG }, () => new Uint8Array(SEG * 4));
  const big = new Uint8Array(SEG * NSEG * 2);
  let turn = 0;
  const hooks: Record<string, ReceiveInto | undefined> = {
    none: undefined,
    "placed 1 segment": (h, len) =>
      h.length < HEAD ? HEAD : { headBytes: HEAD, segments: [big.subarray(0, len - HEAD)] },
    "placed 64 segments": (h) => {
      if (h.length < HEAD) return HEAD;
      turn = (turn + 1) % 3;
      return { headBytes: HEAD, segments: dests.map((d) => d.subarray(turn * SEG, (turn + 1) * SEG)) };
    },
  };
  const reply = new Uint8Array(8);
  const cfgs: { name: string; hook: ReceiveInto | undefined; copy: boolean }[] = [
    { name: "none", hook: undefined, copy: false },
    { name: "none + handler copies into 64 buffers", hook: undefined, copy: true },
    { name: "placed 1 segment", hook: hooks["placed 1 segment"], copy: false },
    { name: "placed 64 segments", hook: hooks["placed 64 segments"], copy: false },
  ];
  const live = [];
  for (const cfg of cfgs) {
    const srv = await listen(
      ep.includes("unix") ? ep.replace(".sock", `-${live.length}.sock`) : ep,
      (req) => {
        if (cfg.copy) {
          let o = HEAD;
          for (const d of dests) {
            d.set(req.subarray(o, o + SEG), 0);
            o += SEG;
          }
        }
        return reply;
      },
      cfg.hook === undefined ? {} : { receiveInto: cfg.hook },
    );
    const c = makeClient(srv.endpoint);
    await c.connect(5000);
    live.push({ cfg, srv, c, t: [] as number[] });
  }
  const msg = new Uint8Array(LEN);
  const rb = new Uint8Array(64);
  for (let i = 0; i < ITERS + 100; i++) {
    for (const l of live) {
      const t0 = performance.now();
      await l.c.request(msg, rb, 5000);
      if (i >= 100) l.t.push(performance.now() - t0);
    }
  }
  const out: Record<string, number> = {};
  for (const l of live) {
    l.t.sort((a, b) => a - b);
    out[l.cfg.name] = Math.round(l.t[l.t.length >> 1]! * 1000);
    l.c.close();
    await l.srv.close();
  }
  return out;
}

const res: Record<string, unknown> = {};
res.tcp = await run("tcp://127.0.0.1:0");
res.unix = await run(`unix://${join(tmpdir(), `tw-placement-${process.pid}.sock`)}`);
process.stdout.write(
  `${JSON.stringify({ package: "@tapwire/transport", bench: "placement", node: process.version, iterations: ITERS, p50_us: res }, null, 2)}\n`,
);
