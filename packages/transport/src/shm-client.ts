// The shm+unix client (issue 23, docs/transport.md "shm"): a unix-socket StreamClient carries
// the doorbells and the replies; request bytes past the inline head go through a per-session
// /dev/shm file mapped into a fixed range of this process (stage area + copy area).
import * as fs from "node:fs";
import { join } from "node:path";
import type { Registry } from "@tapwire/stats";
import { checkRequestState } from "./check.js";
import type { ClientConfig } from "./config.js";
import { TransportError } from "./errors.js";
import type { ClientMetrics } from "./metrics.js";
import type { ClientOptions, RpcClient } from "./options.js";
import {
  ATTACH_FIXED,
  AttachStatus,
  BELL_FIXED,
  createSessionFile,
  DEFAULT_SHM_BYTES,
  DEFAULT_SHM_DIR,
  loadLibc,
  MAX_BELL_HEADER,
  MAX_REGIONS,
  MAX_SHM_BYTES,
  MIN_SHM_BYTES,
  SHM_VERSION,
  ShmArena,
  ShmKind,
} from "./shm.js";
import { StreamClient } from "./stream-client.js";

// Parts at least this long that do not already lie in the stage area are copied into the copy
// area rather than written to the socket (below it, the socket is as cheap as a memcpy).
const COPY_THRESHOLD = 16 * 1024;
/**
 * The least time the ATTACH's answer gets, whatever is left of the connect timeout: the answer
 * waits for the server to open and map the session file, which on a loaded host (many clients
 * attaching at once, each mapping 2 x `shmBytes`) can take seconds.
 */
const ATTACH_MIN_TIMEOUT_MS = 5_000;

/** The shm options of a client, validated (ClientOptions.shmBytes, shmDir, onShmFallback). */
export interface ShmClientOptions {
  readonly bytes: number;
  readonly arena: ShmArena | null;
  readonly dir: string;
  readonly onFallback: ((err: TransportError) => void) | null;
}

/** Validates the shm client options, naming the bad one. */
export function shmClientOptions(o: ClientOptions): ShmClientOptions {
  const bytes = o.shmBytes ?? DEFAULT_SHM_BYTES;
  if (!Number.isInteger(bytes) || bytes < MIN_SHM_BYTES || bytes > MAX_SHM_BYTES || bytes % 4096 !== 0) {
    throw new TransportError(
      "TRANSPORT_BAD_OPTION",
      `option shmBytes: ${String(bytes)} is not a multiple of 4096 in [${MIN_SHM_BYTES}, ${MAX_SHM_BYTES}]`,
    );
  }
  const dir = o.shmDir ?? DEFAULT_SHM_DIR;
  if (typeof dir !== "string" || !dir.startsWith("/"))
    throw new TransportError("TRANSPORT_BAD_OPTION", `option shmDir: ${String(dir)} is not an absolute path`);
  const arena = o.shmArena ?? null;
  if (arena !== null && !(arena instanceof ShmArena))
    throw new TransportError("TRANSPORT_BAD_OPTION", "option shmArena: not a ShmArena (createShmArena)");
  const cb = o.onShmFallback;
  if (cb !== undefined && typeof cb !== "function")
    throw new TransportError("TRANSPORT_BAD_OPTION", "option onShmFallback: not a function");
  return { bytes: arena?.size ?? bytes, arena, dir, onFallback: cb ?? null };
}

/**
 * A client for `shm+unix:///path`. Each connection attaches a new session file (created 0600,
 * unlinked once the server has mapped it); its stage area is {@link ShmClient.sendArea}, the same
 * view for the client's life. A request's parts that lie in the stage area travel by offset, other
 * large parts are copied into the copy area once; the doorbell names the regions. The regions
 * belong to the server from the doorbell until its reply (one request in flight, CONTRACT 3): the
 * caller must not write the stage area while a request is outstanding. When the mapping fails
 * (no koffi, mmap refused, too little room in the shm directory) the client says why once
 * (`onShmFallback`, else a warning on stderr) and sends every byte on the socket.
 */
export class ShmClient implements RpcClient {
  readonly endpoint: string;
  readonly registry: Registry;
  readonly #inner: StreamClient;
  readonly #o: ShmClientOptions;
  #arena: ShmArena | null;
  #attached = false;
  #warned = false;
  #seq = 0;
  #pending = false;
  /** sendArea was handed out: an own arena is then never unmapped, only emptied (no dangling views). */
  #exposed = false;
  readonly #max: number;
  readonly #connectTimeoutMs: number;
  readonly #hdr = Buffer.alloc(MAX_BELL_HEADER);
  readonly #attachReply = Buffer.alloc(8);
  readonly #parts: Uint8Array[] = [];
  readonly #one: Uint8Array[] = [new Uint8Array(0)];

  constructor(
    endpoint: string,
    path: string,
    cfg: ClientConfig,
    metrics: ClientMetrics,
    o: ShmClientOptions,
  ) {
    this.endpoint = endpoint;
    this.#o = o;
    this.#arena = o.arena;
    // The doorbell header rides in front of the inline bytes: the socket limit grows by it (the
    // request limit is checked here on the request itself).
    this.#max = cfg.maxMessageBytes;
    this.#connectTimeoutMs = cfg.connectTimeoutMs;
    const inner = { ...cfg, maxMessageBytes: Math.min(0xffff_ffff, cfg.maxMessageBytes + MAX_BELL_HEADER) };
    // Errors name the endpoint the user gave (shm+unix://...), not the doorbell socket's scheme.
    this.#inner = new StreamClient(endpoint, { scheme: "unix", path }, inner, metrics);
    this.registry = this.#inner.registry;
  }

  get connected(): boolean {
    return this.#inner.connected;
  }

  /** True while this connection's requests go through shared memory (false: the socket fallback). */
  get shmActive(): boolean {
    return this.#attached && this.#inner.connected;
  }

  /**
   * The stage area: `shmBytes` bytes of shared memory a caller may write a request (or its tail)
   * into before `request`/`requestParts` with views of it, so that those bytes reach the server
   * with no copy on this side. Null until a connection attached shared memory (and while falling
   * back). The view stays the same across reconnects; its content does not survive one.
   */
  get sendArea(): Uint8Array | null {
    if (this.#attached) this.#exposed = true;
    return this.#attached && this.#arena !== null ? this.#arena.bytes : null;
  }

  async connect(timeoutMs?: number): Promise<void> {
    if (this.#inner.connected) return;
    this.#detach();
    const t0 = performance.now();
    await this.#inner.connect(timeoutMs);
    // The ATTACH is part of connecting: it gets what the socket connect left of the timeout.
    const left = (timeoutMs ?? this.#connectTimeoutMs) - (performance.now() - t0);
    await this.#attach(Math.max(ATTACH_MIN_TIMEOUT_MS, Math.ceil(left)));
  }

  #warn(e: TransportError): void {
    if (this.#o.onFallback !== null) this.#o.onFallback(e);
    else if (!this.#warned) process.emitWarning(`${e.message} (${this.endpoint})`, { code: e.code });
    this.#warned = true;
  }

  async #attach(timeoutMs: number): Promise<void> {
    try {
      if (this.#arena === null) this.#arena = new ShmArena(await loadLibc(), this.#o.bytes);
    } catch (e) {
      this.#warn(e as TransportError);
      return;
    }
    const arena = this.#arena;
    if (arena.holder !== null && arena.holder !== this) {
      this.#warn(
        new TransportError("TRANSPORT_SHM_UNAVAILABLE", "shm: the arena is held by another connection"),
      );
      return;
    }
    let name: string;
    try {
      name = createSessionFile(arena.libc, this.#o.dir, arena.range, arena.size);
    } catch (e) {
      this.#warn(e as TransportError);
      return;
    }
    const msg = Buffer.alloc(ATTACH_FIXED + Buffer.byteLength(name));
    msg.writeUInt32LE(ShmKind.ATTACH, 0);
    msg.writeUInt32LE(SHM_VERSION, 4);
    msg.writeUInt32LE(arena.range.size, 8);
    msg.writeUInt32LE(msg.length - ATTACH_FIXED, 12);
    msg.write(name, ATTACH_FIXED);
    try {
      const n = await this.#inner.request(msg, this.#attachReply, timeoutMs);
      if (n !== 4 || this.#attachReply.readUInt32LE(0) !== AttachStatus.OK) {
        arena.range.unmapFileKeep(arena.size);
        this.#warn(
          new TransportError("TRANSPORT_SHM_UNAVAILABLE", "shm: the server refused the session mapping"),
        );
        return;
      }
      this.#attached = true;
      arena.holder = this;
      this.#seq = 0;
    } finally {
      // Both ends hold it now (or never will): nothing stays in the shm directory.
      fs.rmSync(join(this.#o.dir, name), { force: true });
    }
  }

  #detach(): void {
    const a = this.#arena;
    if (this.#attached && a !== null) {
      a.range.unmapFileKeep(a.size);
      a.holder = null;
    }
    this.#attached = false;
  }

  request(msg: Uint8Array, replyBuf: Uint8Array, timeoutMs: number): Promise<number> {
    this.#one[0] = msg;
    return this.requestParts(this.#one, replyBuf, timeoutMs);
  }

  async requestParts(parts: readonly Uint8Array[], replyBuf: Uint8Array, timeoutMs: number): Promise<number> {
    // Checked before the areas are touched: a refused request must not disturb one in flight.
    if (!Array.isArray(parts)) throw new TransportError("TRANSPORT_BAD_OPTION", "parts: not an array");
    let size = 0;
    for (const p of parts) {
      if (!(p instanceof Uint8Array))
        throw new TransportError("TRANSPORT_BAD_OPTION", "parts: not all Uint8Array");
      size += p.length;
    }
    checkRequestState(
      this.endpoint,
      this.#pending,
      this.#inner.connected,
      this.#inner.closeReason,
      size,
      this.#max,
    );
    this.#pending = true;
    try {
      return await this.#send(parts, replyBuf, timeoutMs);
    } finally {
      this.#pending = false;
    }
  }

  #send(parts: readonly Uint8Array[], replyBuf: Uint8Array, timeoutMs: number): Promise<number> {
    const out = this.#parts;
    out.length = 0;
    const h = this.#hdr;
    const range = this.#attached ? (this.#arena as ShmArena).range : null;
    let total = 0;
    let nReg = 0;
    let inlineDone = false;
    let copyOff = this.#o.bytes; // the copy area follows the stage area
    const copyEnd = 2 * this.#o.bytes;
    for (const p of parts) {
      total += p.length;
      if (p.length === 0) continue;
      let off = -1;
      if (range !== null) {
        const base = range.bytes;
        if (
          p.buffer === base.buffer &&
          p.byteOffset >= base.byteOffset &&
          p.byteOffset + p.length <= base.byteOffset + this.#o.bytes
        ) {
          off = p.byteOffset - base.byteOffset;
        } else if ((inlineDone || p.length >= COPY_THRESHOLD) && copyOff + p.length <= copyEnd) {
          base.set(p, copyOff);
          off = copyOff;
          copyOff += p.length;
        }
      }
      if (off >= 0 && nReg < MAX_REGIONS) {
        inlineDone = true;
        h.writeUInt32LE(off, BELL_FIXED + 8 * nReg);
        h.writeUInt32LE(p.length, BELL_FIXED + 8 * nReg + 4);
        nReg++;
      } else if (!inlineDone) {
        out.push(p);
      } else {
        // inline bytes must come first: a part that fits nowhere after a region sends all inline
        return this.#allInline(parts, replyBuf, timeoutMs);
      }
    }
    this.#seq = (this.#seq + 1) >>> 0;
    h.writeUInt32LE(ShmKind.BELL, 0);
    h.writeUInt32LE(this.#seq, 4);
    h.writeUInt32LE(total, 8);
    h.writeUInt16LE(nReg, 12);
    h.writeUInt16LE(0, 14);
    out.unshift(h.subarray(0, BELL_FIXED + 8 * nReg));
    return this.#inner.requestParts(out, replyBuf, timeoutMs);
  }

  #allInline(parts: readonly Uint8Array[], replyBuf: Uint8Array, timeoutMs: number): Promise<number> {
    const h = this.#hdr;
    let total = 0;
    for (const p of parts) total += p.length;
    this.#seq = (this.#seq + 1) >>> 0;
    h.writeUInt32LE(ShmKind.BELL, 0);
    h.writeUInt32LE(this.#seq, 4);
    h.writeUInt32LE(total, 8);
    h.writeUInt32LE(0, 12);
    return this.#inner.requestParts([h.subarray(0, BELL_FIXED), ...parts], replyBuf, timeoutMs);
  }

  close(): void {
    this.#inner.close();
    this.#detach();
    const a = this.#arena;
    if (a !== null && a !== this.#o.arena) {
      // an own arena: its pages go back now (an arena given in the options stays the caller's)
      if (this.#exposed) a.range.unmapFile();
      else {
        a.range.free();
        this.#arena = null;
      }
    }
  }
}
