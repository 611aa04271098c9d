// The trace file format (docs/trace.md): the writer's bytes read back by the reader, rows
// omitted with their length kept, a full ring drops and counts (never waits), a cut file reads up
// to its last whole record, and hostile bytes give only TraceError.
import { mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, test } from "vitest";
import {
  parseTrace,
  RecordFlag,
  RecordKind,
  readTrace,
  recordFrame,
  TRACE_HEADER_SIZE,
  TraceError,
  TraceWriter,
} from "../src/index.js";
import { frameOf, helloBody, stepBody } from "./frames.js";

const dir = mkdtempSync(join(tmpdir(), "tapwire-trace-fmt-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;
const file = () => join(dir, `t${n++}.trace`);

function writeRun(w: TraceWriter, steps: number): Uint8Array[] {
  const hello = frameOf(1, 0, 1, 0xabc, helloBody(0x5a));
  w.request(hello, hello.length);
  const frames = [hello];
  for (let i = 0; i < steps; i++) {
    const body = stepBody(i, i % 3, 4 + i, 4);
    const req = frameOf(2, 0, 2 + i, 0xabc, body);
    // scatter/gather parts: prefix view then rows, as the client sends them
    w.request([req.subarray(0, 128), req.subarray(128)], req.length);
    const rep = frameOf(2, 0, 2 + i, 0xabc, new Uint8Array(64).fill(i & 0xff));
    w.reply(rep, rep.length, 100 + i);
    frames.push(req, rep);
  }
  return frames;
}

describe("writer and reader (docs/trace.md)", () => {
  test("every frame comes back byte for byte; the header holds the HELLO with auth zeroed", async () => {
    const path = file();
    const w = new TraceWriter({ path, name: "fmt" });
    const frames = writeRun(w, 20);
    const st = await w.close();
    expect(st).toMatchObject({ records: 41, dropped: 0, rowsOmitted: 0 });
    const t = readTrace(path);
    expect(t.complete).toBe(true);
    expect(t.header).toMatchObject({ version: 1, source: "client", rowsPolicy: "all", writerName: "fmt" });
    expect(t.header.hello.window).toBe(16);
    expect([...t.header.hello.auth]).toEqual(new Array(32).fill(0));
    expect(t.records.map((r) => r.kind)).toEqual([1, ...new Array(20).fill([1, 2]).flat()]);
    // the HELLO record has auth zeroed (flag AUTH_ZEROED), everything else is the frame
    const h = t.records[0]!;
    expect(h.flags & RecordFlag.AUTH_ZEROED).toBe(RecordFlag.AUTH_ZEROED);
    const want = frames[0]!.slice();
    want.fill(0, 24 + 96, 24 + 128);
    expect(Buffer.from(h.stored).equals(Buffer.from(want))).toBe(true);
    t.records.slice(1).forEach((r, i) => {
      expect(Buffer.from(r.stored).equals(Buffer.from(frames[i + 1]!))).toBe(true);
      expect(r.seq).toBe(2 + Math.floor(i / 2));
      if (r.kind === RecordKind.REPLY) expect(r.aux).toBe(100 + Math.floor(i / 2));
    });
    // monotonic timestamps, records 8-aligned in the file
    for (let i = 1; i < t.records.length; i++)
      expect(t.records[i]!.tUs).toBeGreaterThanOrEqual(t.records[i - 1]!.tUs);
    for (const r of t.records) expect(r.stored.byteOffset % 8).toBe(0);
  });

  test("rows 'none' and sampled rows: ROWS_OMITTED with frame_len kept, zeros where the rows were", async () => {
    for (const [rows, kept] of [
      ["none", 0],
      [4, 5],
    ] as const) {
      const path = file();
      const w = new TraceWriter({ path, rows });
      const frames = writeRun(w, 20);
      const st = await w.close();
      expect(st.rowsOmitted).toBe(20 - kept);
      const t = readTrace(path);
      expect(t.header.rowsPolicy).toBe(rows === "none" ? "none" : "sampled");
      expect(t.header.rowsEvery).toBe(rows === "none" ? 0 : 4);
      const steps = t.records.filter((r) => r.kind === RecordKind.REQUEST && r.stored[6] === 2);
      expect(steps.filter((r) => (r.flags & RecordFlag.ROWS_OMITTED) === 0).length).toBe(kept);
      steps.forEach((r, i) => {
        const orig = frames[1 + 2 * i]!;
        expect(r.frameLen).toBe(orig.length);
        const back = recordFrame(r);
        expect(back.length).toBe(orig.length);
        if ((r.flags & RecordFlag.ROWS_OMITTED) !== 0) {
          expect(r.stored.length).toBe(128);
          expect(Buffer.from(back.subarray(0, 128)).equals(Buffer.from(orig.subarray(0, 128)))).toBe(true);
          expect(back.subarray(128).every((b) => b === 0)).toBe(true);
        } else expect(Buffer.from(back).equals(Buffer.from(orig))).toBe(true);
      });
    }
  });

  test("a full ring drops records and counts them without waiting; a GAP marks the place", async () => {
    const path = file();
    const w = new TraceWriter({ path, ringBytes: 64 * 1024, flushIntervalMs: 60_000 });
    const hello = frameOf(1, 0, 1, 9, helloBody());
    w.request(hello, hello.length);
    const big = frameOf(2, 0, 2, 9, stepBody(0, 0, 1250, 1250)); // 20 000 bytes of rows
    // synchronous burst: the background writer cannot run in between, so the ring fills
    const t0 = performance.now();
    for (let i = 0; i < 10; i++) w.request(big, big.length);
    const took = performance.now() - t0;
    const st = w.stats();
    expect(st.records).toBe(4); // header + HELLO + three 20 KiB frames fit in 64 KiB, a fourth does not
    expect(st.dropped).toBe(7);
    expect(took).toBeLessThan(10_000); // bounded: no wait happened (loose on a loaded machine)
    await w.flush();
    w.request(big, big.length); // space again: a GAP of 7, then the record
    const end = await w.close();
    expect(end.dropped).toBe(7);
    const t = readTrace(path);
    const kinds = t.records.map((r) => r.kind);
    expect(kinds.filter((k) => k === RecordKind.GAP).length).toBe(1);
    expect(t.records.find((r) => r.kind === RecordKind.GAP)!.aux).toBe(7);
    expect(t.dropped).toBe(7);
    expect(kinds.at(-1)).toBe(RecordKind.REQUEST);
  });

  test("the ring wraps around and keeps order", async () => {
    const path = file();
    const w = new TraceWriter({ path, ringBytes: 64 * 1024, flushIntervalMs: 1 });
    const frames = [frameOf(1, 0, 1, 9, helloBody())];
    w.request(frames[0]!, frames[0]!.length);
    for (let i = 0; i < 60; i++) {
      const f = frameOf(2, 0, 2 + i, 9, stepBody(i, 0, 400, 400));
      frames.push(f);
      w.request(f, f.length);
      if (i % 2 === 1) await w.flush();
    }
    const st = await w.close();
    expect(st.dropped).toBe(0);
    const t = readTrace(path);
    expect(t.records.length).toBe(61);
    t.records.slice(1).forEach((r, i) => {
      expect(r.seq).toBe(2 + i);
      expect(Buffer.from(r.stored).equals(Buffer.from(frames[i + 1]!))).toBe(true);
    });
  });

  test("frames before the first HELLO are not recorded (the header needs it); a trace without HELLO is empty", async () => {
    const path = file();
    const w = new TraceWriter({ path, source: "worker" });
    const s = frameOf(2, 0, 5, 9, stepBody(0, 0, 4, 4));
    w.request(s, s.length);
    expect(w.stats().beforeHello).toBe(1);
    expect(w.started).toBe(false);
    await w.close();
    expect(readFileSync(path).length).toBe(0);
  });

  test("a file cut inside a record (kill -9) reads up to its last whole record", async () => {
    const path = file();
    const w = new TraceWriter({ path });
    writeRun(w, 10);
    await w.close();
    const full = readTrace(path);
    const size = readFileSync(path).length;
    truncateSync(path, size - 32 - 13); // END gone, the last record cut
    const t = readTrace(path);
    expect(t.complete).toBe(false);
    expect(t.records.length).toBe(full.records.length - 1);
    expect(t.trailingBytes).toBeGreaterThan(0);
  });

  test("options are validated, naming the bad one", () => {
    expect(() => new TraceWriter({ path: "" })).toThrow(/option path/);
    expect(() => new TraceWriter({ path: file(), ringBytes: 10 })).toThrow(/option ringBytes/);
    expect(() => new TraceWriter({ path: file(), rows: 0 })).toThrow(/option rows/);
    expect(() => new TraceWriter({ path: file(), rows: "some" as never })).toThrow(/option rows/);
    expect(() => new TraceWriter({ path: file(), flushIntervalMs: 0 })).toThrow(/option flushIntervalMs/);
    expect(() => new TraceWriter({ path: file(), source: "x" as never })).toThrow(/option source/);
    expect(() => new TraceWriter({ path: file(), name: "n".repeat(40) })).toThrow(/option name/);
  });

  test("an unwritable path: close() rejects TRACE_IO, the tap never throws", async () => {
    const w = new TraceWriter({ path: join(dir, "no", "such", "dir", "x.trace") });
    writeRun(w, 3);
    await expect(w.close()).rejects.toMatchObject({ code: "TRACE_IO" });
  });
});

describe("hostile trace bytes", () => {
  test("named failures: magic, version, header_len, record_len, kind, stored_len", async () => {
    const path = file();
    const w = new TraceWriter({ path });
    writeRun(w, 2);
    await w.close();
    const good = new Uint8Array(readFileSync(path));
    const bad = (edit: (b: Uint8Array, dv: DataView) => void) => {
      const b = good.slice();
      edit(b, new DataView(b.buffer));
      return () => parseTrace(b);
    };
    expect(() => parseTrace(good.subarray(0, 100))).toThrow(/shorter than its 256-byte header/);
    expect(bad((b) => (b[0] = 0x58))).toThrow(/magic/);
    expect(bad((_, dv) => dv.setUint16(8, 2, true))).toThrow(/version 2/);
    expect(bad((_, dv) => dv.setUint16(10, 300, true))).toThrow(/header_len 300/);
    expect(bad((b) => (b[12] = 7))).toThrow(/source 7/);
    expect(bad((_, dv) => dv.setUint32(TRACE_HEADER_SIZE, 13, true))).toThrow(/record_len 13/);
    expect(bad((b) => (b[TRACE_HEADER_SIZE + 4] = 9))).toThrow(/unknown kind 9/);
    expect(bad((_, dv) => dv.setUint32(TRACE_HEADER_SIZE + 24, 4000, true))).toThrow(/stored_len 4000/);
    expect(bad((_, dv) => dv.setUint32(TRACE_HEADER_SIZE + 20, 10, true))).toThrow(/> frame_len 10/);
  });

  test("fuzz: random edits and random files give a Trace or a TraceError, nothing else", async () => {
    const path = file();
    const w = new TraceWriter({ path });
    writeRun(w, 4);
    await w.close();
    const good = new Uint8Array(readFileSync(path));
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.nat(good.length - 1), fc.integer({ min: 0, max: 255 })), { maxLength: 12 }),
        fc.nat(good.length),
        (edits, cut) => {
          const b = good.slice(0, Math.max(cut, 1));
          for (const [i, v] of edits) if (i < b.length) b[i] = v;
          try {
            const t = parseTrace(b);
            expect(t.records.length).toBeLessThanOrEqual(9);
          } catch (e) {
            if (!(e instanceof TraceError)) throw e;
          }
        },
      ),
      { numRuns: 400 },
    );
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 600 }), (b) => {
        try {
          parseTrace(b);
        } catch (e) {
          if (!(e instanceof TraceError)) throw e;
        }
      }),
      { numRuns: 300 },
    );
    writeFileSync(join(dir, "garbage.trace"), Buffer.from("not a trace at all"));
    expect(() => readTrace(join(dir, "garbage.trace"))).toThrow(TraceError);
    expect(() => readTrace(join(dir, "missing.trace"))).toThrow(/TRACE|cannot read/);
  });
});
