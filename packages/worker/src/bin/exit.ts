/**
 * The exit code policy of every tapwire bin (docs/operations.md "Exit codes"; issue 19):
 * 2 = usage or configuration (a bad flag or value, an unreadable or invalid file): the same
 * command fails the same way again, so supervisors must not retry (systemd:
 * `RestartPreventExitStatus=2`); 75 (`EX_TEMPFAIL`, sysexits.h) = a bind failure that may clear
 * (address in use, address not yet on this host): retry later; 1 = any other runtime failure.
 */
import { UsageError } from "./flags.js";

/** The exit codes of {@link exitCodeOf}. */
export const EXIT = {
  /** Any other runtime failure. */
  FAILURE: 1,
  /** Usage or configuration error: never retried. */
  USAGE: 2,
  /** EX_TEMPFAIL: a bind failure such as an address in use; a supervisor retries. */
  TEMPFAIL: 75,
} as const;

/** A listener could not be bound (`flag` names the flag whose address it was). */
export class BindError extends Error {
  override name = "BindError";
  /** The errno-style code of the cause (`EADDRINUSE`, `EADDRNOTAVAIL`, `EACCES`, …) when known. */
  readonly errno: string | undefined;
  constructor(message: string, errno: string | undefined, options?: { cause?: unknown }) {
    super(message, options);
    this.errno = errno;
  }
}

/**
 * Bind failures that are configuration (a privileged port, a path that is not a socket or whose
 * folder is missing): exit 2. Every other bind failure (EADDRINUSE, EADDRNOTAVAIL, …) may clear: 75.
 */
const CONFIG = new Set(["EACCES", "EPERM", "EINVAL", "ENOENT", "ENOTDIR", "ENOTSOCK"]);

/** The errno code under `e` (its own `code` when it looks like one, or its causes'). */
export function errnoOf(e: unknown): string | undefined {
  for (let c: unknown = e, i = 0; c !== undefined && c !== null && i < 5; i++) {
    const code = (c as { code?: unknown }).code;
    if (typeof code === "string" && /^E[A-Z]+$/.test(code)) return code;
    const msg = (c as { message?: unknown }).message;
    if (typeof msg === "string") {
      const m = /\b(EADDRINUSE|EADDRNOTAVAIL|EACCES)\b/.exec(msg);
      if (m) return m[1];
      if (/address already in use/i.test(msg)) return "EADDRINUSE";
      if (/a live server is listening there/.test(msg)) return "EADDRINUSE";
      if (/path exists and is not a socket/.test(msg)) return "ENOTSOCK";
    }
    c = (c as { cause?: unknown }).cause;
  }
  return undefined;
}

/** The exit code for an error that ended the bin. */
export function exitCodeOf(e: unknown): number {
  if (e instanceof UsageError) return EXIT.USAGE;
  if (e instanceof BindError) {
    return e.errno !== undefined && CONFIG.has(e.errno) ? EXIT.USAGE : EXIT.TEMPFAIL;
  }
  return EXIT.FAILURE;
}
