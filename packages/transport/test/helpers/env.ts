// Test helpers kept inside this package (the shared @tapwire/testing package was not available
// when these tests were written; see README "Testing").
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ClientOptions, ServerOptions } from "../../src/index.js";

let seq = 0;

/** A fresh unix socket path, short enough for sun_path. */
export function uniqueSocketPath(tag: string): string {
  seq++;
  return `/tmp/twt-${process.pid}-${tag}-${seq}-${Math.random().toString(36).slice(2, 8)}.sock`;
}

export interface TlsCreds {
  ca: string;
  cert: string;
  key: string;
  clientCert: string;
  clientKey: string;
  wrongCa: string;
  wrongClientCert: string;
  wrongClientKey: string;
}

let creds: TlsCreds | null = null;

function ossl(dir: string, args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: "ignore" });
}

function makeCa(dir: string, name: string): void {
  ossl(dir, [
    "req",
    "-x509",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
    "-keyout",
    `${name}.key`,
    "-out",
    `${name}.crt`,
    "-days",
    "2",
    "-subj",
    `/CN=${name}`,
  ]);
}

function makeLeaf(dir: string, ca: string, name: string, ext: string): void {
  ossl(dir, [
    "req",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
    "-keyout",
    `${name}.key`,
    "-out",
    `${name}.csr`,
    "-subj",
    `/CN=${name}`,
  ]);
  execFileSync("sh", ["-c", `printf '%s\\n' '${ext}' > ${name}.ext`], { cwd: dir });
  ossl(dir, [
    "x509",
    "-req",
    "-in",
    `${name}.csr`,
    "-CA",
    `${ca}.crt`,
    "-CAkey",
    `${ca}.key`,
    "-CAcreateserial",
    "-out",
    `${name}.crt`,
    "-days",
    "2",
    "-extfile",
    `${name}.ext`,
  ]);
}

/** A CA, a server certificate for 127.0.0.1/localhost, a client certificate, and an unrelated CA. */
export function tlsCreds(): TlsCreds {
  if (creds !== null) return creds;
  const dir = mkdtempSync(join(tmpdir(), "twt-tls-"));
  makeCa(dir, "ca");
  makeCa(dir, "wrongca");
  makeLeaf(dir, "ca", "server", "subjectAltName=IP:127.0.0.1,DNS:localhost");
  makeLeaf(dir, "ca", "client", "extendedKeyUsage=clientAuth");
  makeLeaf(dir, "wrongca", "wrongclient", "extendedKeyUsage=clientAuth");
  const r = (f: string): string => readFileSync(join(dir, f), "utf8");
  creds = {
    ca: r("ca.crt"),
    cert: r("server.crt"),
    key: r("server.key"),
    clientCert: r("client.crt"),
    clientKey: r("client.key"),
    wrongCa: r("wrongca.crt"),
    wrongClientCert: r("wrongclient.crt"),
    wrongClientKey: r("wrongclient.key"),
  };
  return creds;
}

/** One transport under test: where to listen and the options each side needs. */
export interface Case {
  scheme: string;
  listen(): string;
  server: ServerOptions;
  client: ClientOptions;
  /** Stream schemes share the u32 length-prefix framing; ZeroMQ frames messages itself. */
  stream: boolean;
}

/** Every scheme, with port 0 / unique socket paths (CONTRACT 3). */
export function matrix(): Case[] {
  const c = tlsCreds();
  return [
    { scheme: "tcp", listen: () => "tcp://127.0.0.1:0", server: {}, client: {}, stream: true },
    { scheme: "unix", listen: () => `unix://${uniqueSocketPath("u")}`, server: {}, client: {}, stream: true },
    {
      scheme: "tls",
      listen: () => "tls://127.0.0.1:0",
      server: { tls: { cert: c.cert, key: c.key } },
      client: { tls: { ca: c.ca } },
      stream: true,
    },
    { scheme: "zmq+tcp", listen: () => "zmq+tcp://127.0.0.1:0", server: {}, client: {}, stream: false },
    {
      scheme: "zmq+ipc",
      listen: () => `zmq+ipc://${uniqueSocketPath("z")}`,
      server: {},
      client: {},
      stream: false,
    },
  ];
}

/** Deterministic bytes for content checks. */
export function pattern(n: number, seed: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  let x = (seed * 2654435761) >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    b[i] = x & 0xff;
  }
  return b;
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
