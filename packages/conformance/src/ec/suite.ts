/** The encoder-cache modes (EC-CONTRACT). */

export type { EcConsumerSuiteOptions } from "./consumer.js";
export { crc32, runEcConsumerSuite } from "./consumer.js";
export type { EcEventsSuiteOptions } from "./events.js";
export { runEcEventsSuite } from "./events.js";
export type { EcProducerSuiteOptions } from "./producer.js";
export { ecCompatibilityHash, runEcProducerSuite } from "./producer.js";
