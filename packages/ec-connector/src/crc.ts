import * as zlib from "node:zlib";

type Crc32Fn = (data: Uint8Array, value?: number) => number;

let table: Uint32Array | undefined;

/** Table-driven CRC-32 (IEEE 802.3, zlib's), for runtimes without `zlib.crc32`. */
function crc32Table(data: Uint8Array, value = 0): number {
  if (table === undefined) {
    table = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      table[n] = c >>> 0;
    }
  }
  let c = ~value >>> 0;
  for (let i = 0; i < data.length; i++) c = table[(c ^ data[i]!) & 0xff]! ^ (c >>> 8);
  return ~c >>> 0;
}

const native = (zlib as unknown as { crc32?: Crc32Fn }).crc32;

/**
 * CRC-32 exactly as zlib (and `node:zlib` `crc32`, Node >= 20.15) computes it, continuing from
 * `value` so it can run incrementally over chunks (EC-CONTRACT 3, 6.3).
 */
export function crc32(data: Uint8Array, value = 0): number {
  return native !== undefined ? native(data, value) >>> 0 : crc32Table(data, value);
}

/** The portable table implementation (exported for tests that compare it with zlib's). */
export { crc32Table };
