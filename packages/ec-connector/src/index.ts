export { EcAdminClient } from "./admin.js";
export type { CacheEntryInfo, EmbeddingCacheOptions } from "./cache.js";
export { EmbeddingCache } from "./cache.js";
export type {
  ConnectorStepResults,
  ConsumerConnectorOptions,
  ControlClient,
  CreateConsumerConnectorOptions,
  FailedRequest,
  Placement,
  RetryPolicy,
} from "./connector.js";
export { ConsumerConnector, RETRY_DEFAULTS } from "./connector.js";
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
export type { Crc32Fn, Crc32Impl, Crc32Info, IsalCrc32 } from "./crc.js";
export {
  CHECKSUM_THREAD_MAX_INLINE_GBPS,
  CRC32_ENV,
  CRC32_IMPLS,
  checksumThreadUsed,
  crc32,
  crc32Info,
  crc32InlineGbps,
  ISAL_MIN_BYTES,
  loadCrc32,
} from "./crc.js";
export type { CurveClientOptions, CurveKeyPair, CurveServerOptions } from "./curve.js";
export { newCurveKeyPair } from "./curve.js";
export type { LoopbackDataTransportOptions, LoopbackFault } from "./data/loopback.js";
export { LoopbackDataTransport, LoopbackFabric } from "./data/loopback.js";
export type {
  DataTlsOptions,
  ShmDataOptions,
  SocketDataTransportOptions,
  SocketFault,
} from "./data/socket.js";
export {
  DATA_SERVER_DEFAULTS,
  MAX_DATA_FRAME_BYTES,
  SHM_DATA_DEFAULTS,
  SocketDataTransport,
} from "./data/socket.js";
export type { SourceRuns } from "./data/source-runs.js";
export { recordSourceRun, sourceRunsMatch } from "./data/source-runs.js";
export type {
  AgentMetadata,
  DataTransport,
  MemDescriptor,
  ReadOptions,
  XferHandle,
  XferRequestAnswer,
  XferRequestHandler,
} from "./data/transport.js";
export {
  agentNameOf,
  decodeAgentMetadata,
  decodeMemDescriptor,
  encodeAgentMetadata,
  encodeMemDescriptor,
  XferHandleState,
} from "./data/transport.js";
export type {
  DirectoryChange,
  DirectorySource,
  EcDirectoryOptions,
  ProducerRecord,
  ProducerViewInfo,
} from "./directory.js";
export { EcDirectory, staticSource } from "./directory.js";
export type { EcErrorCode } from "./errors.js";
export { EC_ERROR_CODES, EcError } from "./errors.js";
export type { ProducerEventsOptions, ResidencyEventsOptions } from "./events.js";
export { EVENTS_DEFAULTS, EVENTS_LIMITS, EventKind, ResidencyEvents } from "./events.js";
export type { InboundDrop, InboundLimits } from "./inbound.js";
export { INBOUND_DEFAULTS, InboundGate, inboundLimits } from "./inbound.js";
export { EC_METRICS_PREFIX } from "./metrics.js";
export type { EcProducerOptions, EncodeResult } from "./producer.js";
export {
  DTYPE_BYTES,
  EC_PRODUCER_DEFAULTS,
  EcProducer,
  isLoopbackEndpoint,
  PRODUCER_HEARTBEAT,
} from "./producer.js";
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
export type { ReplayRequest, ResidencyMessage, ViewSink } from "./residency-view.js";
export { decodeResidencyMessage, ResidencyView } from "./residency-view.js";
export { syntheticEmbedding, writeSyntheticEmbedding } from "./synthetic.js";
export type { DealerOptions, HeartbeatOptions, RouterOptions } from "./zmq.js";
export { HEARTBEAT_DEFAULTS, ZmqDealerClient, ZmqRouterServer } from "./zmq.js";
