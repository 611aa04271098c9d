import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import { Worker } from "node:worker_threads";
import type { Crc32Impl } from "../crc.js";

/**
 * Messages to the checksum thread (`checksum-thread.ts`). A range continues the CRC-32 of read
 * `id` over `region[start, start + len)`; `final` asks for the value (and forgets the read).
 */
export type CrcThreadRequest =
  | {
      readonly kind: "range";
      readonly id: number;
      readonly start: number;
      readonly len: number;
      readonly final: boolean;
    }
  | { readonly kind: "drop"; readonly id: number };

/** Messages from the checksum thread. */
export type CrcThreadReply =
  | { readonly kind: "impl"; readonly impl: Crc32Impl }
  | { readonly kind: "crc"; readonly id: number; readonly crc: number };

/** `workerData` of the checksum thread: the shared cache region it reads from. */
export interface CrcThreadData {
  readonly buffer: SharedArrayBuffer;
  readonly byteOffset: number;
  readonly length: number;
}

/** What the owner of a {@link ChecksumThread} hears back. */
export interface ChecksumThreadEvents {
  /** The final CRC-32 of read `id`. */
  done(id: number, crc: number): void;
  /** The thread died: every read it was checksumming will never get a value. */
  failed(err: Error): void;
}

/**
 * Where the thread's module is: the compiled `checksum-thread.js` next to this file. When this
 * package runs from its TypeScript sources (tests, `tsx`), the `.ts` module is started through a
 * two-line bootstrap that registers tsx's loader in the thread first (Node 20 does not apply the
 * parent's `--import` loader hooks inside worker threads).
 */
function threadModule(): URL {
  if (!import.meta.url.endsWith(".ts")) return new URL("./checksum-thread.js", import.meta.url);
  const req = createRequire(import.meta.url);
  const pkgPath = req.resolve("tsx/package.json");
  const pkg = JSON.parse(readFileSync(pkgPath, "utf8")) as {
    exports: Record<string, { import: { default: string } }>;
  };
  const api = pathToFileURL(join(dirname(pkgPath), pkg.exports["./esm/api"]!.import.default)).href;
  const entry = new URL("./checksum-thread.ts", import.meta.url).href;
  const boot = `import{register}from${JSON.stringify(api)};register();await import(${JSON.stringify(entry)});`;
  return new URL(`data:text/javascript,${encodeURIComponent(boot)}`);
}

/**
 * The main-thread side of the checksum thread (EC-CONTRACT 6.3: the CRC-32 overlaps the receive).
 * The thread reads the landed ranges straight from the shared region and uses the same CRC-32
 * fallback chain as the main thread (`crc.ts`: `@node-rs/crc32` → `node:zlib` → table).
 */
export class ChecksumThread {
  readonly #worker: Worker;
  #impl: Crc32Impl | null = null;
  #dead = false;

  constructor(region: Uint8Array, events: ChecksumThreadEvents) {
    const buffer = region.buffer;
    if (!(buffer instanceof SharedArrayBuffer)) throw new TypeError("checksum thread: region is not shared");
    const data: CrcThreadData = { buffer, byteOffset: region.byteOffset, length: region.length };
    this.#worker = new Worker(threadModule(), { workerData: data });
    this.#worker.unref();
    this.#worker.on("message", (m: CrcThreadReply) => {
      if (m.kind === "impl") this.#impl = m.impl;
      else events.done(m.id, m.crc);
    });
    this.#worker.on("error", (err) => {
      this.#dead = true;
      events.failed(err);
    });
  }

  /** The implementation the thread chose, once it has said (`null` before). */
  get impl(): Crc32Impl | null {
    return this.#impl;
  }

  /** Checksums `region[start, start + len)` as the next bytes of read `id`. */
  range(id: number, start: number, len: number, final: boolean): void {
    if (!this.#dead) this.#post({ kind: "range", id, start, len, final });
  }

  /** Forgets read `id` (aborted or released). */
  drop(id: number): void {
    if (!this.#dead) this.#post({ kind: "drop", id });
  }

  /** Stops the thread. */
  async terminate(): Promise<void> {
    this.#dead = true;
    await this.#worker.terminate();
  }

  #post(m: CrcThreadRequest): void {
    this.#worker.postMessage(m);
  }
}
