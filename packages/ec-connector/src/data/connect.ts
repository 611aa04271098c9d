import * as net from "node:net";
import * as tls from "node:tls";
import { EcError } from "../errors.js";
import type { DataEndpoint } from "./transport.js";

/** How the reader opens a stream to a peer's data server (plain sockets, or TLS when keys are on). */
export type DataConnect = (target: DataEndpoint, onread: ReadHooks) => net.Socket;

/** The reader's receive hooks: where the next bytes go, and what to do once `n` landed there. */
export interface ReadHooks {
  buffer: () => Uint8Array;
  callback: (n: number, buf: Uint8Array) => boolean;
}

/**
 * TLS material (PEM) of a data-plane agent (EC-CONTRACT 9.4). As a `tls://` server: its
 * certificate and key, and in `ca` the client certificates (or CA) allowed to read. As a reader:
 * its client certificate and key, and in `ca` the producers' certificates (or CA) it trusts.
 */
export interface DataTlsOptions {
  /** PEM certificate. */
  cert: string | Buffer;
  /** PEM private key of `cert`. */
  key: string | Buffer;
  /** PEM certificate(s) trusted for the other side. */
  ca: string | Buffer | (string | Buffer)[];
}

/**
 * Opens plain tcp/unix streams with the kernel receiving straight into the destination
 * (`net.connect({ onread })`), and `tls://` ones when `tls` is given (decrypted bytes are copied
 * into the destination: TLS has no zero-copy receive in Node).
 */
export function socketConnect(tlsOptions: DataTlsOptions | undefined): DataConnect {
  return (target, hooks) => {
    if ("path" in target) return net.connect({ path: target.path, onread: hooks });
    if (!target.tls)
      return net.connect({ host: target.host, port: target.port, onread: hooks, noDelay: true });
    if (tlsOptions === undefined) {
      throw new EcError("EC_BAD_OPTION", "option tls: a tls:// data endpoint needs the reader's tls options");
    }
    const s = tls.connect({
      host: target.host,
      port: target.port,
      cert: tlsOptions.cert,
      key: tlsOptions.key,
      ca: tlsOptions.ca,
      // The producer's certificate is pinned by `ca` (its own certificate or a private CA), not by
      // a host name: producers are reached by address, often an IP without a matching SAN.
      checkServerIdentity: () => undefined,
    });
    s.setNoDelay(true);
    s.on("data", (chunk: Buffer) => {
      let off = 0;
      while (off < chunk.length) {
        const dst = hooks.buffer();
        const n = Math.min(dst.length, chunk.length - off);
        if (n === 0) {
          s.destroy(new Error("unsolicited bytes"));
          return;
        }
        dst.set(chunk.subarray(off, off + n));
        off += n;
        if (!hooks.callback(n, dst)) return;
      }
    });
    return s;
  };
}
