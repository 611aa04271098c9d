// The public types, gathered so that index.ts can export them in one block.
export type { FrameAccumulatorOptions } from "./accumulator.js";
export type { EntryValueContext, ReplyContext } from "./check.js";
export type { DecodeHeaderOptions, FrameHeader, HeaderPeek } from "./header.js";
export type { Hello, HelloReply } from "./hello.js";
export type { ReplyShape, StepReplyLayout, StepReplyViews } from "./step-reply.js";
export type {
  ReqEntry,
  SampleMeta,
  StepLimits,
  StepPrefix,
  StepPrefixParams,
  StepRequest,
} from "./step-request.js";
export type { VectorCase, VectorReport, VectorResult } from "./vectors.js";
