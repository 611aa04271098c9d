/**
 * The ONNX head signature (docs/onnx-drafter.md): the names, element types and shapes of the
 * inputs and outputs a draft head must have, and the metadata entries the drafter reads and the
 * worker announces in its HelloReply (CONTRACT 6.1).
 */

/** Version of the signature written to and required in `tapwire.signature`. */
export const SIGNATURE_VERSION = "1";

/** Input names of the signature. */
export const Input = {
  /** `uint16[batch, window_rows, num_taps, hidden]`: bf16 bits of the last rows, right-aligned, zero-padded. */
  ROWS: "rows",
  /** `int64[batch]`: rows the entry's window holds (CONTRACT 7.2 `held`, at most W). */
  ROW_COUNT: "row_count",
  /** `int64[batch]`: the anchor token (CONTRACT 2). */
  ANCHOR_TOKEN: "anchor_token",
  /** `int64[batch]`: the token drafted at `position - 1` (the anchor token at position 0). */
  PREV_TOKEN: "prev_token",
  /** `int64[1]`: the draft position of this run, 0-based, the same for the whole batch. */
  POSITION: "position",
  /** Optional `float32[batch, state_size]`: `next_state` of the previous position (zeros at position 0). */
  STATE: "state",
  /** Optional `int64[1]`: how many top logits to return (2 in greedy batches, 32 when sampling). */
  TOP_K: "top_k",
} as const;

/** Output names of the signature. */
export const Output = {
  /** `float32[batch, vocab]`: logits of this position (alternative to the top pair). */
  LOGITS: "logits",
  /** `float32[batch, K]`: the K largest logits, descending. */
  TOP_LOGITS: "top_logits",
  /** `int64[batch, K]`: their token ids (equal logits: lower id first). */
  TOP_IDS: "top_ids",
  /** `float32[batch]`: the confidence head's top-1 probability, in [0, 1] (CONTRACT 6.3). */
  CONFIDENCE: "confidence",
  /** `float32[batch, state_size]`, exactly when the model has the `state` input. */
  NEXT_STATE: "next_state",
} as const;

/** Metadata keys (`ModelProto.metadata_props`). */
export const Meta = {
  SIGNATURE: "tapwire.signature",
  WINDOW: "tapwire.window",
  NUM_SPEC: "tapwire.num_spec",
  VOCAB_SIZE: "tapwire.vocab_size",
  NUM_TAPS: "tapwire.num_taps",
  HIDDEN: "tapwire.hidden",
  /** Domain tag of the drafter identity (default {@link DEFAULT_DRAFTER_DOMAIN}). */
  DRAFTER_DOMAIN: "tapwire.identity.drafter_domain",
  /** Domain tag of the Markov identity (default {@link DEFAULT_MARKOV_DOMAIN}). */
  MARKOV_DOMAIN: "tapwire.identity.markov_domain",
  /** Initializer-name prefix of the Markov head (default {@link DEFAULT_MARKOV_PREFIX}). */
  MARKOV_PREFIX: "tapwire.identity.markov_prefix",
  /** Optional: the drafter identity as 64 hex digits; checked against the initializers at load. */
  DRAFTER_IDENTITY: "tapwire.drafter_identity",
  /** Optional: the Markov identity as 64 hex digits; checked against the initializers at load. */
  MARKOV_IDENTITY: "tapwire.markov_identity",
} as const;

/** Default domain tag of the drafter identity. */
export const DEFAULT_DRAFTER_DOMAIN = "tapwire/onnx-drafter/v1";
/** Default domain tag of the Markov identity. */
export const DEFAULT_MARKOV_DOMAIN = "tapwire/onnx-markov/v1";
/** Default initializer-name prefix of the Markov head. */
export const DEFAULT_MARKOV_PREFIX = "markov.";
/** Initializers whose names start with this are signature plumbing (tables) and in no identity. */
export const RESERVED_PREFIX = "tapwire.";
/** Top logits a TOP32-capable model returns per position at least (CONTRACT 8). */
export const TOP32 = 32;
