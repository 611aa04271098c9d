// The shm data plane's shared region (docs/ec-protocol.md 3.4 "Shared region", issue 23 item 3):
// `tapwire-ec-producer --shm-share-region` keeps its cache region in an unlinked /dev/shm file that
// the consumer maps read-only, so a served READ is copied once, by the reader, CRC fused per chunk.
// Real producer processes, real mappings; a producer written from the tables for hostile offsets.
import { spawn } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import * as net from "node:net";
import { fileURLToPath } from "node:url";
import { Registry } from "@tapwire/stats";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { ShmSharedRegion } from "../src/data/shm-map.js";
import { type SourceRuns, sourceRunsMatch } from "../src/data/source-runs.js";
import {
  ConsumerConnector,
  EcAdminClient,
  EcProducer,
  EmbeddingCache,
  encodeAgentMetadata,
  encodeMemDescriptor,
  SocketDataTransport,
} from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import { type ProducerProc, socketPath, spawnProducer, until } from "./helpers/proc.js";
import { HandConn, handChunk, handOffer } from "./helpers/shm-wire.js";
import { handData } from "./helpers/wire.js";

const BB = 65_536;
const MiB = 1024 * 1024;
const SIZES: [string, number][] = [
  ["r-1k", 1024],
  ["r-64k+1", BB + 1],
  ["r-1m", MiB],
  ["r-16m", 16 * MiB],
];
const te = new TextEncoder();

/** The mappings of `pid` of a deleted /dev/shm file created by `creator`: their permissions. */
function shmMappings(pid: number | "self", creator: number): string[] {
  return readFileSync(`/proc/${pid}/maps`, "utf8")
    .split("\n")
    .filter((l) => l.includes(`/dev/shm/tapwire-${creator}-`))
    .map((l) => l.split(/\s+/)[1] as string);
}

const filesOf = (pid: number) => readdirSync("/dev/shm").filter((n) => n.startsWith(`tapwire-${pid}-`));

/** SHM_ATTACH with flags (body offset 1) from the tables: bit 0 asks for the shared region. */
function handAttachFlags(flags: number): Buffer {
  return Buffer.from([4, 0, 0, 0, 0x07, flags, 1, 0]);
}

async function startProducer(share: boolean, extra: string[] = []): Promise<ProducerProc> {
  return spawnProducer([
    "--data",
    `shm+unix://${socketPath("rgn")}`,
    "--num-blocks",
    "400",
    "--block-bytes",
    String(BB),
    "--prepopulate",
    SIZES.map(([h, n]) => `${h}:${n}`).join(","),
    ...(share ? ["--shm-share-region"] : []),
    ...extra,
    "--log-level",
    "warn",
  ]);
}

async function consumer(compatibility: string, checksumThread: boolean | "always" = false) {
  const registry = new Registry();
  const conn = await ConsumerConnector.create({
    numBlocks: 400,
    blockBytes: BB,
    compatibility,
    registry,
    dataShm: true,
    ...(checksumThread !== false ? { checksumThread } : {}),
  });
  const counter = (n: string) => registry.snapshot().counters[n] ?? 0;
  return { conn, driver: new Driver(conn).start(), counter };
}

describe("tapwire-ec-producer --shm-share-region + ConsumerConnector (docs/ec-protocol.md 3.4 Shared region)", () => {
  let prod: ProducerProc;
  let pid: number;
  let c: Awaited<ReturnType<typeof consumer>>;

  beforeAll(async () => {
    prod = await startProducer(true);
    pid = prod.child.pid as number;
    c = await consumer(prod.compatibilityHash);
  });
  afterAll(async () => {
    c.driver.stop();
    await c.conn.close();
    expect((await prod.kill("SIGTERM")).code).toBe(0);
    expect(filesOf(pid)).toEqual([]);
  });

  it("transfers land byte-identical and CRC-checked, through the region mapped read-only (no ring, nothing in /dev/shm)", async () => {
    // nothing in the directory from the start: the region's file was unlinked at creation
    expect(filesOf(pid)).toEqual([]);
    // the producer keeps it mapped read/write, shared
    expect(shmMappings(pid, pid)).toEqual(["rw-s"]);
    for (const [h, n] of SIZES) {
      expect([h, await c.driver.fetch(h, prod.control, n)]).toEqual([h, "loaded"]);
      expect(c.conn.cache.get(h)!.nbytes).toBe(n);
    }
    expect(c.driver.mismatched).toEqual([]);
    expect(c.counter("consumer_checksum_failures")).toBe(0);
    expect(c.counter("data_shm_chunks")).toBeGreaterThanOrEqual(SIZES.length);
    // EC-CONTRACT 6.3 over what landed: a corrupted landed byte is caught, never promoted
    c.conn.free("r-1m");
    (c.conn.data as SocketDataTransport).injectFault({ kind: "corrupt" });
    expect(await c.driver.fetch("r-1m", prod.control, MiB)).toMatch(/checksum/);
    expect(c.counter("consumer_checksum_failures")).toBe(1);
    expect(await c.driver.fetch("r-1m", prod.control, MiB)).toBe("loaded");
    // the consumer maps the producer's region read-only (PROT_READ, shared): it cannot write it
    const mine = shmMappings("self", pid);
    expect(mine.length).toBeGreaterThan(0);
    for (const perms of mine) expect(perms).toBe("r--s");
    // and no ring was made for it: the only mapping of the producer's files is the region
    expect(shmMappings(pid, pid)).toEqual(["rw-s"]);
    // the pins went once the reader released every chunk (EC-CONTRACT 5.3, 4.4)
    const admin = new EcAdminClient(prod.admin);
    await until(async () => {
      const s = (await admin.stats()) as { cache: { pinnedBlocks: number } };
      return s.cache.pinnedBlocks === 0 ? true : undefined;
    });
    admin.close();
  });

  it("a write through the consumer's mapping is impossible: the writing process faults, the producer's bytes unchanged", async () => {
    const offer = new HandConn(prod.data.slice("unix://".length));
    offer.write(handAttachFlags(1));
    const f = await until(() => offer.of("offer")[0]);
    expect(f.status).toBe(2);
    expect(f.text).toMatch(new RegExp(`^${pid}/[0-9]+$`));
    const [, fd] = f.text.split("/");
    const shmMap = fileURLToPath(new URL("../dist/data/shm-map.js", import.meta.url));
    // a child maps it the consumer's way (ShmPeerRegion: O_RDONLY, PROT_READ), reads, then writes
    const script = `
      const { ShmPeerRegion } = await import(${JSON.stringify(shmMap)});
      const r = ShmPeerRegion.open(${pid}, ${fd});
      process.stdout.write("read " + r.bytes[0] + "\\n");
      r.bytes[0] = r.bytes[0] ^ 0xff;
      process.stdout.write("wrote\\n");
    `;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: "pipe" });
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
    });
    const exit = await new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
      child.on("exit", (code, signal) => r({ code, signal })),
    );
    expect(out).toMatch(/^read \d+\n$/);
    expect(out).not.toMatch(/wrote/);
    expect(["SIGSEGV", "SIGBUS"]).toContain(exit.signal);
    offer.destroy();
    // the producer still serves the same bytes
    expect(await c.driver.fetch("r-64k+1", prod.control, BB + 1)).toBe("loaded");
    expect(c.driver.mismatched).toEqual([]);
  });

  it("a reader that does not ask for the region (flag 0) gets an ordinary ring offer", async () => {
    const hc = new HandConn(prod.data.slice("unix://".length));
    hc.write(handAttachFlags(0));
    const f = await until(() => hc.of("offer")[0]);
    expect(f.status).toBe(0);
    expect(f.text).toMatch(new RegExp(`^tapwire-${pid}-[0-9a-f]{16}$`));
    hc.destroy();
    await until(() => (filesOf(pid).length === 0 ? true : undefined));
  });
});

describe("without --shm-share-region", () => {
  it("the producer offers rings, even to a reader asking for the region; transfers go through them", async () => {
    const prod = await startProducer(false);
    const pid = prod.child.pid as number;
    const c = await consumer(prod.compatibilityHash);
    try {
      const hc = new HandConn(prod.data.slice("unix://".length));
      hc.write(handAttachFlags(1));
      const f = await until(() => hc.of("offer")[0]);
      expect(f.status).toBe(0);
      expect(f.text).toMatch(/^tapwire-/);
      hc.destroy();
      expect(await c.driver.fetch("r-1m", prod.control, MiB)).toBe("loaded");
      expect(c.driver.mismatched).toEqual([]);
      expect(c.counter("data_shm_chunks")).toBeGreaterThan(0);
      // no region: the producer's only shm mappings are rings, mapped by the consumer read-only
      for (const perms of shmMappings("self", pid)) expect(perms).toBe("r--s");
    } finally {
      c.driver.stop();
      await c.conn.close();
      await prod.kill("SIGTERM");
    }
    expect(filesOf(pid)).toEqual([]);
  });
});

describe("kill -9 of a --shm-share-region producer mid-read", () => {
  it("the consumer fails the read cleanly (not promoted) and reads again from a new producer; nothing left in /dev/shm", async () => {
    const prod = await startProducer(true, ["--throttle-bps", String(2 * MiB)]);
    const pid = prod.child.pid as number;
    const c = await consumer(prod.compatibilityHash);
    try {
      const outcome = c.driver.fetch("r-16m", prod.control, 16 * MiB);
      // a chunk of the region was consumed: the read is in its body
      await until(() => (c.counter("data_shm_chunks") > 0 ? true : undefined));
      expect((await prod.kill("SIGKILL")).signal).toBe("SIGKILL");
      expect(await outcome).not.toBe("loaded");
      expect(c.conn.cache.get("r-16m")).toBeUndefined();
      expect(filesOf(pid)).toEqual([]);
      const next = await startProducer(true);
      try {
        expect(await c.driver.fetch("r-16m", next.control, 16 * MiB)).toBe("loaded");
        expect(c.driver.mismatched).toEqual([]);
      } finally {
        await next.kill("SIGTERM");
      }
    } finally {
      c.driver.stop();
      await c.conn.close();
    }
  });
});

describe("shared region, reader side against a producer written from the tables", () => {
  const SLOT = 64 * 1024;
  const N = SLOT + 100;
  const open: { close(): unknown }[] = [];
  afterEach(async () => {
    for (const t of open.splice(0).reverse()) await t.close();
  });

  async function fake(script: (s: net.Socket, text: string, size: number) => void) {
    const region = ShmSharedRegion.create("/dev/shm", 4 * SLOT);
    open.push(region);
    const path = socketPath("rfake");
    const srv = net.createServer((s) => {
      s.on("error", () => undefined);
      let seen = false;
      s.on("data", (d: Buffer) => {
        if (!seen && d[4] === 0x07) {
          seen = true;
          expect(d[5]).toBe(1); // the reader asks for the region
          script(s, `${region.pid}/${region.fd}`, region.size);
        }
      });
    });
    await new Promise<void>((r) => srv.listen(path, r));
    open.push({ close: () => new Promise<void>((r) => srv.close(() => r())) });
    const cache = new EmbeddingCache({ numBlocks: 8, blockBytes: SLOT });
    const reader = await SocketDataTransport.create({
      name: "consumer",
      region: cache.region,
      numBlocks: 8,
      blockBytes: SLOT,
      shm: true,
    });
    open.push(reader);
    const meta = encodeAgentMetadata({
      name: "f",
      instance: "00112233445566aa",
      endpoint: `unix://${path}`,
      shm: true,
    });
    const agent = reader.addRemotePeer(meta, encodeMemDescriptor({ numBlocks: 8, blockBytes: SLOT }));
    const h = reader.postRead(cache.allocate("x", N), agent, [0, 1], te.encode("s:x"), {
      nbytes: N,
      checksum: true,
    });
    const out = await until(() =>
      reader.checkXferState(h) === "PROC" ? undefined : (reader.getXferError(h) ?? "DONE"),
    );
    const src = reader.getXferSourceRuns(h);
    lastRuns = src === null ? null : { runs: [...src.runs], overflow: src.overflow };
    return out;
  }
  let lastRuns: SourceRuns | null = null;

  it("an offset outside the mapping is rejected (EC_MALFORMED: the read is ERR)", async () => {
    const err = await fake((s, text, size) => {
      s.write(handOffer(2, 2, 4 * SLOT, text));
      s.write(Buffer.concat([handData(N), handChunk(0, 1, size - 100, 200)]));
    });
    expect(err).toMatch(/shm data frame: SHM_CHUNK .* outside the \d+-byte region/);
  });

  it("a chunk past the ack's nbytes is rejected (EC_MALFORMED: the read is ERR)", async () => {
    const err = await fake((s, text) => {
      s.write(handOffer(2, 2, 4 * SLOT, text));
      s.write(Buffer.concat([handData(N), handChunk(0, 1, 0, N + 1)]));
    });
    expect(err).toMatch(/shm data frame: SHM_CHUNK of \d+ bytes .*left/);
  });

  it("in-window chunks land and CRC-check (the happy path of the same fake); their source is the READ's blocks", async () => {
    const err = await fake((s, text) => {
      s.write(handOffer(2, 2, 4 * SLOT, text));
      s.write(Buffer.concat([handData(N), handChunk(0, 1, 0, N)]));
    });
    expect(err).toBe("DONE");
    expect(lastRuns).toEqual({ runs: [0, N], overflow: false });
    expect(sourceRunsMatch(lastRuns!, [0, 1], SLOT, N)).toBe(true);
  });

  it("a chunk naming other blocks of the region is recorded where it came from: it does not match the READ's (never promoted)", async () => {
    const err = await fake((s, text) => {
      s.write(handOffer(2, 2, 4 * SLOT, text));
      // the bytes of blocks 1 and 2, not the granted 0 and 1
      s.write(Buffer.concat([handData(N), handChunk(0, 1, SLOT, N)]));
    });
    expect(err).toBe("DONE"); // the reader cannot know the blocks of every read: the consumer checks
    expect(lastRuns).toEqual({ runs: [SLOT, N], overflow: false });
    expect(sourceRunsMatch(lastRuns!, [0, 1], SLOT, N)).toBe(false);
  });
});

describe("--shm-share-region with a /dev/shm too small for the region (16 MiB tmpfs, unshare -m)", () => {
  it("logs an error naming the size and serves with the ordinary region and rings", async () => {
    const sock = socketPath("rsmall");
    const bin = fileURLToPath(new URL("../dist/bin/producer.js", import.meta.url));
    const args = [
      "--data",
      `shm+unix://${sock}`,
      "--num-blocks",
      "400",
      "--block-bytes",
      String(BB),
      "--prepopulate",
      `r-1m:${MiB}`,
      "--shm-share-region",
      "--log-level",
      "warn",
    ];
    const script = `mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "${process.execPath}" "${bin}" ${args.join(" ")}`;
    const child = spawn("unshare", ["-m", "--propagation", "private", "sh", "-c", script], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    const lines: Record<string, unknown>[] = [];
    let err = "";
    child.stderr.on("data", (d: Buffer) => {
      err += d.toString();
    });
    child.stdout.on("data", (d: Buffer) => {
      for (const l of d.toString().split("\n")) if (l.startsWith("{")) lines.push(JSON.parse(l));
    });
    try {
      const ready = await until(
        () => lines.find((j) => j["msg"] === "listening") ?? (child.exitCode !== null ? {} : undefined),
        60_000,
      );
      expect(ready["data"], err).toBe(`unix://${sock}`);
      const logged = lines.find((j) => String(j["msg"]).startsWith("shm: cannot share the cache region"));
      expect(logged, err).toBeDefined();
      expect(logged?.["level"]).toBe(50); // pino "error"
      expect(String(logged?.["msg"])).toContain(`${400 * BB} bytes`);
      expect(String(logged?.["why"])).toMatch(
        new RegExp(`/dev/shm has \\d+ bytes free, .* needs ${400 * BB}`),
      );
      // no region: a reader asking for it is offered a ring (status 0), as without the flag
      const hc = new HandConn(sock);
      hc.write(handAttachFlags(1));
      const f = await until(() => hc.of("offer")[0]);
      expect(f.status).toBe(0);
      hc.destroy();
      // and a consumer's read lands (the ring's file is in the producer's mount namespace, so this
      // consumer declines it and the socket carries the bytes)
      const c = await consumer(String(ready["compatibilityHash"]));
      try {
        expect(await c.driver.fetch("r-1m", String(ready["control"]), MiB)).toBe("loaded");
        expect(c.driver.mismatched).toEqual([]);
      } finally {
        c.driver.stop();
        await c.conn.close();
      }
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
  });
});

describe("shareRegion option", () => {
  it("needs an shm+unix:// data endpoint (EC_BAD_OPTION naming it)", async () => {
    await expect(
      EcProducer.start({ numBlocks: 4, blockBytes: BB, data: "tcp://127.0.0.1:0", shareRegion: true }),
    ).rejects.toMatchObject({
      code: "EC_BAD_OPTION",
      message: expect.stringMatching(/shareRegion.*shm\+unix/),
    });
  });

  it("in process: the producer's cache region is the shared mapping, closed with the producer", async () => {
    const p = await EcProducer.start({
      numBlocks: 16,
      blockBytes: BB,
      data: `shm+unix://${socketPath("rin")}`,
      shareRegion: true,
      prepopulate: [["a", BB]],
    });
    try {
      // the region's mapping is shared and the only one of this process's own files
      expect(shmMappings("self", process.pid)).toEqual(["rw-s"]);
      expect(filesOf(process.pid)).toEqual([]);
    } finally {
      await p.close();
    }
    // closed: the file's pages are dropped from this process (the range reads zeros)
    expect(shmMappings("self", process.pid)).toEqual([]);
  });
});

describe("shm reads with checksumThread (docs/ec-connector.md: the CRC on the checksum thread)", () => {
  for (const share of [true, false]) {
    it(`${share ? "shared region" : "ring"}: a read of 8 MiB or more has each landed piece CRC'd on the thread (the copy of the next overlaps it), smaller ones inline; the same CRC, corruption caught`, async () => {
      const prod = await startProducer(share);
      const pid = prod.child.pid as number;
      const c = await consumer(prod.compatibilityHash, "always");
      const data = c.conn.data as SocketDataTransport;
      try {
        // the thread starts with the first range handed to it; reads below 8 MiB are CRC'd inline
        for (const [h, n] of SIZES.filter(([, n]) => n < 8 * MiB))
          expect([h, await c.driver.fetch(h, prod.control, n)]).toEqual([h, "loaded"]);
        await new Promise((r) => setTimeout(r, 50));
        expect(data.checksumThreadCrcImpl).toBeNull();
        expect(await c.driver.fetch("r-16m", prod.control, 16 * MiB)).toBe("loaded");
        expect(c.driver.mismatched).toEqual([]);
        expect(c.counter("data_shm_chunks")).toBeGreaterThanOrEqual(SIZES.length);
        expect(c.counter("consumer_checksum_failures")).toBe(0);
        // the 16 MiB read handed its landed bytes to the thread (its CRC decided the promotion)
        await until(() => data.checksumThreadCrcImpl ?? undefined);
        // EC-CONTRACT 6.3 over what landed, on the thread too
        c.conn.free("r-16m");
        data.injectFault({ kind: "corrupt" });
        expect(await c.driver.fetch("r-16m", prod.control, 16 * MiB)).toMatch(/checksum/);
        expect(c.counter("consumer_checksum_failures")).toBe(1);
        expect(await c.driver.fetch("r-16m", prod.control, 16 * MiB)).toBe("loaded");
      } finally {
        c.driver.stop();
        await c.conn.close();
        await prod.kill("SIGTERM");
      }
      expect(filesOf(pid)).toEqual([]);
    });
  }
});
