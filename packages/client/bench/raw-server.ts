// Raw-socket baseline server for the client bench, run as a child process (like the worker).
// Length-prefixed messages (u32 big-endian, CONTRACT 3) over node:net: every request is read
// whole into one reused buffer (allocated once, at the size given), and answered with one
// preallocated reply of `--reply-bytes` (the STEP reply frame size) in a single write.
// Prints `{"msg":"listening","endpoints":[...]}` once bound.
//
//   node --import tsx bench/raw-server.ts --listen tcp://127.0.0.1:0 --listen unix:///tmp/x.sock \
//     --request-bytes N --reply-bytes M
import { unlinkSync } from "node:fs";
import * as net from "node:net";
import { parseArgs } from "node:util";

const { values: v } = parseArgs({
  options: {
    listen: { type: "string", multiple: true },
    "request-bytes": { type: "string" },
    "reply-bytes": { type: "string" },
  },
});
const requestBytes = Number(v["request-bytes"]);
const replyBytes = Number(v["reply-bytes"]);
if (!(Number.isInteger(requestBytes) && requestBytes > 0 && Number.isInteger(replyBytes) && replyBytes > 0)) {
  process.stderr.write("raw-server: --request-bytes and --reply-bytes must be positive integers\n");
  process.exit(2);
}

// header + body in one preallocated buffer: one write per reply
const reply = Buffer.alloc(4 + replyBytes, 7);
reply.writeUInt32BE(replyBytes, 0);

function serve(s: net.Socket): void {
  s.setNoDelay?.(true);
  const asm = Buffer.allocUnsafe(requestBytes);
  let hdr = 0;
  let len = 0;
  let got = 0;
  s.on("data", (c: Buffer) => {
    let off = 0;
    const end = c.length;
    while (off < end) {
      if (hdr < 4) {
        len = len * 256 + (c[off++] as number);
        if (++hdr < 4) continue;
        got = 0;
        if (len > asm.length) {
          process.stderr.write(`raw-server: request of ${len} bytes above --request-bytes\n`);
          s.destroy();
          return;
        }
      } else {
        let n = end - off;
        if (n > len - got) n = len - got;
        c.copy(asm, got, off, off + n);
        got += n;
        off += n;
      }
      if (got === len) {
        hdr = 0;
        len = 0;
        got = 0;
        s.write(reply);
      }
    }
  });
  s.on("error", () => {});
}

const endpoints: string[] = [];
for (const url of v.listen ?? []) {
  const server = net.createServer({ noDelay: true }, serve);
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
