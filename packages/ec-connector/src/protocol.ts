import { createHash } from "node:crypto";
import { Decoder, Encoder } from "@msgpack/msgpack";
import { EcError, isIntInRange } from "./errors.js";
import { decodeFlatMap } from "./flat-msgpack.js";
import { fastDecodeXferAck, fastDecodeXferReq, fastEncodeXferAck, fastEncodeXferReq } from "./xfer-codec.js";

/** EC-CONTRACT 2: the connector protocol version carried in every XferReq. */
export const EC_CONNECTOR_VERSION = 2;

/** EC-CONTRACT 3: XferAck status codes. */
export const XferStatus = {
  OK: 0,
  NACK_MISSING: 1,
  NACK_NOT_READY: 2,
  NACK_INCOMPAT: 3,
  NACK_VERSION: 4,
  NACK_INTERNAL: 5,
} as const;
/** One of the {@link XferStatus} values. */
export type XferStatus = (typeof XferStatus)[keyof typeof XferStatus];

/** Status names indexed by value (for logs and metric names). */
export const XFER_STATUS_NAMES: Readonly<Record<XferStatus, string>> = {
  0: "OK",
  1: "NACK_MISSING",
  2: "NACK_NOT_READY",
  3: "NACK_INCOMPAT",
  4: "NACK_VERSION",
  5: "NACK_INTERNAL",
};

/** EC-CONTRACT 3: NACKs that are part of normal operation (logged at info, not warn). */
export const EXPECTED_NACKS: ReadonlySet<number> = new Set([
  XferStatus.NACK_MISSING,
  XferStatus.NACK_NOT_READY,
]);
/** EC-CONTRACT 3: NACKs after which another attempt may be granted. */
export const RETRYABLE_NACKS: ReadonlySet<number> = new Set([XferStatus.NACK_NOT_READY]);

/** EC-CONTRACT 3: the longest string field, in UTF-8 bytes. */
export const MAX_STRING_BYTES = 256;
/**
 * EC-CONTRACT 9.1: largest control message (bytes). ZeroMQ's `maxMessageSize` on every control
 * socket drops a larger one (the peer is disconnected), so it is never buffered.
 */
export const MAX_CONTROL_MESSAGE_BYTES = 64 * 1024;

/** The inputs of the compatibility hash (EC-CONTRACT 2). */
export interface CompatibilityInfo {
  /** Model identifier (e.g. a Hugging Face repo id). */
  modelId: string;
  /** Embedding dtype name (e.g. `"bfloat16"`). */
  dtype: string;
  /** Hidden size of the embeddings. */
  hiddenSize: number;
  /** Cache block size in bytes. */
  blockBytes: number;
}

/**
 * EC-CONTRACT 2: lowercase hex SHA-256 of the canonical JSON array
 * `[connector_version, model_id, dtype, hidden_size, block_bytes]` (canonical = `JSON.stringify`,
 * no whitespace).
 */
export function compatibilityHash(info: CompatibilityInfo, version: number = EC_CONNECTOR_VERSION): string {
  if (typeof info.modelId !== "string")
    throw new EcError("EC_BAD_OPTION", "option modelId: expected a string");
  if (typeof info.dtype !== "string") throw new EcError("EC_BAD_OPTION", "option dtype: expected a string");
  for (const k of ["hiddenSize", "blockBytes"] as const) {
    const v = info[k];
    if (!isIntInRange(v, 1)) {
      throw new EcError("EC_BAD_OPTION", `option ${k}: expected a positive integer, got ${String(v)}`);
    }
  }
  const canonical = JSON.stringify([version, info.modelId, info.dtype, info.hiddenSize, info.blockBytes]);
  return createHash("sha256").update(canonical).digest("hex");
}

/** EC-CONTRACT 3: a transfer request (consumer → producer). */
export interface XferReq {
  /** `mm_hash`: the embedding's content hash (at most 256 UTF-8 bytes). */
  mmHash: string;
  /** `compatibility_hash` (EC-CONTRACT 2). */
  compatibilityHash: string;
  /** `session_id`: the consumer session's id; non-empty for a grant. */
  sessionId: string;
  /** `connector_version` (`EC_CONNECTOR_VERSION`). */
  connectorVersion: number;
  /**
   * Optional key `read_ahead` = 1 (tapwire 1.2 capability, docs/ec-protocol.md 3.2): the consumer
   * can open its read before the ack. Sent only when true; a 1.1 producer ignores it.
   */
  readAhead?: boolean;
  /**
   * Optional key `ack_ahead` = 1 (tapwire 1.2 capability, docs/ec-protocol.md 3.3; sent only with
   * `read_ahead` = 1 and `xfer_id`): the consumer can take this request's ack on its READ_AHEAD's
   * data connection (an ACK frame before DATA). A producer without it ignores the key.
   */
  ackAhead?: boolean;
  /**
   * Optional key `xfer_id` (docs/ec-protocol.md 3.3, an integer 0 ... 2^32 - 1, sent with
   * `ack_ahead`): names this request; a producer that offers `ack_ahead` echoes it in every ack
   * (OK or NACK) to it, so the consumer tells this request's ack from a late one of an earlier
   * request for the same `mm_hash`.
   */
  xferId?: number;
  /**
   * Optional key `data_req` = 1 (tapwire 1.2 capability, docs/ec-protocol.md 3.5; sent only with
   * `ack_ahead` = 1): the consumer can send its requests as XFER_REQ frames on its data
   * connection. A producer without it ignores the key.
   */
  dataReq?: boolean;
}

/** EC-CONTRACT 3: a transfer answer (producer → consumer). On a NACK only mmHash and status mean anything. */
export interface XferAck {
  /**
   * Optional key `read_ahead` = 1 (docs/ec-protocol.md 3.2): the producer's data server accepts
   * READ_AHEAD. Sent only on an OK ack to an XferReq that carried `read_ahead` = 1.
   */
  readAhead?: boolean;
  /**
   * Optional key `ack_ahead` = 1 (docs/ec-protocol.md 3.3): the producer sends the ack of a
   * request carrying `ack_ahead` also as an ACK frame on a READ_AHEAD asking for it. Sent only on
   * an OK ack to an XferReq that carried `ack_ahead` = 1.
   */
  ackAhead?: boolean;
  /** Optional key `xfer_id` (docs/ec-protocol.md 3.3): the request's `xfer_id`, echoed. */
  xferId?: number;
  /**
   * Optional key `data_req` = 1 (docs/ec-protocol.md 3.5): the producer takes XFER_REQ frames on
   * its data connections. Sent only on an OK ack to an XferReq that carried `read_ahead`,
   * `ack_ahead` and `data_req` = 1.
   */
  dataReq?: boolean;
  /** `mm_hash` of the request. */
  mmHash: string;
  /** `status`: OK or a NACK. */
  status: XferStatus;
  /** `session_id` of the request (empty on a NACK). */
  sessionId: string;
  /** `src_block_indices`: the producer's blocks of the entry, in order. */
  srcBlockIndices: number[];
  /** `agent_metadata`: the producer's data-plane agent (EC-CONTRACT 5.3). */
  agentMetadata: Uint8Array;
  /** `mem_descriptor`: the producer's region layout. */
  memDescriptor: Uint8Array;
  /** `nbytes`: bytes of the entry. */
  nbytes: number;
  /** `crc32`: zlib CRC-32 of the entry's `nbytes` bytes. */
  crc32: number;
}

const EMPTY = new Uint8Array(0);
const encoder = new Encoder({ ignoreUndefined: true });
/** The admin reply decoder (trusted direction: the producer's own admin socket; nested stats). */
const replyDecoder = new Decoder({
  maxStrLength: 64 * 1024,
  maxBinLength: 64 * 1024,
  maxArrayLength: 1 << 16,
  maxMapLength: 4096,
  maxExtLength: 0,
});
const ACK_ARRAYS: ReadonlySet<string> = new Set(["src_block_indices"]);

/** Encodes any value as MessagePack (internal). */
export function packMsg(value: unknown): Uint8Array {
  return encoder.encode(value);
}

/**
 * Decodes one control message that must be a flat map (internal; EC-CONTRACT 3, 9.1): see
 * {@link decodeFlatMap}. `arrays` names the keys allowed an integer array (at most `maxArray`).
 */
export function unpackMap(
  bytes: Uint8Array,
  what: string,
  arrays?: ReadonlySet<string>,
  maxArray?: number,
): Record<string, unknown> {
  return decodeFlatMap(bytes, what, {
    ...(arrays === undefined ? {} : { arrays }),
    ...(maxArray === undefined ? {} : { maxArray }),
  });
}

/**
 * Decodes an admin reply (internal): any MessagePack map, nesting allowed. Only for replies from
 * the producer's admin socket, which the admin client chose to trust.
 */
export function unpackReply(bytes: Uint8Array, what: string): Record<string, unknown> {
  let v: unknown;
  try {
    v = replyDecoder.decode(bytes);
  } catch (err) {
    throw new EcError("EC_MALFORMED", `${what}: not valid MessagePack (${(err as Error).message})`, {
      cause: err,
    });
  }
  if (v === null || typeof v !== "object" || Array.isArray(v) || v instanceof Uint8Array) {
    throw new EcError("EC_MALFORMED", `${what}: not a map`);
  }
  return v as Record<string, unknown>;
}

/** A nack answer for `mmHash` (EC-CONTRACT 3: the other fields empty). */
export function nackAck(mmHash: string, status: XferStatus): XferAck {
  return {
    mmHash,
    status,
    sessionId: "",
    srcBlockIndices: [],
    agentMetadata: EMPTY,
    memDescriptor: EMPTY,
    nbytes: 0,
    crc32: 0,
  };
}

/** Encodes an XferReq as the EC-CONTRACT 3 map. */
export function encodeXferReq(req: XferReq): Uint8Array {
  // Issue 23: hand-written (xfer-codec.ts), the same bytes; the generic encoder for what it skips.
  return fastEncodeXferReq(req) ?? genericEncodeXferReq(req);
}

/** {@link encodeXferReq} by the generic encoder (internal; tests compare the bytes). */
export function genericEncodeXferReq(req: XferReq): Uint8Array {
  return encoder.encode({
    mm_hash: req.mmHash,
    compatibility_hash: req.compatibilityHash,
    session_id: req.sessionId,
    connector_version: req.connectorVersion,
    ...(req.readAhead === true ? { read_ahead: 1 } : {}),
    ...(req.ackAhead === true ? { ack_ahead: 1 } : {}),
    ...(req.xferId === undefined ? {} : { xfer_id: req.xferId }),
    ...(req.dataReq === true ? { data_req: 1 } : {}),
  });
}

/** Encodes an XferAck as the EC-CONTRACT 3 map. */
export function encodeXferAck(ack: XferAck): Uint8Array {
  return fastEncodeXferAck(ack) ?? genericEncodeXferAck(ack);
}

/** {@link encodeXferAck} by the generic encoder (internal; tests compare the bytes). */
export function genericEncodeXferAck(ack: XferAck): Uint8Array {
  return encoder.encode({
    mm_hash: ack.mmHash,
    status: ack.status,
    session_id: ack.sessionId,
    src_block_indices: ack.srcBlockIndices,
    agent_metadata: ack.agentMetadata,
    mem_descriptor: ack.memDescriptor,
    nbytes: ack.nbytes,
    crc32: ack.crc32,
    ...(ack.readAhead === true ? { read_ahead: 1 } : {}),
    ...(ack.ackAhead === true ? { ack_ahead: 1 } : {}),
    ...(ack.xferId === undefined ? {} : { xfer_id: ack.xferId }),
    ...(ack.dataReq === true ? { data_req: 1 } : {}),
  });
}

/** Decodes an XferReq strictly (EC-CONTRACT 3); throws `EC_MALFORMED` naming the first problem. */
export function decodeXferReq(bytes: Uint8Array): XferReq {
  // Issue 23: the canonical valid request decodes on the fast path (xfer-codec.ts); anything else
  // (including every malformed message) goes through the strict decoder below, with its errors.
  return fastDecodeXferReq(bytes) ?? strictDecodeXferReq(bytes);
}

/** {@link decodeXferReq} without its fast path (internal; tests compare the two). */
export function strictDecodeXferReq(bytes: Uint8Array): XferReq {
  const m = unpackMap(bytes, "XferReq");
  return {
    mmHash: str(m, "mm_hash", "XferReq"),
    compatibilityHash: str(m, "compatibility_hash", "XferReq"),
    sessionId: str(m, "session_id", "XferReq"),
    connectorVersion: int(m, "connector_version", "XferReq", Number.MIN_SAFE_INTEGER),
    ...(optionalFlag(m, "read_ahead") ? { readAhead: true } : {}),
    ...(optionalFlag(m, "ack_ahead") ? { ackAhead: true } : {}),
    ...optionalXferId(m),
    ...(optionalFlag(m, "data_req") ? { dataReq: true } : {}),
  };
}

/**
 * docs/ec-protocol.md 3.3: the optional `xfer_id`, an integer 0 ... 2^32 - 1; any other value is
 * as if absent (an optional key never makes a message malformed).
 */
export function optionalXferId(m: Record<string, unknown>): { xferId?: number } {
  const v = m["xfer_id"];
  return Object.hasOwn(m, "xfer_id") && isIntInRange(v, 0, 0xffff_ffff) ? { xferId: v as number } : {};
}

/** An optional capability key: absent or any value but the integer 1 means "no" (never malformed). */
function optionalFlag(m: Record<string, unknown>, key: string): boolean {
  return Object.hasOwn(m, key) && m[key] === 1;
}

/**
 * Decodes an XferAck strictly (EC-CONTRACT 3); `maxBlocks` is the receiver's cache size (more
 * block indices than that is malformed). `mm_hash` and `status` are always required; the other
 * keys are required on OK and, on a NACK, optional but type-checked when present.
 */
export function decodeXferAck(bytes: Uint8Array, maxBlocks: number): XferAck {
  // Issue 23: the fast path (xfer-codec.ts) takes only what the strict path below would accept.
  return fastDecodeXferAck(bytes, maxBlocks) ?? strictDecodeXferAck(bytes, maxBlocks);
}

/** {@link decodeXferAck} without its fast path (internal; tests compare the two). */
export function strictDecodeXferAck(bytes: Uint8Array, maxBlocks: number): XferAck {
  // The array is bounded by the message (64 KiB) here; its length against the cache is checked below.
  const m = unpackMap(bytes, "XferAck", ACK_ARRAYS);
  const mmHash = str(m, "mm_hash", "XferAck");
  const status = int(m, "status", "XferAck", 0);
  if (status > XferStatus.NACK_INTERNAL)
    throw new EcError("EC_MALFORMED", `XferAck: unknown status ${status}`);
  const need = status === XferStatus.OK;
  const has = (k: string) => need || Object.hasOwn(m, k);
  const ack: XferAck = nackAck(mmHash, status as XferStatus);
  if (has("session_id")) ack.sessionId = str(m, "session_id", "XferAck");
  if (has("src_block_indices")) {
    const v = m["src_block_indices"];
    if (!Array.isArray(v)) throw new EcError("EC_MALFORMED", "XferAck: src_block_indices is not an array");
    if (v.length > maxBlocks) {
      throw new EcError("EC_MALFORMED", `XferAck: ${v.length} block indices exceed the cache's ${maxBlocks}`);
    }
    for (let i = 0; i < v.length; i++) {
      const b = v[i];
      if (!isIntInRange(b, 0)) {
        throw new EcError("EC_MALFORMED", `XferAck: src_block_indices[${i}] is not a non-negative integer`);
      }
    }
    ack.srcBlockIndices = v as number[];
  }
  if (has("agent_metadata")) ack.agentMetadata = bin(m, "agent_metadata", "XferAck");
  if (has("mem_descriptor")) ack.memDescriptor = bin(m, "mem_descriptor", "XferAck");
  if (has("nbytes")) ack.nbytes = int(m, "nbytes", "XferAck", 0);
  if (has("crc32")) ack.crc32 = int(m, "crc32", "XferAck", 0, 0xffffffff);
  if (need && optionalFlag(m, "read_ahead")) ack.readAhead = true;
  if (need && optionalFlag(m, "ack_ahead")) ack.ackAhead = true;
  if (need && optionalFlag(m, "data_req")) ack.dataReq = true;
  const id = optionalXferId(m);
  if (id.xferId !== undefined) ack.xferId = id.xferId;
  return ack;
}

/** Reads a required string field of at most {@link MAX_STRING_BYTES} UTF-8 bytes (internal). */
export function str(
  m: Record<string, unknown>,
  key: string,
  what: string,
  maxBytes = MAX_STRING_BYTES,
): string {
  if (!Object.hasOwn(m, key)) throw new EcError("EC_MALFORMED", `${what}: missing ${key}`);
  const v = m[key];
  if (typeof v !== "string") throw new EcError("EC_MALFORMED", `${what}: ${key} is not a string`);
  if (v.length > maxBytes || Buffer.byteLength(v, "utf8") > maxBytes) {
    throw new EcError("EC_MALFORMED", `${what}: ${key} is longer than ${maxBytes} bytes`);
  }
  return v;
}

/** Reads a required integer field in [min, max]; booleans are not integers (internal). */
export function int(
  m: Record<string, unknown>,
  key: string,
  what: string,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): number {
  if (!Object.hasOwn(m, key)) throw new EcError("EC_MALFORMED", `${what}: missing ${key}`);
  const v = m[key];
  if (typeof v !== "number" || !Number.isSafeInteger(v)) {
    throw new EcError("EC_MALFORMED", `${what}: ${key} is not an integer`);
  }
  if (v < min || v > max) throw new EcError("EC_MALFORMED", `${what}: ${key} ${v} outside [${min}, ${max}]`);
  return v;
}

/** Reads a required binary field (internal). */
export function bin(m: Record<string, unknown>, key: string, what: string): Uint8Array {
  if (!Object.hasOwn(m, key)) throw new EcError("EC_MALFORMED", `${what}: missing ${key}`);
  const v = m[key];
  if (!(v instanceof Uint8Array)) throw new EcError("EC_MALFORMED", `${what}: ${key} is not binary`);
  return v;
}
