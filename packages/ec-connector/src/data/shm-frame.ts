// Frames of the shm data plane (issue 23, docs/ec-protocol.md 3.4): the doorbell on the unix
// socket. Same framing as 3.1 (u32 LE body_len, then op), new ops 0x07-0x0b (0x06 is 3.3's ACK).
import { EcError } from "../errors.js";
import { LEN_BYTES } from "./frame.js";

/** Op codes of the shm capability (docs/ec-protocol.md 3.4). */
export const SHM_OPS = { attach: 0x07, offer: 0x08, attached: 0x09, chunk: 0x0a, release: 0x0b } as const;
/** Version an SHM_ATTACH carries. */
export const SHM_DATA_VERSION = 1;
/** Most slots of a ring, and the bounds of a slot's size (a 4 KiB page multiple). */
export const SHM_LIMITS = { maxSlots: 16, minSlotBytes: 64 * 1024, maxSlotBytes: 64 * 1024 * 1024 } as const;
/** Longest SHM_OFFER text: a file name (status 0) or a refusal message (status 1), bytes. */
export const MAX_OFFER_TEXT = 1016;

/**
 * SHM_OFFER statuses. REGION (docs/ec-protocol.md 3.4 "Shared region"): only to an SHM_ATTACH with
 * the `region` flag; the text is `<pid>/<fd>` of the producer's shared cache region, the geometry
 * the window (chunks in flight) and the largest chunk.
 */
export const OfferStatus = { OFFERED: 0, REFUSED: 1, REGION: 2 } as const;
/** SHM_ATTACH flags: bit 0, the reader can map a producer's shared region (3.4 "Shared region"). */
export const AttachFlags = { REGION: 1 } as const;
/** SHM_ATTACHED statuses. */
export const AttachedStatus = { MAPPED: 0, DECLINED: 1 } as const;

/** Frames of the shm capability a server receives. */
export type ShmToServer =
  | { readonly op: "attach"; readonly version: number; readonly flags: number }
  | { readonly op: "attached"; readonly status: number }
  | { readonly op: "release"; readonly slot: number; readonly seq: number };
/** Frames of the shm capability a reader receives. */
export type ShmToReader =
  | {
      readonly op: "offer";
      readonly status: number;
      readonly slots: number;
      readonly slotBytes: number;
      readonly text: string;
    }
  | {
      readonly op: "chunk";
      readonly slot: number;
      readonly seq: number;
      readonly offset: number;
      readonly length: number;
    };

function malformed(what: string): never {
  throw new EcError("EC_MALFORMED", `shm data frame: ${what}`);
}

function frame(bodyLen: number, op: number): Buffer {
  const b = Buffer.alloc(LEN_BYTES + bodyLen);
  b.writeUInt32LE(bodyLen, 0);
  b[4] = op;
  return b;
}

/** SHM_ATTACH (reader → server): asks for a ring (or, with `flags` REGION, the shared region). */
export function encodeAttach(version = SHM_DATA_VERSION, flags = 0): Buffer {
  const b = frame(4, SHM_OPS.attach);
  b[5] = flags;
  b.writeUInt16LE(version, 6);
  return b;
}

/** SHM_OFFER (server → reader): the ring's file and geometry, or why there is none. */
export function encodeOffer(status: number, slots: number, slotBytes: number, text: string): Buffer {
  const t = Buffer.from(text.length > MAX_OFFER_TEXT ? text.slice(0, MAX_OFFER_TEXT) : text, "utf8");
  const tl = Math.min(t.length, MAX_OFFER_TEXT);
  const b = frame(12 + tl, SHM_OPS.offer);
  b[5] = status;
  b.writeUInt16LE(slots, 6);
  b.writeUInt32LE(slotBytes, 8);
  b.writeUInt16LE(tl, 12);
  t.copy(b, 16, 0, tl);
  return b;
}

/** SHM_ATTACHED (reader → server): the reader mapped the ring (0) or will not use it (1). */
export function encodeAttached(status: number): Buffer {
  const b = frame(4, SHM_OPS.attached);
  b[5] = status;
  return b;
}

/** SHM_CHUNK (server → reader): `length` bytes of the current DATA lie at `offset` of the ring. */
export function encodeChunk(slot: number, seq: number, offset: number, length: number): Buffer {
  const b = frame(16, SHM_OPS.chunk);
  b.writeUInt16LE(slot, 6);
  b.writeUInt32LE(seq, 8);
  b.writeUInt32LE(offset, 12);
  b.writeUInt32LE(length, 16);
  return b;
}

/** SHM_RELEASE (reader → server): the chunk `seq` in `slot` was consumed; the server may reuse it. */
export function encodeRelease(slot: number, seq: number): Buffer {
  const b = frame(8, SHM_OPS.release);
  b.writeUInt16LE(slot, 6);
  b.writeUInt32LE(seq, 8);
  return b;
}

/** True when a body's op is one of the shm capability's. */
export function isShmOp(op: number | undefined): boolean {
  return op !== undefined && op >= SHM_OPS.attach && op <= SHM_OPS.release;
}

function view(body: Uint8Array): Buffer {
  return Buffer.from(body.buffer, body.byteOffset, body.length);
}

function exact(b: Buffer, n: number, what: string): void {
  if (b.length !== n) malformed(`${what} body_len ${b.length}, expected ${n}`);
  if (b[1] !== 0 && what !== "SHM_ATTACHED" && what !== "SHM_ATTACH")
    malformed(`${what} reserved byte ${b[1]}`);
}

/** Decodes an shm frame body (op first) a server receives; throws `EC_MALFORMED`. */
export function decodeShmToServer(body: Uint8Array): ShmToServer {
  const b = view(body);
  switch (b[0]) {
    case SHM_OPS.attach:
      exact(b, 4, "SHM_ATTACH");
      if (((b[1] as number) & ~AttachFlags.REGION) !== 0) malformed(`SHM_ATTACH flags ${b[1]}`);
      return { op: "attach", version: b.readUInt16LE(2), flags: b[1] as number };
    case SHM_OPS.attached: {
      exact(b, 4, "SHM_ATTACHED");
      const status = b[1] as number;
      if (status > AttachedStatus.DECLINED || b.readUInt16LE(2) !== 0)
        malformed(`SHM_ATTACHED status ${status}`);
      return { op: "attached", status };
    }
    case SHM_OPS.release:
      exact(b, 8, "SHM_RELEASE");
      return { op: "release", slot: b.readUInt16LE(2), seq: b.readUInt32LE(4) };
    default:
      return malformed(`op 0x${(b[0] ?? 0).toString(16)} is not for a server`);
  }
}

/** Decodes an shm frame body (op first) a reader receives; throws `EC_MALFORMED`. */
export function decodeShmToReader(body: Uint8Array): ShmToReader {
  const b = view(body);
  switch (b[0]) {
    case SHM_OPS.offer: {
      if (b.length < 12) malformed(`SHM_OFFER body_len ${b.length}`);
      const status = b[1] as number;
      const tl = b.readUInt16LE(8);
      if (status > OfferStatus.REGION) malformed(`SHM_OFFER status ${status}`);
      if (tl > MAX_OFFER_TEXT || b.length !== 12 + tl) malformed(`SHM_OFFER text_len ${tl}`);
      if (b.readUInt16LE(10) !== 0) malformed("SHM_OFFER reserved field");
      const slots = b.readUInt16LE(2);
      const slotBytes = b.readUInt32LE(4);
      if (
        status !== OfferStatus.REFUSED &&
        (slots < 1 ||
          slots > SHM_LIMITS.maxSlots ||
          slotBytes < SHM_LIMITS.minSlotBytes ||
          slotBytes > SHM_LIMITS.maxSlotBytes ||
          slotBytes % 4096 !== 0)
      )
        malformed(`SHM_OFFER ring of ${slots} x ${slotBytes} bytes`);
      return { op: "offer", status, slots, slotBytes, text: b.toString("utf8", 12, 12 + tl) };
    }
    case SHM_OPS.chunk:
      exact(b, 16, "SHM_CHUNK");
      return {
        op: "chunk",
        slot: b.readUInt16LE(2),
        seq: b.readUInt32LE(4),
        offset: b.readUInt32LE(8),
        length: b.readUInt32LE(12),
      };
    default:
      return malformed(`op 0x${(b[0] ?? 0).toString(16)} is not for a reader`);
  }
}
