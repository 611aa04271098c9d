/**
 * `@tapwire/wire`: the DSPK frame codec of the tapwire remote drafter link (CONTRACT 2, 4-8).
 * @packageDocumentation
 */
export { DEFAULT_MAX_FRAME_BYTES, FrameAccumulator } from "./accumulator.js";
export { fromHex, toHex } from "./bytes.js";
export { checkReplyValues, consumedPositions, validateSampled } from "./check.js";
export {
  APP_HEADER_SIZE,
  AUTH_SIZE,
  CAPABILITY_NAMES,
  Capability,
  DYADIC_ONE,
  ENTRY_FLAG_NAMES,
  ENTRY_FLAGS_MASK,
  EntryFlag,
  FATAL_FRAME_STATUS,
  FRAME_STATUS_NAMES,
  FrameStatus,
  flagNames,
  frameStatusName,
  HELLO_BODY_SIZE,
  HELLO_FLAG_NAMES,
  HELLO_FLAGS_MASK,
  HELLO_REPLY_BODY_SIZE,
  HelloFlag,
  IDENTITY_SIZE,
  MAGIC,
  MAGIC_U32,
  MAX_NUM_SPEC,
  MAX_WINDOW,
  NAME_SIZE,
  OP_NAMES,
  Op,
  opName,
  PING_MAX_BODY,
  REPLY_FLAG_NAMES,
  REQ_ENTRY_SIZE,
  REQ_STATUS_NAMES,
  ReplyFlag,
  ReqStatus,
  ROWS_ALIGN,
  RowDtype,
  reqStatusName,
  SAMPLE_META_SIZE,
  SAMPLE_MODE_NAMES,
  SampleMode,
  STATS_MAX_BODY,
  STEP_PREFIX_SIZE,
  STEP_REPLY_PREFIX_SIZE,
  serialAdd,
  serialNewer,
  TOP_K_MAX,
  USABLE_REQ_STATUS,
  VERSION,
} from "./constants.js";
export { WireError, WireErrorCode } from "./errors.js";
export { decodeHeader, encodeHeader, frame, partialHeader, splitFrame } from "./header.js";
export {
  checkHelloConfig,
  checkHelloReply,
  decodeHello,
  decodeHelloReply,
  encodeHello,
  encodeHelloReply,
  helloAuth,
  verifyHelloAuth,
} from "./hello.js";
export {
  beginStepReply,
  decodeStepReply,
  peekStepReplyShape,
  setReplyWorkerUs,
  stepReplyBodySize,
  stepReplyLayout,
} from "./step-reply.js";
export {
  decodeStepHead,
  decodeStepRequest,
  maxStepBodySize,
  rowsOffsetFor,
  stepRequestBodySize,
  writeStepPrefix,
} from "./step-request.js";
// Public types (one block; see types.ts).
export type {
  DecodeHeaderOptions,
  FrameAccumulatorOptions,
  FrameHeader,
  Hello,
  HelloReply,
  ReplyContext,
  ReplyShape,
  ReqEntry,
  SampleMeta,
  StepLimits,
  StepPrefixParams,
  StepReplyLayout,
  StepReplyViews,
  StepRequest,
  VectorCase,
  VectorReport,
  VectorResult,
} from "./types.js";
export { runVectorCase, runVectors } from "./vectors.js";
