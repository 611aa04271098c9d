/**
 * `@tapwire/discovery`: member discovery for tapwire pools (CONTRACT 12.2). {@link etcdMembers}
 * (an etcd watch of a prefix) and {@link staticMembers} are member sources for
 * `@tapwire/client`'s `WorkerPool`; {@link register} keeps a server's record under an etcd lease.
 * {@link etcdDirectorySource} feeds `@tapwire/ec-connector`'s `EcDirectory` with the encoders of a
 * prefix (issue 22). The record schema (version {@link RECORD_SCHEMA_VERSION}) is documented in the README.
 * @packageDocumentation
 */

export type {
  EncoderDirectoryRecord,
  EncoderDirectorySource,
  EtcdDirectorySource,
  EtcdDirectorySourceOptions,
} from "./directory-source.js";
export { directoryRecordOf, etcdDirectorySource } from "./directory-source.js";
export type { DiscoveryErrorCode } from "./errors.js";
export { DISCOVERY_ERROR_CODES, DiscoveryError } from "./errors.js";
export type { MemberRecord, RecordInput, RecordKind, ResidencyEndpoints } from "./record.js";
export {
  compatHash,
  DEFAULT_PREFIX,
  encodeRecord,
  MAX_RECORD_BYTES,
  makeRecord,
  newIncarnation,
  parseRecord,
  RECORD_KINDS,
  RECORD_SCHEMA_VERSION,
  recordKey,
} from "./record.js";
export type { RegisterOptions, Registration } from "./register.js";
export { REGISTER_DEFAULTS, register } from "./register.js";
export type {
  EtcdMemberSource,
  EtcdMembersOptions,
  MemberCompat,
  MemberInfo,
  MemberSource,
} from "./source.js";
export { ETCD_MEMBERS_DEFAULTS, etcdMembers, memberInfoOf, staticMembers } from "./source.js";
export type { DiscoveryLogger } from "./url.js";
export { etcdHosts, silentLogger } from "./url.js";
