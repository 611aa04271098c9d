import type { Logger } from "pino";
import { curveKeyPair, Reply } from "zeromq";
import { EcError } from "./errors.js";

/** A CURVE key pair, Z85-encoded (40 characters each), as `zeromq`'s `curveKeyPair()` makes it. */
export interface CurveKeyPair {
  /** Z85 public key (shared with peers). */
  publicKey: string;
  /** Z85 secret key (never leaves its owner). */
  secretKey: string;
}

/** EC-CONTRACT 9.4: the producer's CURVE keys and the consumer public keys it accepts. */
export interface CurveServerOptions extends CurveKeyPair {
  /** Z85 public keys of the consumers allowed to connect (the ZAP allow list). */
  allow: readonly string[];
}

/** EC-CONTRACT 9.4: a consumer's key pair and the producer's public key. */
export interface CurveClientOptions extends CurveKeyPair {
  /** Z85 public key of the producer (or, for a consumer of many producers, one per address). */
  serverKey: string | ((producer: string) => string);
}

/** A new CURVE key pair (`tapwire-ec-producer keygen`). */
export function newCurveKeyPair(): CurveKeyPair {
  return curveKeyPair();
}

/** Where libzmq asks for ZAP decisions (ZeroMQ RFC 27), in the default context. */
const ZAP_ENDPOINT = "inproc://zeromq.zap.01";
const Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/** Z85 (ZeroMQ RFC 32) of `bytes` (a multiple of 4 long). */
export function z85Encode(bytes: Uint8Array): string {
  let out = "";
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  for (let i = 0; i + 4 <= bytes.length; i += 4) {
    let n = v.getUint32(i);
    const chunk: string[] = [];
    for (let k = 0; k < 5; k++) {
      chunk.unshift(Z85[n % 85]!);
      n = Math.floor(n / 85);
    }
    out += chunk.join("");
  }
  return out;
}

/** Throws `EC_BAD_OPTION` unless `key` is a Z85 CURVE key (40 characters of the Z85 alphabet). */
export function checkCurveKey(name: string, key: unknown): string {
  if (typeof key !== "string" || key.length !== 40 || [...key].some((c) => !Z85.includes(c))) {
    throw new EcError("EC_BAD_OPTION", `option ${name}: expected a 40-character Z85 CURVE key`);
  }
  return key;
}

/** Validates server CURVE options (names the bad one). */
export function checkCurveServer(c: CurveServerOptions): void {
  if (c === null || typeof c !== "object")
    throw new EcError("EC_BAD_OPTION", "option curve: expected an object");
  checkCurveKey("curve.publicKey", c.publicKey);
  checkCurveKey("curve.secretKey", c.secretKey);
  if (!Array.isArray(c.allow))
    throw new EcError("EC_BAD_OPTION", "option curve.allow: expected an array of keys");
  for (const [i, k] of c.allow.entries()) checkCurveKey(`curve.allow[${i}]`, k);
}

interface Domain {
  allow: ReadonlySet<string>;
  onRefused: (why: string) => void;
}

/**
 * The ZAP handler (ZeroMQ RFC 27) of this process: one REP socket on `inproc://zeromq.zap.01` in
 * zeromq's default context, shared by every CURVE ROUTER of the process, each under its own ZAP
 * domain with its own allow list. A handshake whose client key is not in the domain's list (or
 * any non-CURVE mechanism) is answered 400, and the domain's `onRefused` counts it.
 */
class ZapService {
  readonly #domains = new Map<string, Domain>();
  #sock: Reply | null = null;
  #next = 1;
  #log: Logger | null = null;

  #binding: Promise<void> | null = null;

  /** Registers an allow list under a new ZAP domain; resolves once the handler is bound. */
  async register(allow: readonly string[], onRefused: (why: string) => void, log: Logger): Promise<string> {
    const domain = `tapwire-ec-${process.pid}-${this.#next++}`;
    this.#domains.set(domain, { allow: new Set(allow), onRefused });
    this.#log ??= log;
    try {
      await this.#bound();
    } catch (err) {
      this.release(domain);
      throw new EcError("EC_BAD_ENDPOINT", `ZAP handler: ${(err as Error).message}`, { cause: err });
    }
    return domain;
  }

  release(domain: string): void {
    this.#domains.delete(domain);
    if (this.#domains.size === 0 && this.#sock !== null) {
      this.#sock.close();
      this.#sock = null;
      this.#binding = null;
    }
  }

  /**
   * Binds the handler once. A handler closed a moment ago (the last producer of the process went
   * away) may still hold the inproc name: EADDRINUSE is retried for up to half a second.
   */
  #bound(): Promise<void> {
    if (this.#sock !== null && this.#binding !== null) return this.#binding;
    const sock = new Reply({ linger: 0 });
    this.#sock = sock;
    this.#binding = (async () => {
      for (let i = 0; ; i++) {
        try {
          await sock.bind(ZAP_ENDPOINT);
          break;
        } catch (err) {
          if (i >= 50 || (err as { code?: unknown }).code !== "EADDRINUSE") {
            if (this.#sock === sock) {
              this.#sock = null;
              this.#binding = null;
            }
            sock.close();
            throw err;
          }
          await new Promise((r) => setTimeout(r, 10));
        }
      }
      void this.#loop(sock);
    })();
    return this.#binding;
  }

  async #loop(sock: Reply): Promise<void> {
    try {
      for await (const f of sock) {
        const [version, id, domainB, , , mechanismB, key] = f;
        const domain = domainB?.toString() ?? "";
        const mechanism = mechanismB?.toString() ?? "";
        const d = this.#domains.get(domain);
        let why: string | null = null;
        if (d === undefined) why = `unknown ZAP domain ${domain}`;
        else if (mechanism !== "CURVE") why = `mechanism ${mechanism} (CURVE required)`;
        else if (key === undefined || key.length !== 32) why = "no CURVE client key";
        else if (!d.allow.has(z85Encode(key))) why = "client key not in the allow list";
        if (why !== null) d?.onRefused(why);
        await sock.send([version ?? "1.0", id ?? "", why === null ? "200" : "400", why ?? "OK", "", ""]);
      }
    } catch (err) {
      if (this.#sock === sock) this.#log?.warn({ err: (err as Error).message }, "ZAP handler stopped");
    }
  }
}

/** The process's ZAP handler (internal). */
export const zap = new ZapService();
