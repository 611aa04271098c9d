// The one owner of loading the optional peer dependency `koffi` from this package (issue 23): the
// shm data plane binds libc through it (`data/shm-map.ts`), the CRC-32 binds ISA-L's
// `libisal.so.2` through it (`crc.ts`). koffi is CommonJS: a synchronous require, on first use.
import { createRequire } from "node:module";

/** Requires `koffi` as this package resolves it (throws when it is not installed). */
export function requireKoffi(): unknown {
  return createRequire(import.meta.url)("koffi");
}
