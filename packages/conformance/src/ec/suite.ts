/** The encoder-cache modes (EC-CONTRACT). */
export type { EcProducerSuiteOptions } from "./producer.js";
export { EC_PRODUCER_CASES, ecCompatibilityHash, runEcProducerSuite } from "./producer.js";
