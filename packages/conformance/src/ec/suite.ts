/** The encoder-cache modes (EC-CONTRACT). */

export type { EcConsumerSuiteOptions } from "./consumer.js";
export { crc32, EC_CONSUMER_CASES, runEcConsumerSuite } from "./consumer.js";
export type { EcProducerSuiteOptions } from "./producer.js";
export { EC_PRODUCER_CASES, ecCompatibilityHash, runEcProducerSuite } from "./producer.js";
