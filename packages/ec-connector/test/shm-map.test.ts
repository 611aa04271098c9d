// The data plane's shm files through @tapwire/transport's one copy of the rules (issue 23,
// docs/ec-protocol.md 3.4 "SIGKILL"; docs/transport.md "shm"): the producer's start sweeps files
// of dead pids whichever package made them, and the transport's failures keep this package's
// error codes.
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Registry } from "@tapwire/stats";
import { afterAll, describe, expect, it } from "vitest";
import { ShmMapping } from "../src/data/shm-map.js";
import { EcError, EmbeddingCache, SocketDataTransport } from "../src/index.js";
import { socketPath } from "./helpers/proc.js";

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
function shmDir(): string {
  const d = mkdtempSync("/dev/shm/ec-shm-map-");
  dirs.push(d);
  return d;
}

/**
 * A child that creates a session file in `dir` with @tapwire/transport (as a transport client
 * does) and exits without unlinking it: returns the file's name and the now dead pid.
 */
function transportFileOfDeadProcess(dir: string): { name: string; pid: number } {
  const script =
    'const t = await import("@tapwire/transport"); const libc = t.bindLibc(await import("koffi"));' +
    ` const r = new t.ShmRange(libc, 65536); console.log(t.createSessionFile(libc, ${JSON.stringify(dir)}, r));`;
  const r = spawnSync(process.execPath, ["--input-type=module", "-e", script], {
    cwd: join(import.meta.dirname, ".."),
    encoding: "utf8",
  });
  expect(r.status, r.stderr).toBe(0);
  return { name: r.stdout.trim(), pid: r.pid as number };
}

describe("shm files of the data plane (docs/ec-protocol.md 3.4)", () => {
  it("a producer's start sweeps a dead owner's files (its own naming and transport's), keeps a live one's", async () => {
    const dir = shmDir();
    const dead = transportFileOfDeadProcess(dir);
    expect(dead.name).toMatch(new RegExp(`^tapwire-${dead.pid}-[0-9a-f]{16}$`));
    const ring = `tapwire-${dead.pid}-00112233aabbccdd`; // what a killed producer leaves
    const live = `tapwire-${process.ppid}-8899aabbccddeeff`; // its creator still runs
    const other = "tapwire-not-a-session";
    for (const f of [ring, live, other]) writeFileSync(join(dir, f), "x", { mode: 0o600 });
    expect(readdirSync(dir).sort()).toEqual([dead.name, live, other, ring].sort());
    const cache = new EmbeddingCache({ numBlocks: 4, blockBytes: 65_536 });
    const server = await SocketDataTransport.create({
      name: "p",
      region: cache.region,
      numBlocks: 4,
      blockBytes: 65_536,
      listen: `shm+unix://${socketPath("shmmap")}`,
      shm: { dir },
      registry: new Registry(),
    });
    try {
      expect(existsSync(join(dir, dead.name))).toBe(false);
      expect(readdirSync(dir).sort()).toEqual([live, other].sort());
    } finally {
      await server.close();
    }
  });

  it("a ring created here is the file a reader maps (same bytes), gone from its directory once unlinked", () => {
    const dir = shmDir();
    const w = ShmMapping.create(dir, 65_536);
    try {
      expect(w.name).toMatch(new RegExp(`^tapwire-${process.pid}-[0-9a-f]{16}$`));
      const r = ShmMapping.open(dir, w.name, 65_536);
      try {
        w.bytes[0] = 7;
        w.bytes[65_535] = 9;
        expect([r.bytes[0], r.bytes[65_535], r.bytes.length]).toEqual([7, 9, 65_536]);
      } finally {
        r.close();
      }
      w.unlink();
      expect(readdirSync(dir)).toEqual([]);
    } finally {
      w.close();
    }
  });

  it("both ends of a ring are pre-faulted: a first full pass over it takes almost no page faults", () => {
    // Without MAP_POPULATE the producer's first write pass takes one fault per 4 KiB page (4096
    // here) and the reader's first read pass one per 16 pages (fault-around, 256 here). The
    // counter is the whole process's, so other threads' faults (GC, the test runner) add noise on
    // a loaded machine: the fewest of three fresh rings is what is compared.
    const dir = shmDir();
    const size = 16 * 1024 * 1024;
    const pages = size / 4096;
    const dest = new Uint8Array(size).fill(1); // touched before counting
    const faults = () => process.resourceUsage().minorPageFault;
    let writeFaults = Number.POSITIVE_INFINITY;
    let readFaults = Number.POSITIVE_INFINITY;
    for (let attempt = 0; attempt < 3; attempt++) {
      const w = ShmMapping.create(dir, size);
      try {
        const r = ShmMapping.open(dir, w.name, size);
        w.unlink();
        try {
          const f0 = faults();
          w.bytes.fill(5 + attempt);
          writeFaults = Math.min(writeFaults, faults() - f0);
          const f1 = faults();
          dest.set(r.bytes);
          readFaults = Math.min(readFaults, faults() - f1);
          expect(dest[size - 1]).toBe(5 + attempt);
        } finally {
          r.close();
        }
      } finally {
        w.close();
      }
    }
    expect(writeFaults).toBeLessThan(pages / 16);
    expect(readFaults).toBeLessThan(pages / 64);
  });

  it("the transport's refusals are EcErrors with this package's codes (EC_MALFORMED, EC_SHM_UNAVAILABLE)", () => {
    const dir = shmDir();
    const w = ShmMapping.create(dir, 65_536);
    const cases: [() => unknown, string, RegExp][] = [
      [() => ShmMapping.open(dir, "../etc/passwd", 65_536), "EC_MALFORMED", /bad session name/],
      [() => ShmMapping.open(dir, w.name, 131_072), "EC_MALFORMED", /is 65536 bytes, announced 131072/],
      [() => ShmMapping.open(dir, "tapwire-1-0011223344556677", 65_536), "EC_MALFORMED", /cannot open/],
      [() => ShmMapping.create(join(dir, "missing"), 65_536), "EC_SHM_UNAVAILABLE", /cannot create/],
    ];
    try {
      for (const [f, code, text] of cases) {
        expect(f).toThrow(EcError);
        expect(f).toThrow(expect.objectContaining({ code, message: expect.stringMatching(text) }));
      }
    } finally {
      w.unlink();
      w.close();
    }
  });
});
