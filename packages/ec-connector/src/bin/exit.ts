import { createSecureContext } from "node:tls";

/**
 * The exit-code policy of every tapwire bin (issue 19; docs/operations.md "Exit codes"), as the
 * producer implements it: systemd units say `RestartPreventExitStatus=2`, so a usage or config
 * error is never retried, and a bind failure (the port still held by a predecessor, the address
 * not up yet) is.
 */
export const EXIT = {
  /** Closed on a signal. */
  OK: 0,
  /** Any other failure while starting or running. */
  RUNTIME: 1,
  /** Usage or config error: a bad flag or value, an unreadable or invalid file. Never retried. */
  USAGE: 2,
  /** EX_TEMPFAIL (sysexits.h): a bind failure such as an address in use; systemd retries. */
  TEMPFAIL: 75,
} as const;

/** Socket errors that mean "cannot bind now" (EADDRINUSE, EADDRNOTAVAIL): exit {@link EXIT}.TEMPFAIL. */
const BIND_CODES = new Set(["EADDRINUSE", "EADDRNOTAVAIL"]);

/** True when `err` or one of its causes is a bind failure (`EADDRINUSE`, `EADDRNOTAVAIL`). */
export function isBindFailure(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e !== null && typeof e === "object" && depth < 8; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && BIND_CODES.has(code)) return true;
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/**
 * `EcProducer` option names in its messages, as the bin's flags: `option numBlocks` becomes
 * `--num-blocks`, `adminAllowRemote` becomes `--admin-allow-remote` (the bin's messages name
 * flags, never internal names).
 */
export function flagNames(message: string, optionToFlag: readonly (readonly [string, string])[]): string {
  let out = message;
  // longest first: "heartbeat.intervalMs" before "data"
  const pairs = [...optionToFlag].sort((a, b) => b[0].length - a[0].length);
  for (const [opt, flag] of pairs) {
    const esc = opt.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    out = out.replace(new RegExp(`\\boption ${esc}(?![\\w.])`, "g"), `--${flag}`);
    // camelCase and dotted names are never English words: replace them wherever they appear
    if (/[A-Z.]/.test(opt)) out = out.replace(new RegExp(`(?<![\\w.-])${esc}(?![\\w.])`, "g"), `--${flag}`);
  }
  return out;
}

/** A TLS file that does not parse, as a usage message naming the flag and the file (or null: all good). */
export function checkTlsFiles(files: {
  cert: [string, string];
  key: [string, string];
  ca: [string, string];
}): string | null {
  const each = [
    ["tls-cert", { cert: files.cert[1] }, files.cert[0]],
    ["tls-key", { key: files.key[1] }, files.key[0]],
    ["tls-ca", { ca: files.ca[1] }, files.ca[0]],
  ] as const;
  for (const [flag, opts, path] of each) {
    if (!/-----BEGIN [A-Z0-9 ]+-----/.test(Object.values(opts)[0] ?? ""))
      return `--${flag} ${path}: not a PEM file`;
    try {
      createSecureContext(opts);
    } catch (err) {
      return `--${flag} ${path}: ${(err as Error).message}`;
    }
  }
  try {
    createSecureContext({ cert: files.cert[1], key: files.key[1] });
  } catch (err) {
    return `--tls-key ${files.key[0]} does not go with --tls-cert ${files.cert[0]}: ${(err as Error).message}`;
  }
  return null;
}
