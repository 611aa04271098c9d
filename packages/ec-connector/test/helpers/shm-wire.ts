/**
 * shm data-plane frames (docs/ec-protocol.md 3.4) built and parsed by hand from its byte tables,
 * with a DataView and nothing from the package: a test talking to the real server with these
 * bytes fails if the code and the document drift apart.
 */
import * as net from "node:net";

function frame(body: Uint8Array): Buffer {
  const out = Buffer.alloc(4 + body.length);
  out.writeUInt32LE(body.length, 0);
  out.set(body, 4);
  return out;
}

/** SHM_ATTACH (0x07): version u16 at body offset 2. */
export function handAttach(version = 1): Buffer {
  const b = new Uint8Array(4);
  const v = new DataView(b.buffer);
  v.setUint8(0, 0x07);
  v.setUint16(2, version, true);
  return frame(b);
}

/** SHM_ATTACHED (0x09): status u8 at body offset 1 (0 mapped, 1 declined). */
export function handAttached(status: number): Buffer {
  return frame(Uint8Array.of(0x09, status, 0, 0));
}

/** SHM_RELEASE (0x0b): slot u16 at 2, seq u32 at 4. */
export function handRelease(slot: number, seq: number): Buffer {
  const b = new Uint8Array(8);
  const v = new DataView(b.buffer);
  v.setUint8(0, 0x0b);
  v.setUint16(2, slot, true);
  v.setUint32(4, seq, true);
  return frame(b);
}

/** SHM_OFFER (0x08), as a producer written from the tables sends it. */
export function handOffer(status: number, slots: number, slotBytes: number, text: string): Buffer {
  const t = Buffer.from(text, "utf8");
  const b = new Uint8Array(12 + t.length);
  const v = new DataView(b.buffer);
  v.setUint8(0, 0x08);
  v.setUint8(1, status);
  v.setUint16(2, slots, true);
  v.setUint32(4, slotBytes, true);
  v.setUint16(8, t.length, true);
  b.set(t, 12);
  return frame(b);
}

/** SHM_CHUNK (0x0a): slot u16 at 2, seq u32 at 4, offset u32 at 8, length u32 at 12. */
export function handChunk(slot: number, seq: number, offset: number, length: number): Buffer {
  const b = new Uint8Array(16);
  const v = new DataView(b.buffer);
  v.setUint8(0, 0x0a);
  v.setUint16(2, slot, true);
  v.setUint32(4, seq, true);
  v.setUint32(8, offset, true);
  v.setUint32(12, length, true);
  return frame(b);
}

/** A frame a server sent, parsed by offset from the tables of 3.1 and 3.3. */
export type ShmHandFrame =
  | { op: "offer"; status: number; slots: number; slotBytes: number; text: string }
  | { op: "chunk"; slot: number; seq: number; offset: number; length: number }
  | { op: "data"; nbytes: number }
  | { op: "error"; code: number; message: string }
  | { op: "raw"; bytes: number };

/**
 * A hand-written reader on a unix socket: collects the server's frames (and, after a DATA on a
 * connection without a ring, counts raw bytes) and whether the server closed.
 */
export class HandConn {
  readonly socket: net.Socket;
  readonly frames: ShmHandFrame[] = [];
  closed = false;
  #buf = Buffer.alloc(0);
  #raw = 0;
  /** Set true once a ring is mapped: DATA is then followed by chunks, not raw bytes. */
  ring = false;

  constructor(path: string) {
    this.socket = net.connect(path);
    this.socket.on("data", (d: Buffer) => this.#on(d));
    this.socket.on("close", () => {
      this.closed = true;
    });
    this.socket.on("error", () => undefined);
  }

  #on(d: Buffer): void {
    this.#buf = Buffer.concat([this.#buf, d]);
    for (;;) {
      if (this.#raw > 0) {
        const n = Math.min(this.#raw, this.#buf.length);
        if (n === 0) return;
        this.#raw -= n;
        this.#buf = this.#buf.subarray(n);
        this.frames.push({ op: "raw", bytes: n });
        continue;
      }
      if (this.#buf.length < 4) return;
      const len = this.#buf.readUInt32LE(0);
      if (this.#buf.length < 4 + len) return;
      const v = new DataView(this.#buf.buffer, this.#buf.byteOffset + 4, len);
      const body = this.#buf.subarray(4, 4 + len);
      this.#buf = this.#buf.subarray(4 + len);
      const op = v.getUint8(0);
      if (op === 0x08) {
        const tl = v.getUint16(8, true);
        this.frames.push({
          op: "offer",
          status: v.getUint8(1),
          slots: v.getUint16(2, true),
          slotBytes: v.getUint32(4, true),
          text: body.subarray(12, 12 + tl).toString("utf8"),
        });
      } else if (op === 0x0a) {
        this.frames.push({
          op: "chunk",
          slot: v.getUint16(2, true),
          seq: v.getUint32(4, true),
          offset: v.getUint32(8, true),
          length: v.getUint32(12, true),
        });
      } else if (op === 0x02) {
        const nbytes = Number(v.getBigUint64(4, true));
        this.frames.push({ op: "data", nbytes });
        if (!this.ring) this.#raw = nbytes;
      } else if (op === 0x03) {
        const n = v.getUint16(2, true);
        this.frames.push({
          op: "error",
          code: v.getUint8(1),
          message: body.subarray(4, 4 + n).toString("utf8"),
        });
      } else {
        throw new Error(`unknown op ${op}`);
      }
    }
  }

  /** Frames of one op seen so far. */
  of<K extends ShmHandFrame["op"]>(op: K): Extract<ShmHandFrame, { op: K }>[] {
    return this.frames.filter((f) => f.op === op) as Extract<ShmHandFrame, { op: K }>[];
  }

  write(b: Buffer): void {
    this.socket.write(b);
  }

  destroy(): void {
    this.socket.destroy();
  }
}
