/**
 * `@tapwire/conformance`: a conformance tester for CONTRACT (drafter workers and rank-0 clients)
 * and EC-CONTRACT (encoder-cache producers and consumers), modelled on h2spec and the Autobahn
 * testsuite. It builds and parses every frame itself from the contracts' tables (only
 * `@tapwire/wire`'s constants are shared) and talks over node:net, node:tls and zeromq directly.
 * @packageDocumentation
 */

export type { CaseInfo, Mode } from "./cases.js";
export { listCases } from "./cases.js";
export type { ClientSuiteOptions } from "./client/suite.js";
export { runClientSuite } from "./client/suite.js";
export type { Endpoint, RawConn, Received, TlsClientOptions } from "./conn.js";
export { connect, MAX_REPLY_BYTES, parseEndpoint } from "./conn.js";
export type { EcConsumerSuiteOptions, EcEventsSuiteOptions, EcProducerSuiteOptions } from "./ec/suite.js";
export {
  crc32,
  ecCompatibilityHash,
  runEcConsumerSuite,
  runEcEventsSuite,
  runEcProducerSuite,
} from "./ec/suite.js";
export { ConformanceError, ConformanceErrorCode } from "./errors.js";
export type { RunReport } from "./report.js";
export { formatJunit, formatText, makeReport, totalsOf } from "./report.js";
export type { CaseDef, CaseResult, RunOptions } from "./runner.js";
export { CaseCheck, caseFilter, runCases, sectionOf, Verdict } from "./runner.js";
export type { ShmClientOptions } from "./shm.js";
export type { FramingCase } from "./worker/cases-framing.js";
export { framingVectors } from "./worker/cases-framing.js";
export type { WorkerSuiteOptions } from "./worker/context.js";
export type { SharedOptions } from "./worker/shared-suite.js";
export { runWorkerSharedSuite } from "./worker/shared-suite.js";
export { runWorkerSuite } from "./worker/suite.js";
