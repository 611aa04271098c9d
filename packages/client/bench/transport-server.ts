// Diagnostic server for the client bench, run as a child process: @tapwire/transport's `listen`
// with a handler that answers every request with one preallocated reply of `--reply-bytes` (the
// STEP reply frame size) and does nothing else. Measured against the raw server, it shows what
// the transport layer adds; against the worker, what the worker's STEP processing adds.
// Prints `{"msg":"listening","endpoints":[...]}` once bound.
import { parseArgs } from "node:util";
import { listen } from "@tapwire/transport";

const { values: v } = parseArgs({
  options: {
    listen: { type: "string", multiple: true },
    "reply-bytes": { type: "string" },
  },
});
const replyBytes = Number(v["reply-bytes"]);
if (!(Number.isInteger(replyBytes) && replyBytes > 0)) {
  process.stderr.write("transport-server: --reply-bytes must be a positive integer\n");
  process.exit(2);
}
const reply = Buffer.alloc(replyBytes, 7);
const endpoints: string[] = [];
for (const url of v.listen ?? []) {
  const srv = await listen(url, () => reply);
  endpoints.push(srv.endpoint);
}
process.stdout.write(`${JSON.stringify({ msg: "listening", endpoints })}\n`);
process.on("SIGTERM", () => process.exit(0));
