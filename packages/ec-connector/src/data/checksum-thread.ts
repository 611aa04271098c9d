/**
 * The checksum thread's entry (a worker module, started by `ChecksumThread`): CRC-32 of ranges of
 * the shared cache region, in order, per read id. Uses the same implementation chain as the main
 * thread (`crc32Info` from `crc.ts`: ISA-L for long ranges over `@node-rs/crc32` → `node:zlib` → table, and the
 * `TAPWIRE_EC_CRC32` override), and reports which one it uses first.
 */
import { parentPort, workerData } from "node:worker_threads";
import { crc32Info } from "../crc.js";
import type { CrcThreadData, CrcThreadReply, CrcThreadRequest } from "./checksum.js";

const port = parentPort;
if (port === null) throw new Error("checksum-thread: must run as a worker thread");
const data = workerData as CrcThreadData;
const region = new Uint8Array(data.buffer, data.byteOffset, data.length);
const crc = crc32Info.fn;
const crcs = new Map<number, number>();

const reply = (m: CrcThreadReply) => port.postMessage(m);
reply({ kind: "impl", impl: crc32Info.impl });

port.on("message", (m: CrcThreadRequest) => {
  if (m.kind === "drop") {
    crcs.delete(m.id);
    return;
  }
  let c = crcs.get(m.id) ?? 0;
  if (m.len > 0) c = crc(region.subarray(m.start, m.start + m.len), c);
  if (m.final) {
    crcs.delete(m.id);
    reply({ kind: "crc", id: m.id, crc: c >>> 0 });
  } else {
    crcs.set(m.id, c);
  }
});
