/**
 * Media sources of the engine. {@link LocalMedia} encodes every item in-process with the
 * synthetic encoder (the fallback path, and the reference the lossless check uses).
 */
import { syntheticEmbedding } from "@tapwire/ec-connector";
import type { MediaReady, MediaSource } from "./engine.js";
import type { RequestSpec } from "./workload.js";

/** The embedding of media item `mmHash` as the encoder computes it (deterministic). */
export function localEmbedding(mmHash: string, nbytes: number): Uint8Array {
  return syntheticEmbedding(mmHash, nbytes);
}

/** Every item encoded locally at once (no encoder process). */
export class LocalMedia implements MediaSource {
  private ready: MediaReady[] = [];
  /** Items encoded. */
  encoded = 0;
  constructor(private readonly nbytes: number) {}
  request(spec: RequestSpec): void {
    this.encoded += spec.media.length;
    this.ready.push({
      spec,
      embeddings: spec.media.map((h) => localEmbedding(h, this.nbytes)),
      release: () => {},
    });
  }
  poll(): MediaReady[] {
    const out = this.ready;
    this.ready = [];
    return out;
  }
  get waiting(): number {
    return this.ready.length;
  }
}
