export type { CacheEntryInfo, EmbeddingCacheOptions } from "./cache.js";
export { EmbeddingCache } from "./cache.js";
export { crc32 } from "./crc.js";
export type { EcErrorCode } from "./errors.js";
export { EC_ERROR_CODES, EcError } from "./errors.js";
export type { CompatibilityInfo, XferAck, XferReq } from "./protocol.js";
export {
  compatibilityHash,
  decodeXferAck,
  decodeXferReq,
  EC_CONNECTOR_VERSION,
  EXPECTED_NACKS,
  encodeXferAck,
  encodeXferReq,
  MAX_CONTROL_MESSAGE_BYTES,
  MAX_STRING_BYTES,
  nackAck,
  RETRYABLE_NACKS,
  XFER_STATUS_NAMES,
  XferStatus,
} from "./protocol.js";
export { syntheticEmbedding, writeSyntheticEmbedding } from "./synthetic.js";
