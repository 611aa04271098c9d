// The CONTRACT 3 length prefix of the stream schemes, read incrementally: one owner for the
// client's and the server connection's receive loops.

/** CONTRACT 3: a u32 little-endian length prefix (CONTRACT 2) before every message. */
export const HEADER_BYTES = 4;

/** A length prefix being received: `got` of its {@link HEADER_BYTES} bytes so far, and the length. */
export class LengthPrefix {
  /** Prefix bytes received: 0 before a message, {@link HEADER_BYTES} once `len` is known. */
  got = 0;
  /** The announced message length (complete once `got` is {@link HEADER_BYTES}). */
  len = 0;

  /** Reads prefix bytes from `chunk[off, end)` (`got` below {@link HEADER_BYTES}); returns the new offset. */
  read(chunk: Buffer, off: number, end: number): number {
    if (this.got === 0 && end - off >= HEADER_BYTES) {
      this.len = chunk.readUInt32LE(off);
      this.got = HEADER_BYTES;
      return off + HEADER_BYTES;
    }
    while (off < end && this.got < HEADER_BYTES) {
      // A prefix split over reads: start from 0, not from the previous message's length.
      // CONTRACT 3: little-endian, so byte i of the prefix weighs 256^i.
      this.len = (this.got === 0 ? 0 : this.len) + (chunk[off] as number) * 2 ** (8 * this.got);
      off++;
      this.got++;
    }
    return off;
  }
}
