/**
 * A data-plane reader written from docs/ec-protocol.md section 3.1 (the tcp/unix stream format of
 * the EC data plane): READ → DATA and the bytes, or ERROR then close; NOTIF after a read.
 */
import * as net from "node:net";

/** What a READ produced. */
export type ReadResult =
  | { kind: "data"; bytes: Uint8Array }
  | { kind: "error"; code: number; message: string; closed: boolean }
  | { kind: "closed" }
  | { kind: "timeout" };

/** One data-plane connection. */
export class DataReader {
  private buf: Buffer = Buffer.alloc(0);
  private closed = false;
  private wake: (() => void) | null = null;

  private constructor(private readonly sock: net.Socket) {
    sock.on("data", (d: Buffer) => {
      this.buf = this.buf.length === 0 ? d : Buffer.concat([this.buf, d]);
      this.wake?.();
    });
    const end = () => {
      this.closed = true;
      this.wake?.();
    };
    sock.on("close", end);
    sock.on("error", end);
  }

  /** Connects to a data endpoint (`tcp://host:port` or `unix:///path`). */
  static connect(endpoint: string, timeoutMs: number): Promise<DataReader> {
    return new Promise((resolve, reject) => {
      const u = /^unix:\/\/(\/.+)$/.exec(endpoint);
      const m = /^tcp:\/\/(.+):(\d+)$/.exec(endpoint);
      if (u === null && m === null) {
        reject(new Error(`data endpoint ${endpoint} is not tcp:// or unix://`));
        return;
      }
      const sock =
        u !== null ? net.connect({ path: u[1]! }) : net.connect({ host: m![1]!, port: Number(m![2]) });
      const t = setTimeout(() => {
        sock.destroy();
        reject(new Error(`connect to ${endpoint} timed out`));
      }, timeoutMs);
      sock.once("connect", () => {
        clearTimeout(t);
        resolve(new DataReader(sock));
      });
      sock.once("error", (e) => {
        clearTimeout(t);
        reject(e);
      });
    });
  }

  /** Writes raw bytes (garbage cases). */
  raw(b: Uint8Array): void {
    this.sock.write(b);
  }

  /** Sends a READ frame (docs/ec-protocol.md 3.1). */
  read(key: string, reader: string, instance: string, blocks: number[], nbytes: number): void {
    const k = Buffer.from(key, "utf8");
    const r = Buffer.from(reader, "utf8");
    const i = Buffer.from(instance, "utf8");
    const bodyLen = 20 + k.length + r.length + i.length + 4 * blocks.length;
    const f = Buffer.alloc(4 + bodyLen);
    f.writeUInt32LE(bodyLen, 0);
    f[4] = 1;
    f.writeUInt16LE(k.length, 6);
    f.writeUInt16LE(r.length, 8);
    f.writeUInt16LE(i.length, 10);
    f.writeUInt32LE(blocks.length, 12);
    f.writeBigUInt64LE(BigInt(nbytes), 16);
    let o = 24;
    for (const part of [k, r, i]) {
      part.copy(f, o);
      o += part.length;
    }
    for (const b of blocks) {
      f.writeUInt32LE(b, o);
      o += 4;
    }
    this.sock.write(f);
  }

  /**
   * Sends an XFER_REQ frame (docs/ec-protocol.md 3.5, tapwire 1.2 capability `data_req`): body
   * offsets 0 op 0x0c, 1 reserved, 2 u16 reader_len, 4 u16 instance_len, 6 u16 req_len, 8 u64
   * nbytes, 16 reader, instance, req (the XferReq map).
   */
  xferReq(reader: string, instance: string, nbytes: number, req: Uint8Array): void {
    const r = Buffer.from(reader, "utf8");
    const i = Buffer.from(instance, "utf8");
    const bodyLen = 16 + r.length + i.length + req.length;
    const f = Buffer.alloc(4 + bodyLen);
    f.writeUInt32LE(bodyLen, 0);
    f[4] = 0x0c;
    f.writeUInt16LE(r.length, 6);
    f.writeUInt16LE(i.length, 8);
    f.writeUInt16LE(req.length, 10);
    f.writeBigUInt64LE(BigInt(nbytes), 12);
    let o = 20;
    for (const part of [r, i, Buffer.from(req)]) {
      part.copy(f, o);
      o += part.length;
    }
    this.sock.write(f);
  }

  /**
   * Reads an ACK frame (docs/ec-protocol.md 3.3 / 3.5: op 0x06, 5 flags (bit 0 `final`), 6..7
   * reserved, then the XferAck map), or reports what came instead.
   */
  async ackFrame(
    timeoutMs: number,
  ): Promise<{ kind: "ack"; final: boolean; ack: Uint8Array } | { kind: "other"; what: string }> {
    const deadline = performance.now() + timeoutMs;
    if (!(await this.waitFor(5, deadline)))
      return { kind: "other", what: this.closed ? "closed" : "timeout" };
    const len = this.buf.readUInt32LE(0);
    if (len < 5 || len > 65_540) return { kind: "other", what: `body_len ${len}` };
    if (!(await this.waitFor(4 + len, deadline)))
      return { kind: "other", what: this.closed ? "closed" : "timeout" };
    const op = this.buf[4];
    if (op !== 6) return { kind: "other", what: `op ${op}` };
    const flags = this.buf[5]!;
    if ((flags & ~1) !== 0 || this.buf[6] !== 0 || this.buf[7] !== 0)
      return { kind: "other", what: `ACK flags/reserved ${this.buf.subarray(5, 8).toString("hex")}` };
    const ack = new Uint8Array(this.buf.subarray(8, 4 + len));
    this.buf = this.buf.subarray(4 + len);
    return { kind: "ack", final: flags === 1, ack };
  }

  /** Sends a NOTIF frame for `key`. */
  notif(key: string): void {
    const k = Buffer.from(key, "utf8");
    const f = Buffer.alloc(8 + k.length);
    f.writeUInt32LE(4 + k.length, 0);
    f[4] = 4;
    f.writeUInt16LE(k.length, 6);
    k.copy(f, 8);
    this.sock.write(f);
  }

  private async waitFor(n: number, deadline: number): Promise<boolean> {
    while (this.buf.length < n) {
      if (this.closed) return false;
      const left = deadline - performance.now();
      if (left <= 0) return false;
      await new Promise<void>((res) => {
        const t = setTimeout(res, left);
        this.wake = () => {
          clearTimeout(t);
          this.wake = null;
          res();
        };
      });
    }
    return true;
  }

  /** Reads the answer of a READ: DATA and its bytes, or ERROR. */
  async answer(timeoutMs: number): Promise<ReadResult> {
    const deadline = performance.now() + timeoutMs;
    if (!(await this.waitFor(5, deadline))) return this.closed ? { kind: "closed" } : { kind: "timeout" };
    const len = this.buf.readUInt32LE(0);
    if (!(await this.waitFor(4 + len, deadline)))
      return this.closed ? { kind: "closed" } : { kind: "timeout" };
    const op = this.buf[4];
    if (op === 3) {
      const code = this.buf[5]!;
      const ml = this.buf.readUInt16LE(6);
      const message = this.buf.subarray(8, 8 + ml).toString("utf8");
      this.buf = this.buf.subarray(4 + len);
      const closed = this.closed || (await this.waitClosed(Math.min(timeoutMs, 1000)));
      return { kind: "error", code, message, closed };
    }
    if (op !== 2 || len !== 12)
      return {
        kind: "error",
        code: -1,
        message: `unexpected frame op ${op}, body_len ${len}`,
        closed: this.closed,
      };
    const nbytes = Number(this.buf.readBigUInt64LE(8));
    if (!(await this.waitFor(16 + nbytes, deadline)))
      return this.closed ? { kind: "closed" } : { kind: "timeout" };
    const bytes = new Uint8Array(this.buf.subarray(16, 16 + nbytes));
    this.buf = this.buf.subarray(16 + nbytes);
    return { kind: "data", bytes };
  }

  /** True when the server closes within `ms`. */
  async waitClosed(ms: number): Promise<boolean> {
    const deadline = performance.now() + ms;
    while (!this.closed) {
      const left = deadline - performance.now();
      if (left <= 0) return false;
      await new Promise<void>((res) => {
        const t = setTimeout(res, left);
        this.wake = () => {
          clearTimeout(t);
          this.wake = null;
          res();
        };
      });
    }
    return true;
  }

  close(): void {
    this.sock.destroy();
  }
}
