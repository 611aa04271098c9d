/**
 * Profile of one 16 MiB transfer's memory work on the shm data plane (issue 23 item 3,
 * docs/benchmarks/ec-connector.md "shm: where the time goes"). Prints one JSON document.
 *
 * 1. `components`: the passes over the bytes, each alone in this process, ms per 16 MiB: the
 *    producer's copy region → ring slot (4 MiB slots), the consumer's copy ring → destination,
 *    the CRC-32 of the landed bytes, the consumer's copy-then-CRC per piece (what shm-reader.ts
 *    does), and the page faults of a warm pass and of a fresh ring.
 * 2. `contention`: the consumer's copy-then-CRC again while a second process copies 16 MiB
 *    buffers in a loop (the producer filling the next slot meanwhile): how much the two copies of
 *    the pipelined ring slow each other on this machine.
 * 3. `one_copy_vs_two`: the same consumer (a blocking `read(2)` of a FIFO into its destination,
 *    CRC per 1 MiB read) against a producer child that either `write(2)`s its region into the FIFO
 *    (two copies, like the unix socket and like the ring) or `vmsplice(2)`s it (the pipe holds
 *    references to the producer's pages: the consumer's read is the only copy). Interleaved pairs.
 *    A measurement of what one copy instead of two buys here, not a data plane.
 *
 * 4. `splice_vs_write_unix_socket`: the same on a unix socket (vmsplice + splice(2) into it).
 * 5. `shared_region_vs_unix_socket`: a producer child whose 16 MiB region is itself a shm file the
 *    consumer maps read-only (what a one-copy design would share; today's ring never does), on a
 *    1-byte request over a unix socket either streams the region on it (Node's socket write, the
 *    data server's 512 KiB send buffer: two copies, like the unix data plane) or answers a 1-byte
 *    doorbell, after which the consumer copies + CRCs from the mapping in 1 MiB pieces (one copy).
 *    The consumer's CRC is on in both. An upper bound for a one-copy data plane, not one.
 *
 * `pnpm --filter @tapwire/ec-connector exec tsx bench/shm-profile.ts`
 */
import { spawn } from "node:child_process";
import * as fs from "node:fs";
import { createRequire } from "node:module";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { crc32 } from "../src/crc.js";
import { ShmMapping } from "../src/data/shm-map.js";

const MiB = 1024 * 1024;
const N = 16 * MiB;
const SLOT = 4 * MiB;
const SELF = fileURLToPath(import.meta.url);

function round(x: number, d = 3): number {
  return Number(x.toFixed(d));
}
function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}
function faults(): number {
  return process.resourceUsage().minorPageFault;
}
/** Median ms of `f` over `reps` runs after one warm-up. */
function time(f: () => void, reps = 15): number {
  f();
  const xs: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now();
    f();
    xs.push(performance.now() - t0);
  }
  return round(median(xs));
}

interface Libc {
  vmsplice(fd: number, iov: Uint32Array, nr: number, flags: number): number;
  splice(fdIn: number, offIn: null, fdOut: number, offOut: null, n: number, flags: number): number;
  pipe(fds: Int32Array): number;
  write(fd: number, buf: Uint8Array, n: number): number;
  fcntl(fd: number, cmd: number, arg: number): number;
  memmove(dst: ArrayBuffer, src: ArrayBuffer, n: number): number;
}
function libc(): Libc {
  const k = createRequire(import.meta.url)("koffi") as {
    load(p: string): { func(d: string): (...a: unknown[]) => unknown };
  };
  const c = k.load("libc.so.6");
  return {
    vmsplice: c.func(
      "intptr_t vmsplice(int fd, const void *iov, size_t nr, unsigned int flags)",
    ) as Libc["vmsplice"],
    splice: c.func(
      "intptr_t splice(int fd_in, void *off_in, int fd_out, void *off_out, size_t len, unsigned int flags)",
    ) as Libc["splice"],
    pipe: c.func("int pipe(int *fds)") as Libc["pipe"],
    write: c.func("intptr_t write(int fd, const void *buf, size_t n)") as Libc["write"],
    fcntl: c.func("int fcntl(int fd, int cmd, int arg)") as Libc["fcntl"],
    memmove: c.func("uintptr_t memmove(void *dst, const void *src, size_t n)") as Libc["memmove"],
  };
}
const F_SETPIPE_SZ = 1031;

// ---- children ----

if (process.argv[2] === "copier") {
  // contention: copy 16 MiB buffers until killed
  const a = new Uint8Array(N).fill(3);
  const b = new Uint8Array(N).fill(4);
  process.stdout.write("ready\n");
  for (;;) b.set(a);
}

if (process.argv[2] === "fifo") {
  // one_copy_vs_two: per stdin line `write` or `vmsplice`, 16 MiB of a warm region into the FIFO
  const c = libc();
  const region = new Uint8Array(N);
  for (let i = 0; i < N; i += 4096) region[i] = i & 0xff;
  const fd = fs.openSync(process.argv[3]!, "w");
  c.fcntl(fd, F_SETPIPE_SZ, MiB);
  const base = c.memmove(region.buffer as ArrayBuffer, region.buffer as ArrayBuffer, 0);
  const iov = new Uint32Array(4);
  createInterface({ input: process.stdin }).on("line", (mode) => {
    for (let off = 0; off < N; ) {
      let n: number;
      if (mode === "vmsplice") {
        const p = base + off;
        iov[0] = p % 2 ** 32;
        iov[1] = Math.floor(p / 2 ** 32);
        iov[2] = N - off;
        iov[3] = 0;
        n = c.vmsplice(fd, iov, 1, 0);
      } else {
        n = c.write(fd, region.subarray(off), N - off);
      }
      if (n <= 0) throw new Error(`${mode} returned ${n}`);
      off += n;
    }
  });
  process.stdout.write("ready\n");
}

if (process.argv[2] === "sock") {
  // splice_vs_write: a unix socket server; per line `write` or `splice`, 16 MiB of a warm region
  // into the (blocking) connection: write(2) copies into the socket; vmsplice(2) + splice(2) hand
  // the region's pages to the socket by reference (AF_UNIX MSG_SPLICE_PAGES, Linux >= 6.5).
  const net = await import("node:net");
  const c = libc();
  const region = new Uint8Array(N);
  for (let i = 0; i < N; i += 4096) region[i] = i & 0xff;
  const base = c.memmove(region.buffer as ArrayBuffer, region.buffer as ArrayBuffer, 0);
  const iov = new Uint32Array(4);
  const pfd = new Int32Array(2);
  if (c.pipe(pfd) !== 0) throw new Error("pipe");
  c.fcntl(pfd[1]!, F_SETPIPE_SZ, MiB);
  const path = process.argv[3]!;
  net
    .createServer((sock) => {
      const fd = (sock as unknown as { _handle: { fd: number } })._handle.fd;
      sock.pause();
      c.fcntl(fd, 4 /* F_SETFL */, c.fcntl(fd, 3 /* F_GETFL */, 0) & ~0o4000);
      c.fcntl(fd, 4, 0);
      createInterface({ input: process.stdin }).on("line", (mode) => {
        for (let off = 0; off < N; ) {
          let n: number;
          if (mode === "splice") {
            const p = base + off;
            iov[0] = p % 2 ** 32;
            iov[1] = Math.floor(p / 2 ** 32);
            iov[2] = Math.min(MiB, N - off);
            iov[3] = 0;
            n = c.vmsplice(pfd[1]!, iov, 1, 0);
            for (let left = n; left > 0; ) {
              const m = c.splice(pfd[0]!, null, fd, null, left, 1 /* SPLICE_F_MOVE */);
              if (m <= 0) throw new Error(`splice returned ${m}`);
              left -= m;
            }
          } else {
            n = c.write(fd, region.subarray(off), N - off);
          }
          if (n <= 0) throw new Error(`${mode} returned ${n}`);
          off += n;
        }
      });
    })
    .listen(path, () => process.stdout.write("ready\n"));
}

if (process.argv[2] === "region") {
  // shared_region_vs_unix_socket: the region is a shm file; `u` streams it, `s` rings a doorbell
  const net = await import("node:net");
  const { setSendBuffer, DEFAULT_SEND_BUFFER_BYTES } = await import("../src/data/sockbuf.js");
  const m = ShmMapping.create("/dev/shm", N);
  for (let i = 0; i < N; i += 4096) m.bytes[i] = i & 0xff;
  const path = process.argv[3]!;
  net
    .createServer({ noDelay: true }, (sock) => {
      setSendBuffer(sock, DEFAULT_SEND_BUFFER_BYTES);
      sock.on("data", async (d: Buffer) => {
        for (const op of d) {
          if (op === 0x73) {
            sock.write(Buffer.of(1));
            continue;
          }
          for (let off = 0; off < N; off += MiB) {
            const ok = sock.write(m.bytes.subarray(off, off + MiB));
            if (!ok && off + MiB < N) await new Promise((r) => sock.once("drain", r));
          }
        }
      });
    })
    .listen(path, () => process.stdout.write(`${m.name}\n`));
  process.on("SIGTERM", () => {
    m.unlink();
    process.exit(0);
  });
}

// ---- the profile ----

async function ready(p: ReturnType<typeof spawn>): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    p.once("exit", (code) => reject(new Error(`child exited ${code}`)));
    createInterface({ input: p.stdout! }).once("line", () => resolve());
  });
}

function consumerPass(ring: Uint8Array, dest: Uint8Array, piece: number): void {
  let crc = 0;
  for (let s = 0; s < N; s += SLOT) {
    const src = s % (2 * SLOT);
    for (let o = 0; o < SLOT; o += piece) {
      dest.set(ring.subarray(src + o, src + o + piece), s + o);
      crc = crc32(dest.subarray(s + o, s + o + piece), crc);
    }
  }
}

async function spliceVsWrite(dest: Uint8Array): Promise<Record<string, unknown>> {
  const net = await import("node:net");
  const path = join(tmpdir(), `ec-shm-profile-${process.pid}.sock`);
  const srv = spawn(process.execPath, ["--import", "tsx", SELF, "sock", path], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  await ready(srv);
  let got = 0;
  let crc = 0;
  let done: (() => void) | null = null;
  const sock = net.connect({
    path,
    onread: {
      buffer: () => dest.subarray(got, got < N ? N : N + 65_536),
      callback: (n: number) => {
        crc = crc32(dest.subarray(got, got + n), crc);
        got += n;
        if (got >= N) done?.();
        return true;
      },
    },
  } as import("node:net").NetConnectOpts);
  await new Promise<void>((r) => sock.once("connect", () => r()));
  const one = async (mode: string): Promise<number> => {
    got = 0;
    const t = performance.now();
    const p = new Promise<void>((r) => {
      done = r;
    });
    srv.stdin!.write(`${mode}\n`);
    await p;
    return performance.now() - t;
  };
  const w: number[] = [];
  const sp: number[] = [];
  for (let i = 0; i < 5; i++) {
    await one("write");
    await one("splice");
  }
  for (let i = 0; i < 40; i++) {
    if (i % 2 === 0) {
      w.push(await one("write"));
      sp.push(await one("splice"));
    } else {
      sp.push(await one("splice"));
      w.push(await one("write"));
    }
  }
  sock.destroy();
  srv.kill("SIGTERM");
  fs.rmSync(path, { force: true });
  return {
    iterations: 40,
    write_two_copies_median_ms: round(median(w)),
    vmsplice_splice_one_copy_median_ms: round(median(sp)),
    ratio_write_vs_splice: round(median(w) / median(sp)),
    note: "unix socket, consumer reads into its destination through onread, CRC per read; producer write(2) vs vmsplice(2)+splice(2) of the same region, blocking fd",
  };
}

async function sharedRegionVsUnix(dest: Uint8Array): Promise<Record<string, unknown>> {
  const net = await import("node:net");
  const path = join(tmpdir(), `ec-shm-profile-${process.pid}-r.sock`);
  const srv = spawn(process.execPath, ["--import", "tsx", SELF, "region", path], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const name = await new Promise<string>((resolve, reject) => {
    srv.once("exit", (code) => reject(new Error(`child exited ${code}`)));
    createInterface({ input: srv.stdout! }).once("line", (l) => resolve(l.trim()));
  });
  const map = ShmMapping.open("/dev/shm", name, N);
  let want = 0;
  let got = 0;
  let crc = 0;
  let done: (() => void) | null = null;
  const sock = net.connect({
    path,
    onread: {
      buffer: () => dest.subarray(got, got < want ? want : want + 65_536),
      callback: (n: number) => {
        if (want === 1) {
          // the doorbell: one copy out of the producer's mapping, CRC per piece as it landed
          for (let o = 0; o < N; o += MiB) {
            dest.set(map.bytes.subarray(o, o + MiB), o);
            crc = crc32(dest.subarray(o, o + MiB), crc);
          }
          got = 1;
        } else {
          crc = crc32(dest.subarray(got, got + n), crc);
          got += n;
        }
        if (got >= want) done?.();
        return true;
      },
    },
  } as import("node:net").NetConnectOpts);
  await new Promise<void>((r) => sock.once("connect", () => r()));
  const one = async (op: "u" | "s"): Promise<number> => {
    want = op === "u" ? N : 1;
    got = 0;
    crc = 0;
    const t = performance.now();
    const p = new Promise<void>((r) => {
      done = r;
    });
    sock.write(op);
    await p;
    return performance.now() - t;
  };
  const u: number[] = [];
  const sh: number[] = [];
  for (let i = 0; i < 5; i++) {
    await one("u");
    await one("s");
  }
  for (let i = 0; i < 40; i++) {
    if (i % 2 === 0) {
      u.push(await one("u"));
      sh.push(await one("s"));
    } else {
      sh.push(await one("s"));
      u.push(await one("u"));
    }
  }
  sock.destroy();
  map.close();
  srv.kill("SIGTERM");
  fs.rmSync(path, { force: true });
  return {
    iterations: 40,
    unix_socket_two_copies_median_ms: round(median(u)),
    shared_region_one_copy_median_ms: round(median(sh)),
    ratio_unix_vs_shared_region: round(median(u) / median(sh)),
    note: "1-byte request on a unix socket; the region streamed on it (512 KiB SO_SNDBUF) vs a 1-byte doorbell and the consumer's copy + CRC out of the producer's mapping; CRC on in both",
  };
}

async function main(): Promise<void> {
  const out: Record<string, unknown> = { node: process.version, loadavg_start: loadavg() };
  const w = ShmMapping.create("/dev/shm", 2 * SLOT);
  const r = ShmMapping.open("/dev/shm", w.name, 2 * SLOT);
  w.unlink();
  const region = new Uint8Array(2 * N).fill(7);
  const dest = new Uint8Array(2 * N).fill(1);
  const ring = r.bytes;
  const producerCopy = () => {
    for (let s = 0; s < N; s += SLOT) w.bytes.set(region.subarray(s, s + SLOT), s % (2 * SLOT));
  };
  const f0 = faults();
  producerCopy();
  consumerPass(ring, dest, MiB);
  const warmFaults = faults() - f0;
  // a fresh ring: create, map both ends, first pass (what a per-transfer mapping would cost)
  const t0 = performance.now();
  const f1 = faults();
  const w2 = ShmMapping.create("/dev/shm", 2 * SLOT);
  const r2 = ShmMapping.open("/dev/shm", w2.name, 2 * SLOT);
  w2.unlink();
  for (let s = 0; s < N; s += SLOT) w2.bytes.set(region.subarray(s, s + SLOT), s % (2 * SLOT));
  consumerPass(r2.bytes, dest, MiB);
  const freshMs = performance.now() - t0;
  const freshFaults = faults() - f1;
  w2.close();
  r2.close();
  const wf = faults();
  producerCopy();
  consumerPass(ring, dest, MiB);
  out["components"] = {
    ms_per_16mib: {
      producer_copy_region_to_slot: time(producerCopy),
      consumer_copy_slot_to_dest: time(() => {
        for (let s = 0; s < N; s += SLOT) dest.set(ring.subarray(s % (2 * SLOT), (s % (2 * SLOT)) + SLOT), s);
      }),
      crc32_landed_bytes: time(() => crc32(dest.subarray(0, N), 0)),
      consumer_copy_then_crc_256k: time(() => consumerPass(ring, dest, 256 * 1024)),
      consumer_copy_then_crc_1m: time(() => consumerPass(ring, dest, MiB)),
      consumer_copy_then_crc_4m: time(() => consumerPass(ring, dest, SLOT)),
      fresh_ring_create_map_and_first_pass: round(freshMs),
    },
    minor_faults: {
      first_pass_of_a_new_ring: warmFaults,
      warm_pass: faults() - wf,
      fresh_ring_first_pass: freshFaults,
    },
  };
  // contention: the same consumer pass while another process copies
  const copier = spawn(process.execPath, ["--import", "tsx", SELF, "copier"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  await ready(copier);
  out["contention"] = {
    consumer_copy_then_crc_1m_ms: time(() => consumerPass(ring, dest, MiB)),
    producer_copy_region_to_slot_ms: time(producerCopy),
    note: "the same passes as components while a second process copies 16 MiB buffers in a loop",
  };
  copier.kill("SIGKILL");
  // one copy vs two through a FIFO, same consumer
  const fifo = join(tmpdir(), `ec-shm-profile-${process.pid}.fifo`);
  await new Promise<void>((resolve, reject) =>
    spawn("mkfifo", ["-m", "600", fifo]).once("exit", (c) =>
      c === 0 ? resolve() : reject(new Error("mkfifo")),
    ),
  );
  const prod = spawn(process.execPath, ["--import", "tsx", SELF, "fifo", fifo], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const fd = fs.openSync(fifo, "r");
  fs.unlinkSync(fifo);
  await ready(prod);
  const one = (mode: string): number => {
    const t = performance.now();
    prod.stdin!.write(`${mode}\n`);
    let crc = 0;
    for (let got = 0; got < N; ) {
      const n = fs.readSync(fd, dest, got, Math.min(MiB, N - got), null);
      crc = crc32(dest.subarray(got, got + n), crc);
      got += n;
    }
    return performance.now() - t;
  };
  const two: number[] = [];
  const single: number[] = [];
  for (let i = 0; i < 5; i++) {
    one("write");
    one("vmsplice");
  }
  for (let i = 0; i < 40; i++) {
    if (i % 2 === 0) {
      two.push(one("write"));
      single.push(one("vmsplice"));
    } else {
      single.push(one("vmsplice"));
      two.push(one("write"));
    }
  }
  out["one_copy_vs_two"] = {
    iterations: 40,
    two_copies_write_median_ms: round(median(two)),
    one_copy_vmsplice_median_ms: round(median(single)),
    ratio_two_vs_one: round(median(two) / median(single)),
    note: "consumer read(2) of a FIFO into its destination + CRC per 1 MiB; producer write(2) vs vmsplice(2)",
  };
  prod.kill("SIGTERM");
  fs.closeSync(fd);
  out["splice_vs_write_unix_socket"] = await spliceVsWrite(dest);
  out["shared_region_vs_unix_socket"] = await sharedRegionVsUnix(dest);
  w.close();
  r.close();
  out["loadavg_end"] = loadavg();
  process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
}

if (process.argv[2] === undefined) await main();
