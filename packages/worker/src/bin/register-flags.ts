/**
 * The discovery flags of `tapwire-worker` (issue 21): spread into the one FLAGS table of
 * flags.ts, kept in their own file so that they stay one line there.
 */
import type { FlagSpec } from "./flags.js";

/** `--register` and its companions (docs/operations.md "Discovery with etcd"). */
export const REGISTER_FLAGS = {
  register: {
    section: "Discovery",
    arg: "URL",
    kind: { t: "str" },
    note: "off",
    help: "keep a record of this worker in etcd under a lease (etcd://host:port[,host:port]); needs @tapwire/discovery",
  },
  "register-prefix": {
    section: "Discovery",
    arg: "PREFIX",
    kind: { t: "str" },
    default: "/tapwire/v1/",
    help: "etcd key prefix of the record",
  },
  "register-ttl": {
    section: "Discovery",
    arg: "S",
    kind: { t: "int", min: 1, max: 3600 },
    default: 10,
    help: "lease TTL in seconds (kept alive; revoked on a clean stop)",
  },
  "register-drain-ms": {
    section: "Discovery",
    arg: "MS",
    kind: { t: "int", min: 0, max: 600_000 },
    default: 1000,
    help: "on SIGTERM / SIGINT: revoke the record, keep serving this long (pools move their slots away), then close",
  },
} as const satisfies Record<string, FlagSpec>;
