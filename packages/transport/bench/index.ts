// Request/reply RTT and throughput: @tapwire/transport per scheme vs (a) a raw node:net baseline
// using the best known technique and (b) @grpc/grpc-js unary calls with pass-through serializers.
// Also (a') raw-*-direct: (a) with the server receiving the way @tapwire/transport's server does
// (see adoptDirect); ratios to it are reported as p50_ratio_to_direct.
// Server and client share this process for every contender (same arrangement for all).
// JSON on stdout; progress on stderr.
import { mkdtempSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import { listen, makeClient } from "../src/index.js";
import { tlsCreds } from "../test/helpers/env.js";
import { benchShm } from "./shm.js";

const SIZES = [64, 96 * 1024, 768 * 1024, 4 * 1024 * 1024];
const REPLY = 16 * 1024;
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);
// Per (size) iteration counts, chosen to keep the whole run (5 rounds) around 2-3 minutes on 2 cores.
const ITERS: Record<number, number> = {
  64: 1500,
  [96 * 1024]: 500,
  [768 * 1024]: 120,
  [4 * 1024 * 1024]: 30,
};
const dir = mkdtempSync(join(tmpdir(), "twb-"));

interface Rt {
  rt(msg: Uint8Array, reply: Uint8Array): Promise<number>;
  close(): Promise<void>;
}

const replyBody = Buffer.alloc(REPLY, 7);

/**
 * (a') server side of `raw-*-direct`: the accepted socket's handle is moved to a socket created
 * with `onread` (what @tapwire/transport's server does, see src/stream-server.ts), so the rest of
 * a message is read by the kernel straight into the assembly buffer, no per-read allocation.
 */
function adoptDirect(orig: net.Socket): void {
  const holder = orig as unknown as { _handle: unknown };
  const handle = holder._handle;
  const rbuf = Buffer.allocUnsafe(64 * 1024);
  let asm = Buffer.allocUnsafe(8 << 20);
  let hdr = 0;
  let len = 0;
  let got = 0;
  let direct: Uint8Array | null = null;
  const h = Buffer.allocUnsafe(4);
  h.writeUInt32LE(REPLY);
  let s: net.Socket;
  const done = (): void => {
    hdr = 0;
    len = 0;
    s.cork();
    s.write(h);
    s.write(replyBody);
    s.uncork();
  };
  s = new net.Socket({
    handle,
    readable: true,
    writable: true,
    onread: {
      buffer: (): Uint8Array => {
        direct = hdr === 4 && got < len ? asm.subarray(got, len) : null;
        return direct ?? rbuf;
      },
      callback: (n: number, b: Uint8Array): boolean => {
        if (b === direct) {
          got += n;
          if (got === len) done();
          return true;
        }
        let off = 0;
        while (off < n) {
          if (hdr < 4) {
            // CONTRACT 3: little-endian, byte i weighs 256^i.
            len += (rbuf[off++] as number) * 2 ** (8 * hdr);
            if (++hdr === 4) {
              got = 0;
              if (asm.length < len) asm = Buffer.allocUnsafe(len);
              if (len === 0) done();
            }
            continue;
          }
          const k = Math.min(n - off, len - got);
          rbuf.copy(asm, got, off, off + k);
          got += k;
          off += k;
          if (got === len) done();
        }
        return true;
      },
    },
  } as net.SocketConstructorOpts);
  holder._handle = null;
  orig.destroy();
  s.setNoDelay(true);
}

// (a) Raw node:net: client reads with onread into a reused buffer and copies into the reply
// buffer; sends header + payload with cork/uncork; server assembles into a reused buffer.
// With `direct`, the server receives as in adoptDirect instead of through 'data' events.
async function rawNet(kind: "tcp" | "unix", direct = false): Promise<Rt> {
  const server = net.createServer({ noDelay: true, pauseOnConnect: direct }, (s) => {
    if (direct) {
      adoptDirect(s);
      return;
    }
    let asm = Buffer.allocUnsafe(8 << 20);
    let hdr = 0;
    let len = 0;
    let got = 0;
    const h = Buffer.allocUnsafe(4);
    h.writeUInt32LE(REPLY);
    s.on("data", (c: Buffer) => {
      let off = 0;
      while (off < c.length) {
        if (hdr < 4) {
          // CONTRACT 3: little-endian, byte i weighs 256^i.
          len += (c[off++] as number) * 2 ** (8 * hdr);
          if (++hdr === 4) {
            got = 0;
            if (asm.length < len) asm = Buffer.allocUnsafe(len);
          } else continue;
        } else {
          const n = Math.min(c.length - off, len - got);
          c.copy(asm, got, off, off + n);
          got += n;
          off += n;
        }
        if (hdr === 4 && got === len) {
          hdr = 0;
          len = 0;
          s.cork();
          s.write(h);
          s.write(replyBody);
          s.uncork();
        }
      }
    });
  });
  const path = join(dir, `raw-${Math.random().toString(36).slice(2)}.sock`);
  await new Promise<void>((r) =>
    kind === "unix" ? server.listen(path, r) : server.listen(0, "127.0.0.1", r),
  );
  const port = kind === "tcp" ? (server.address() as net.AddressInfo).port : 0;
  let out: Uint8Array = new Uint8Array(0);
  let hdr = 0;
  let len = 0;
  let got = 0;
  let done: (n: number) => void = () => {};
  const onread = {
    buffer: Buffer.allocUnsafe(64 * 1024),
    callback: (n: number, b: Uint8Array): boolean => {
      const buf = b as Buffer;
      let off = 0;
      while (off < n) {
        if (hdr < 4) {
          // CONTRACT 3: little-endian, byte i weighs 256^i.
          len += (buf[off++] as number) * 2 ** (8 * hdr);
          hdr++;
          continue;
        }
        const k = Math.min(n - off, len - got);
        buf.copy(out, got, off, off + k);
        got += k;
        off += k;
      }
      if (hdr === 4 && got === len) {
        hdr = 0;
        const l = len;
        len = 0;
        got = 0;
        done(l);
      }
      return true;
    },
  };
  const sock = await new Promise<net.Socket>((resolve) => {
    const s =
      kind === "unix"
        ? net.connect({ path, onread }, () => resolve(s))
        : net.connect({ host: "127.0.0.1", port, noDelay: true, onread }, () => resolve(s));
  });
  const header = Buffer.allocUnsafe(4);
  return {
    rt(msg, reply) {
      out = reply;
      return new Promise<number>((resolve) => {
        done = resolve;
        header.writeUInt32LE(msg.length);
        sock.cork();
        sock.write(header);
        sock.write(msg);
        sock.uncork();
      });
    },
    async close() {
      sock.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

async function ours(scheme: string): Promise<Rt> {
  const c = tlsCreds();
  const ep =
    scheme === "unix" || scheme === "zmq+ipc"
      ? `${scheme}://${join(dir, `${scheme.replace("+", "")}-${Math.random().toString(36).slice(2)}.sock`)}`
      : `${scheme}://127.0.0.1:0`;
  const srv = await listen(
    ep,
    () => replyBody,
    scheme === "tls" ? { tls: { cert: c.cert, key: c.key } } : {},
  );
  const client = makeClient(srv.endpoint, scheme === "tls" ? { tls: { ca: c.ca } } : {});
  await client.connect(5000);
  return {
    rt: (msg, reply) => client.request(msg, reply, 30_000),
    async close() {
      client.close();
      await srv.close();
    },
  };
}

async function grpcJs(): Promise<Rt> {
  const pass = {
    path: "/bench.Echo/Call",
    requestStream: false,
    responseStream: false,
    requestSerialize: (b: Buffer) => b,
    requestDeserialize: (b: Buffer) => b,
    responseSerialize: (b: Buffer) => b,
    responseDeserialize: (b: Buffer) => b,
  };
  const server = new grpc.Server({ "grpc.max_receive_message_length": 64 << 20 });
  server.addService({ Call: pass } as grpc.ServiceDefinition, {
    Call: (_call: grpc.ServerUnaryCall<Buffer, Buffer>, cb: grpc.sendUnaryData<Buffer>) =>
      cb(null, replyBody),
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (e, p) =>
      e ? reject(e) : resolve(p),
    ),
  );
  const client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure(), {
    "grpc.max_send_message_length": 64 << 20,
    "grpc.max_receive_message_length": 64 << 20,
  });
  return {
    rt(msg, reply) {
      return new Promise<number>((resolve, reject) => {
        client.makeUnaryRequest<Buffer, Buffer>(
          pass.path,
          (b) => b,
          (b) => b,
          msg as Buffer,
          (e, r) => {
            if (e || !r) return reject(e);
            reply.set(r);
            resolve(r.length);
          },
        );
      });
    },
    async close() {
      client.close();
      await new Promise<void>((r) => server.tryShutdown(() => r()));
    },
  };
}

const CONTENDERS: Record<string, () => Promise<Rt>> = {
  "raw-tcp": () => rawNet("tcp"),
  "raw-unix": () => rawNet("unix"),
  "raw-tcp-direct": () => rawNet("tcp", true),
  "raw-unix-direct": () => rawNet("unix", true),
  tcp: () => ours("tcp"),
  unix: () => ours("unix"),
  tls: () => ours("tls"),
  "zmq+tcp": () => ours("zmq+tcp"),
  "zmq+ipc": () => ours("zmq+ipc"),
  grpc: () => grpcJs(),
};
// Ratios are taken to the raw baseline of the same carrier.
const BASELINE: Record<string, string> = {
  "raw-tcp": "raw-tcp",
  "raw-unix": "raw-unix",
  "raw-tcp-direct": "raw-tcp",
  "raw-unix-direct": "raw-unix",
  tcp: "raw-tcp",
  unix: "raw-unix",
  tls: "raw-tcp",
  "zmq+tcp": "raw-tcp",
  "zmq+ipc": "raw-unix",
  grpc: "raw-tcp",
};

// (a') of the same carrier.
const DIRECT: Record<string, string> = {
  "raw-tcp": "raw-tcp-direct",
  "raw-unix": "raw-unix-direct",
  "raw-tcp-direct": "raw-tcp-direct",
  "raw-unix-direct": "raw-unix-direct",
  tcp: "raw-tcp-direct",
  unix: "raw-unix-direct",
  tls: "raw-tcp-direct",
  "zmq+tcp": "raw-tcp-direct",
  "zmq+ipc": "raw-unix-direct",
  grpc: "raw-tcp-direct",
};

function pct(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] as number;
}
function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
}

interface Sample {
  p50: number;
  p99: number;
  rps: number;
}

async function measure(rt: Rt, size: number): Promise<Sample> {
  const msg = Buffer.alloc(size, 1);
  const reply = Buffer.alloc(REPLY);
  const n = ITERS[size] as number;
  for (let i = 0; i < Math.max(5, n / 10); i++) await rt.rt(msg, reply);
  const lat = new Array<number>(n);
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    const a = performance.now();
    const got = await rt.rt(msg, reply);
    lat[i] = performance.now() - a;
    if (got !== REPLY) throw new Error(`reply of ${got} bytes`);
  }
  const total = performance.now() - t0;
  lat.sort((a, b) => a - b);
  return { p50: pct(lat, 50) * 1000, p99: pct(lat, 99) * 1000, rps: (n / total) * 1000 };
}

const samples = new Map<string, Sample[]>();
const started = performance.now();
for (let round = 0; round < ROUNDS; round++) {
  // Alternate the order every round so drift on a noisy machine hits every contender alike.
  const names = Object.keys(CONTENDERS);
  if (round % 2 === 1) names.reverse();
  for (const name of names) {
    const rt = await (CONTENDERS[name] as () => Promise<Rt>)();
    for (const size of SIZES) {
      const s = await measure(rt, size);
      const key = `${name}|${size}`;
      samples.set(key, [...(samples.get(key) ?? []), s]);
    }
    await rt.close();
    process.stderr.write(
      `round ${round + 1}/${ROUNDS} ${name} done at ${((performance.now() - started) / 1000).toFixed(1)} s\n`,
    );
  }
}

const results = [];
for (const name of Object.keys(CONTENDERS)) {
  for (const size of SIZES) {
    const ss = samples.get(`${name}|${size}`) as Sample[];
    const base = samples.get(`${BASELINE[name]}|${size}`) as Sample[];
    const p50 = median(ss.map((s) => s.p50));
    const p99 = median(ss.map((s) => s.p99));
    const rps = median(ss.map((s) => s.rps));
    const b50 = median(base.map((s) => s.p50));
    const b99 = median(base.map((s) => s.p99));
    const d50 = median((samples.get(`${DIRECT[name]}|${size}`) as Sample[]).map((s) => s.p50));
    results.push({
      transport: name,
      baseline: BASELINE[name],
      requestBytes: size,
      replyBytes: REPLY,
      p50_us: Math.round(p50 * 10) / 10,
      p99_us: Math.round(p99 * 10) / 10,
      requests_per_s: Math.round(rps),
      MB_per_s: Math.round((rps * (size + REPLY)) / 1e6),
      p50_ratio_to_baseline: Math.round((p50 / b50) * 100) / 100,
      p99_ratio_to_baseline: Math.round((p99 / b99) * 100) / 100,
      p50_ratio_to_direct: Math.round((p50 / d50) * 100) / 100,
    });
  }
}
// issue 23: the STEP-shaped shm+unix vs unix rows (interleaved, same run)
const shm = await benchShm(ROUNDS);
process.stdout.write(
  `${JSON.stringify(
    {
      bench: "@tapwire/transport request/reply",
      arrangement: "server and client in the same process, loopback, one request outstanding",
      rounds: ROUNDS,
      statistic: "median over rounds of per-round p50/p99/throughput",
      node: process.version,
      seconds: Math.round((performance.now() - started) / 1000),
      results,
      shm,
    },
    null,
    1,
  )}\n`,
);
