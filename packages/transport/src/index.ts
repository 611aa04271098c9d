/**
 * `@tapwire/transport`: request/response transports close to the socket limit (CONTRACT 3).
 *
 * @packageDocumentation
 */

export { copyTargetBytes } from "./aligned.js";
export type { Endpoint } from "./endpoint.js";
export { formatEndpoint, parseEndpoint, SCHEMES, Scheme } from "./endpoint.js";
export { TransportError, TransportErrorCode } from "./errors.js";
export { listen, makeClient } from "./factory.js";
// Socket buffer sizes through koffi when installed (a no-op without it), shared with
// @tapwire/ec-connector's data server (one owner of the binding: native.ts).
export { setNativeKoffiForTest } from "./native.js";
export type {
  ClientOptions,
  ClientTlsOptions,
  ConnInfo,
  Handler,
  OnOversize,
  ReceiveInto,
  ReceivePlan,
  Reply,
  RpcClient,
  RpcServer,
  ServerOptions,
  ServerTlsOptions,
} from "./options.js";
export {
  DEFAULT_CONNECT_TIMEOUT_MS,
  DEFAULT_MAX_MESSAGE_BYTES,
  OVERSIZE_HEAD_WAIT_MS,
  TlsFailureReason,
} from "./options.js";
export type { Libc, ShmSpaceWords } from "./shm.js";
// The shm session-file rules, shared with @tapwire/ec-connector's shm data plane (one owner).
export {
  attachSessionFile,
  bindLibc,
  createSessionFile,
  createShmArena,
  createUnlinkedShmFile,
  DEFAULT_SHM_DIR,
  ShmArena,
  ShmRange,
  sweepStaleShmFiles,
} from "./shm.js";
export { setSocketBuffer, socketBuffer } from "./sockopt.js";
