import { isIntIn, rd32 } from "./bytes.js";
import { APP_HEADER_SIZE } from "./constants.js";
import { badArgument, WireError, WireErrorCode } from "./errors.js";
import { type DecodeHeaderOptions, decodeHeader } from "./header.js";

/** Options of {@link FrameAccumulator}. */
export interface FrameAccumulatorOptions extends DecodeHeaderOptions {
  /** Largest whole frame (header + body) accepted; default 64 MiB (CONTRACT 3). */
  maxFrameBytes?: number;
}

/** Default of {@link FrameAccumulatorOptions.maxFrameBytes}: 64 MiB (CONTRACT 3). */
export const DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024;

/**
 * Splits a byte stream of back-to-back DSPK frames into whole frames, using each header's
 * `body_len` (for tools and tests that see frames without the transport's length prefix). The
 * header is checked (CONTRACT 4) as soon as its 24 bytes are in, and a frame above
 * `maxFrameBytes` is refused (`WIRE_TOO_LARGE`) before its body is buffered (CONTRACT 11). After
 * an error the accumulator is poisoned: every later `push` throws the same error.
 */
export class FrameAccumulator {
  readonly #max: number;
  readonly #request: boolean;
  #buf = new Uint8Array(256);
  #start = 0;
  #end = 0;
  #error: WireError | null = null;
  /** `#start` of the frame whose header was checked, -1 for none. */
  #checked = -1;

  constructor(options: FrameAccumulatorOptions = {}) {
    const max = options.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    if (!isIntIn(max, APP_HEADER_SIZE, Number.MAX_SAFE_INTEGER)) {
      throw badArgument(`maxFrameBytes ${max} is not an integer >= ${APP_HEADER_SIZE}`);
    }
    this.#max = max;
    this.#request = options.request === true;
  }

  /** Bytes held that do not yet form a whole frame. */
  get buffered(): number {
    return this.#end - this.#start;
  }

  /**
   * Appends `chunk` and returns the frames it completed, in order (each a fresh copy).
   * @throws WireError on a bad header (`WIRE_BAD_FRAME`/`WIRE_BAD_VERSION`) or an oversize frame
   *   (`WIRE_TOO_LARGE`).
   */
  push(chunk: Uint8Array): Uint8Array[] {
    if (this.#error !== null) throw this.#error;
    this.#append(chunk);
    const out: Uint8Array[] = [];
    try {
      for (;;) {
        const have = this.#end - this.#start;
        if (have < APP_HEADER_SIZE) break;
        const bodyLen = rd32(this.#buf, this.#start + 16);
        const total = APP_HEADER_SIZE + bodyLen;
        // Check magic, version and reserved once, before the size and before waiting for the
        // body: garbage is BAD_FRAME whatever its body_len bytes happen to say.
        if (this.#checked !== this.#start) {
          const head = this.#buf.slice(this.#start, this.#start + APP_HEADER_SIZE);
          head.fill(0, 16, 20); // body_len is the stream's framing here, not a claim to verify
          decodeHeader(head, APP_HEADER_SIZE, { request: this.#request });
          this.#checked = this.#start;
        }
        if (total > this.#max) {
          throw new WireError(
            WireErrorCode.TOO_LARGE,
            `frame of ${total} bytes is above the ${this.#max}-byte limit`,
          );
        }
        if (have < total) break;
        out.push(this.#buf.slice(this.#start, this.#start + total));
        this.#start += total;
        this.#checked = -1;
      }
    } catch (e) {
      this.#error = e as WireError;
      throw e;
    }
    if (this.#start === this.#end) {
      this.#start = this.#end = 0;
      this.#checked = -1;
    }
    return out;
  }

  #append(chunk: Uint8Array): void {
    const have = this.#end - this.#start;
    if (this.#end + chunk.length > this.#buf.length) {
      if (have + chunk.length <= this.#buf.length) {
        this.#buf.copyWithin(0, this.#start, this.#end);
      } else {
        let cap = this.#buf.length;
        while (cap < have + chunk.length) cap *= 2;
        const next = new Uint8Array(cap);
        next.set(this.#buf.subarray(this.#start, this.#end));
        this.#buf = next;
      }
      if (this.#checked === this.#start) this.#checked = 0;
      this.#start = 0;
      this.#end = have;
    }
    this.#buf.set(chunk, this.#end);
    this.#end += chunk.length;
  }
}
