/**
 * `@tapwire/drafter-onnx`: a drafter for `@tapwire/worker` on ONNX Runtime. A draft head that
 * follows the signature of docs/onnx-drafter.md (exported from PyTorch, or from the reference
 * head with {@link exportReferenceHead}) is served with batched, allocation-free drafting,
 * greedy and TOP32 (CONTRACT 8).
 * @packageDocumentation
 */

export type { OnnxDrafterOptions } from "./drafter.js";
export { ExecutionProvider, GraphOptimization, OnnxDrafter } from "./drafter.js";
export { OnnxDrafterError, OnnxDrafterErrorCode } from "./errors.js";
export type { ExportOptions } from "./export.js";
export { exportReferenceHead } from "./export.js";
export type { IdentityRule, ModelIdentities } from "./identity.js";
export { identityRule, initializerTensors, modelIdentities } from "./identity.js";
export type { ModelInfo } from "./model.js";
export { decodeModel, inspectModel } from "./model.js";
export {
  DEFAULT_DRAFTER_DOMAIN,
  DEFAULT_MARKOV_DOMAIN,
  DEFAULT_MARKOV_PREFIX,
  Input,
  Meta,
  Output,
  RESERVED_PREFIX,
  SIGNATURE_VERSION,
  TOP32,
} from "./signature.js";

/** The npm name of this package. */
export const PACKAGE_NAME = "@tapwire/drafter-onnx";
