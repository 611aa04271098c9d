/**
 * `@tapwire/transport`: request/response transports close to the socket limit (CONTRACT 3).
 *
 * @packageDocumentation
 */
export type { Endpoint } from "./endpoint.js";
export { formatEndpoint, parseEndpoint, SCHEMES, Scheme } from "./endpoint.js";
export { TransportError, TransportErrorCode } from "./errors.js";
export { listen, makeClient } from "./factory.js";
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
export { createShmArena, ShmArena } from "./shm.js";
