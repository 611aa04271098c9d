/**
 * safetensors: an 8-byte little-endian header length N, N bytes of JSON header, then the raw
 * little-endian tensor bytes. The header maps tensor names to
 * `{ dtype, shape, data_offsets: [begin, end] }` (offsets relative to the data section) and may
 * hold `__metadata__` (string to string). Reading is strict: every check below throws a
 * {@link ReferenceModelError} with a stable code naming the first problem.
 */
import { checkInt, ReferenceModelError } from "./errors.js";

/** Byte size of each supported dtype. */
export const SAFETENSORS_DTYPE_SIZES = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  F8_E4M3: 1,
  F8_E5M2: 1,
  I16: 2,
  U16: 2,
  F16: 2,
  BF16: 2,
  I32: 4,
  U32: 4,
  F32: 4,
  I64: 8,
  U64: 8,
  F64: 8,
} as const;

/** A dtype name of {@link SAFETENSORS_DTYPE_SIZES}. */
export type SafetensorsDtype = keyof typeof SAFETENSORS_DTYPE_SIZES;

/** One tensor: dtype name, shape, and its raw little-endian bytes. */
export interface SafetensorsTensor {
  /** A dtype name of {@link SAFETENSORS_DTYPE_SIZES}, e.g. `"F32"`, `"BF16"`. */
  dtype: string;
  /** Dimensions; `data` holds `product(shape) * dtype size` bytes. */
  shape: number[];
  /** Raw little-endian bytes (a view into the file buffer when read). */
  data: Uint8Array;
}

/** Largest accepted JSON header (100 MB, the reference implementation's limit). */
export const SAFETENSORS_MAX_HEADER = 100_000_000;

/** Options of {@link readSafetensors}. */
export interface ReadSafetensorsOptions {
  /** Upper bound of the header length in bytes (default {@link SAFETENSORS_MAX_HEADER}). */
  maxHeaderBytes?: number;
  /** Receives `__metadata__` when present. */
  metadata?: Map<string, string>;
}

function fail(code: ReferenceModelError["code"], message: string): never {
  throw new ReferenceModelError(code, `safetensors: ${message}`);
}

function dtypeSize(dtype: string): number {
  return Object.hasOwn(SAFETENSORS_DTYPE_SIZES, dtype)
    ? SAFETENSORS_DTYPE_SIZES[dtype as SafetensorsDtype]
    : 0;
}

/**
 * Parses a safetensors buffer. Tensor `data` are views into `buf` (no copy; not necessarily
 * aligned). Checks, in order: at least 8 bytes (TRUNCATED); header length within the limit
 * (HEADER) and within the buffer (TRUNCATED); header is UTF-8 JSON of an object starting with
 * `{` (HEADER); `__metadata__` is an object of strings (HEADER); every entry has a known dtype
 * (DTYPE), a shape of non-negative safe integers (SHAPE), `data_offsets` of two integers with
 * begin <= end <= data length (OFFSETS) and `end - begin == product(shape) * dtype size`
 * (SHAPE); the tensors cover the data section exactly, without overlap or hole (OFFSETS).
 * A `maxHeaderBytes` that is not an integer >= 2 is `RM_BAD_CONFIG`.
 */
export function readSafetensors(
  buf: Uint8Array,
  options: ReadSafetensorsOptions = {},
): Map<string, SafetensorsTensor> {
  const limit = checkInt("maxHeaderBytes", options.maxHeaderBytes ?? SAFETENSORS_MAX_HEADER, 2, 2 ** 53 - 1);
  if (buf.length < 8) fail("RM_SAFETENSORS_TRUNCATED", `${buf.length} bytes, need at least 8`);
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const lo = view.getUint32(0, true);
  const hi = view.getUint32(4, true);
  const n = hi * 4294967296 + lo;
  if (n < 2 || n > limit) fail("RM_SAFETENSORS_HEADER", `header length ${n} outside [2, ${limit}]`);
  if (8 + n > buf.length)
    fail("RM_SAFETENSORS_TRUNCATED", `header length ${n} exceeds ${buf.length - 8} bytes`);
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(buf.subarray(8, 8 + n));
  } catch (cause) {
    throw new ReferenceModelError("RM_SAFETENSORS_HEADER", "safetensors: header is not UTF-8", { cause });
  }
  if (text[0] !== "{") fail("RM_SAFETENSORS_HEADER", "header does not start with '{'");
  let header: unknown;
  try {
    header = JSON.parse(text);
  } catch (cause) {
    throw new ReferenceModelError("RM_SAFETENSORS_HEADER", "safetensors: header is not valid JSON", {
      cause,
    });
  }
  if (header === null || typeof header !== "object" || Array.isArray(header)) {
    fail("RM_SAFETENSORS_HEADER", "header is not a JSON object");
  }
  const dataStart = 8 + n;
  const dataLen = buf.length - dataStart;
  const entries: { name: string; dtype: string; shape: number[]; begin: number; end: number }[] = [];
  for (const [name, raw] of Object.entries(header as Record<string, unknown>)) {
    if (name === "__metadata__") {
      if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
        fail("RM_SAFETENSORS_HEADER", "__metadata__ is not an object");
      }
      for (const [k, v] of Object.entries(raw as Record<string, unknown>)) {
        if (typeof v !== "string") fail("RM_SAFETENSORS_HEADER", `__metadata__.${k} is not a string`);
        options.metadata?.set(k, v);
      }
      continue;
    }
    if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
      fail("RM_SAFETENSORS_HEADER", `tensor "${name}" is not an object`);
    }
    const t = raw as Record<string, unknown>;
    const dtype = t["dtype"];
    if (typeof dtype !== "string" || dtypeSize(dtype) === 0) {
      fail("RM_SAFETENSORS_DTYPE", `tensor "${name}" has unknown dtype ${JSON.stringify(dtype)}`);
    }
    const shape = t["shape"];
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      fail("RM_SAFETENSORS_SHAPE", `tensor "${name}" has invalid shape ${JSON.stringify(shape)}`);
    }
    const offs = t["data_offsets"];
    if (
      !Array.isArray(offs) ||
      offs.length !== 2 ||
      !Number.isSafeInteger(offs[0]) ||
      !Number.isSafeInteger(offs[1])
    ) {
      fail("RM_SAFETENSORS_OFFSETS", `tensor "${name}" has invalid data_offsets ${JSON.stringify(offs)}`);
    }
    const begin = offs[0] as number;
    const end = offs[1] as number;
    if (begin < 0 || begin > end || end > dataLen) {
      fail(
        "RM_SAFETENSORS_OFFSETS",
        `tensor "${name}" data_offsets [${begin}, ${end}] outside [0, ${dataLen}]`,
      );
    }
    let count = 1;
    for (const d of shape as number[]) count *= d;
    const expected = count * dtypeSize(dtype);
    if (!Number.isSafeInteger(expected) || expected !== end - begin) {
      fail(
        "RM_SAFETENSORS_SHAPE",
        `tensor "${name}" shape [${shape.join(", ")}] needs ${expected} bytes, offsets give ${end - begin}`,
      );
    }
    entries.push({ name, dtype, shape: shape as number[], begin, end });
  }
  const sorted = [...entries].sort((x, y) => x.begin - y.begin || x.end - y.end);
  let cursor = 0;
  for (const e of sorted) {
    if (e.begin !== cursor) {
      fail(
        "RM_SAFETENSORS_OFFSETS",
        e.begin < cursor
          ? `tensor "${e.name}" at ${e.begin} overlaps the previous tensor ending at ${cursor}`
          : `hole in data between ${cursor} and ${e.begin} (before tensor "${e.name}")`,
      );
    }
    cursor = e.end;
  }
  if (cursor !== dataLen)
    fail("RM_SAFETENSORS_OFFSETS", `data section has ${dataLen - cursor} trailing bytes`);
  const out = new Map<string, SafetensorsTensor>();
  for (const e of entries) {
    out.set(e.name, {
      dtype: e.dtype,
      shape: e.shape,
      data: buf.subarray(dataStart + e.begin, dataStart + e.end),
    });
  }
  return out;
}

/**
 * Serialises tensors (in map order) with optional string `metadata`. The header is padded with
 * spaces so that the data section starts 8-byte aligned. Throws RM_SAFETENSORS_* for a tensor
 * whose dtype is unknown or whose byte length does not match its shape.
 */
export function writeSafetensors(
  tensors: Map<string, SafetensorsTensor>,
  metadata?: Record<string, string> | Map<string, string>,
): Uint8Array {
  const header: Record<string, unknown> = {};
  if (metadata !== undefined) {
    const md: Record<string, string> = {};
    for (const [k, v] of metadata instanceof Map ? metadata : Object.entries(metadata)) {
      if (typeof v !== "string") fail("RM_SAFETENSORS_HEADER", `metadata ${k} is not a string`);
      md[k] = v;
    }
    header["__metadata__"] = md;
  }
  let offset = 0;
  for (const [name, t] of tensors) {
    if (name === "__metadata__") fail("RM_SAFETENSORS_HEADER", "a tensor cannot be named __metadata__");
    const size = dtypeSize(t.dtype);
    if (size === 0) fail("RM_SAFETENSORS_DTYPE", `tensor "${name}" has unknown dtype ${t.dtype}`);
    let count = 1;
    for (const d of t.shape) {
      if (!Number.isSafeInteger(d) || d < 0)
        fail("RM_SAFETENSORS_SHAPE", `tensor "${name}" has invalid dim ${d}`);
      count *= d;
    }
    if (count * size !== t.data.length) {
      fail(
        "RM_SAFETENSORS_SHAPE",
        `tensor "${name}" shape needs ${count * size} bytes, has ${t.data.length}`,
      );
    }
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + t.data.length] };
    offset += t.data.length;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  const padded = Math.ceil((8 + json.length) / 8) * 8 - 8;
  if (padded !== json.length) {
    const p = new Uint8Array(padded).fill(0x20);
    p.set(json);
    json = p;
  }
  const out = new Uint8Array(8 + json.length + offset);
  const view = new DataView(out.buffer);
  view.setUint32(0, json.length, true);
  view.setUint32(4, 0, true);
  out.set(json, 8);
  let pos = 8 + json.length;
  for (const t of tensors.values()) {
    out.set(t.data, pos);
    pos += t.data.length;
  }
  return out;
}
