// Raw-socket baseline server for the client bench, run as a child process (like the worker).
// Length-prefixed messages (u32 little-endian, CONTRACT 3) over node:net: every request is read
// whole into one reused buffer (allocated once, at the size given), and answered with one
// preallocated reply of `--reply-bytes` (the STEP reply frame size) in a single write. Nothing
// else: no decoding, no copy into slot windows, no drafting.
//
// `--mode data` (default) is @tapwire/transport's raw-socket baseline (packages/transport/bench,
// `raw-tcp` / `raw-unix`): the request arrives through 'data' events and is copied into the
// reused buffer, as a plain node:net server does. `--mode direct` is the stricter one that
// receives the way @tapwire/transport's server does (its `raw-*-direct`): the kernel reads the
// rest of a request straight into the reused buffer, no copy at all.
// Prints `{"msg":"listening","endpoints":[...]}` once bound.
//
//   node --import tsx bench/raw-server.ts --listen tcp://127.0.0.1:0 --listen unix:///tmp/x.sock \
//     --request-bytes N --reply-bytes M [--mode data|direct]
import { unlinkSync } from "node:fs";
import * as net from "node:net";
import { parseArgs } from "node:util";

const { values: v } = parseArgs({
  options: {
    listen: { type: "string", multiple: true },
    "request-bytes": { type: "string" },
    "reply-bytes": { type: "string" },
    mode: { type: "string", default: "data" },
  },
});
const mode = v.mode;
if (mode !== "data" && mode !== "direct") {
  process.stderr.write(`raw-server: --mode must be data or direct, got ${mode}\n`);
  process.exit(2);
}
const requestBytes = Number(v["request-bytes"]);
const replyBytes = Number(v["reply-bytes"]);
if (!(Number.isInteger(requestBytes) && requestBytes > 0 && Number.isInteger(replyBytes) && replyBytes > 0)) {
  process.stderr.write("raw-server: --request-bytes and --reply-bytes must be positive integers\n");
  process.exit(2);
}

// header + body in one preallocated buffer: one write per reply
const reply = Buffer.alloc(4 + replyBytes, 7);
reply.writeUInt32LE(replyBytes, 0);

// The technique of @tapwire/transport's server and of its bench's `raw-*-direct` baseline: the
// accepted (paused) socket's handle moves to a socket created with `onread`, so that once a
// request's length is known the kernel reads the rest straight into the reused request buffer
// (large reads, no copy, no allocation per read).
// The transport package's raw baseline: 'data' events, each chunk copied into the reused buffer.
function serveData(s: net.Socket): void {
  const asm = Buffer.allocUnsafe(requestBytes);
  let hdr = 0;
  let len = 0;
  let got = 0;
  s.on("data", (c: Buffer) => {
    let off = 0;
    while (off < c.length) {
      if (hdr < 4) {
        len += (c[off++] as number) * 2 ** (8 * hdr); // little-endian prefix (CONTRACT 3)
        if (++hdr < 4) continue;
        got = 0;
        if (len > asm.length) {
          process.stderr.write(`raw-server: request of ${len} bytes above --request-bytes\n`);
          s.destroy();
          return;
        }
      } else {
        const k = Math.min(c.length - off, len - got);
        c.copy(asm, got, off, off + k);
        got += k;
        off += k;
      }
      if (hdr === 4 && got === len) {
        hdr = 0;
        len = 0;
        got = 0;
        s.write(reply);
      }
    }
  });
  s.on("error", () => {});
}

function serve(orig: net.Socket): void {
  const holder = orig as unknown as { _handle: unknown };
  const handle = holder._handle;
  const rbuf = Buffer.allocUnsafe(64 * 1024);
  const asm = Buffer.allocUnsafe(requestBytes);
  let hdr = 0;
  let len = 0;
  let got = 0;
  let direct: Uint8Array | null = null;
  const done = (): void => {
    hdr = 0;
    len = 0;
    got = 0;
    s.write(reply);
  };
  const s = new net.Socket({
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
            len += (rbuf[off++] as number) * 2 ** (8 * hdr); // little-endian prefix (CONTRACT 3)
            if (++hdr < 4) continue;
            got = 0;
            if (len > asm.length) {
              process.stderr.write(`raw-server: request of ${len} bytes above --request-bytes\n`);
              s.destroy();
              return false;
            }
            if (len === 0) done();
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
  if (s.remoteAddress !== undefined) s.setNoDelay(true);
  s.on("error", () => {});
}

const endpoints: string[] = [];
for (const url of v.listen ?? []) {
  const server =
    mode === "direct"
      ? net.createServer({ noDelay: true, pauseOnConnect: true }, serve)
      : net.createServer({ noDelay: true }, serveData);
  if (url.startsWith("unix://")) {
    const path = url.slice("unix://".length);
    try {
      unlinkSync(path);
    } catch {}
    await new Promise<void>((r) => server.listen(path, r));
    endpoints.push(url);
  } else if (url.startsWith("tcp://")) {
    const m = /^tcp:\/\/([^:]+):(\d+)$/.exec(url);
    if (m === null) throw new Error(`raw-server: bad endpoint ${url}`);
    await new Promise<void>((r) => server.listen(Number(m[2]), m[1], r));
    endpoints.push(`tcp://${m[1]}:${(server.address() as net.AddressInfo).port}`);
  } else {
    throw new Error(`raw-server: unsupported endpoint ${url}`);
  }
}
process.stdout.write(`${JSON.stringify({ msg: "listening", endpoints })}\n`);
process.on("SIGTERM", () => process.exit(0));
