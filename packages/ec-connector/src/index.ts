export type { CacheEntryInfo, EmbeddingCacheOptions } from "./cache.js";
export { EmbeddingCache } from "./cache.js";
export type {
  CompletedXfer,
  ConsumerSessionOptions,
  ConsumerSessionResults,
  XferBlocks,
} from "./consumer-session.js";
export {
  CONSUMER_DEFAULTS,
  ConsumerSession,
  ConsumerXfer,
  XFER_TRANSITIONS,
  XferState,
} from "./consumer-session.js";
export { crc32 } from "./crc.js";
export type { LoopbackDataTransportOptions, LoopbackFault } from "./data/loopback.js";
export { LoopbackDataTransport, LoopbackFabric } from "./data/loopback.js";
export type {
  AgentMetadata,
  DataTransport,
  MemDescriptor,
  ReadOptions,
  XferHandle,
} from "./data/transport.js";
export {
  agentNameOf,
  decodeAgentMetadata,
  decodeMemDescriptor,
  encodeAgentMetadata,
  encodeMemDescriptor,
  XferHandleState,
} from "./data/transport.js";
export type { EcErrorCode } from "./errors.js";
export { EC_ERROR_CODES, EcError } from "./errors.js";
export { EC_METRICS_PREFIX } from "./metrics.js";
export type {
  AdminHandler,
  ControlMessage,
  ControlServer,
  ProducerSessionOptions,
} from "./producer-session.js";
export { PRODUCER_DEFAULTS, ProducerSession } from "./producer-session.js";
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
