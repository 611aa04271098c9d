/**
 * Private test helpers shared by the tapwire packages: a fault-injecting TCP proxy, a fake
 * clock, unique endpoints for every transport scheme, TLS credentials and child-process helpers.
 * Depends on no other @tapwire package.
 * @packageDocumentation
 */

export type { AttackTarget, Flood, OpenManyOptions, SlowlorisOptions, SlowlorisResult } from "./attack.js";
export {
  announce,
  attackTarget,
  MAX_ATTACK_CONNECTIONS,
  MAX_ATTACK_MS,
  openMany,
  slowloris,
} from "./attack.js";
export type { EchoServer } from "./echo.js";
export { startEchoServer } from "./echo.js";
export { TestingError, TestingErrorCode } from "./errors.js";
export type { EtcdChild, StartEtcdOptions } from "./etcd.js";
export { ETCD_BIN, startEtcd } from "./etcd.js";
export type { FakeTimer } from "./fake-clock.js";
export { FakeClock } from "./fake-clock.js";
export type {
  Fault,
  FaultDirection,
  FaultProxy,
  FaultProxyOptions,
  FaultProxyStats,
  LinkImpairment,
  ProxyTarget,
} from "./fault-proxy.js";
export { startFaultProxy } from "./fault-proxy.js";
export { interleaved } from "./interleave.js";
export type { LinkSpec } from "./link-spec.js";
export {
  DEFAULT_STALL_MS,
  formatLinkSpec,
  LINK_NONE,
  LINK_SPEC_KEYS,
  linkNeedsRelay,
  parseLinkSpec,
  tbfBurstBytes,
} from "./link-spec.js";
export type { DevCounters, Namespace, VethEnd } from "./netns.js";
export {
  addVethPair,
  createNamespace,
  devCounters,
  listNamespaces,
  NETNS_PREFIX,
  netnsCommand,
  removeNamespace,
  removeStaleNamespaces,
  requireRoot,
  runNetCommand,
  shapeEgress,
  TEST_NET,
} from "./netns.js";
export type { TransportScheme } from "./paths.js";
export {
  endpointFor,
  freePort,
  MAX_UNIX_PATH_BYTES,
  transportMatrix,
  transportSchemes,
  uniqueSocketPath,
} from "./paths.js";
export type { ProcessMemory, RssWatch, WaitUntilOptions } from "./proc.js";
export { fdCountOf, isAlive, memoryOf, rssOf, waitUntil, watchRss } from "./proc.js";
export type { PromFamily, PromSample, PromtoolResult } from "./prom.js";
export { parsePrometheus, promtoolCheck, sampleValue, scrape } from "./prom.js";
export type { Relay, RelayForwardStats, RelayOptions } from "./relay.js";
export { relayLeafPort, startRelay } from "./relay.js";
export type { ChildHandle, ExitInfo, OutputLine, ProcessLimits, SpawnBinOptions } from "./spawn.js";
export { killAllChildren, spawnBin, withFdLimit } from "./spawn.js";
export type { SupervisedChild, SupervisedSpec, Supervisor } from "./supervisor.js";
export { startSupervisor } from "./supervisor.js";
export type { TlsCredentials } from "./tls.js";
export { makeTlsCredentials, testTlsCredentials } from "./tls.js";
export type { StarLeaf, StarTopology, StarTopologyOptions, StarTopologyPlan } from "./topology.js";
export { createStarTopology, planLeaf } from "./topology.js";
