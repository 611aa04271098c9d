/**
 * The drafter link of the engine: `@tapwire/client`'s RoundCore (rings, resync, RELEASE, depth
 * policy) over a RemoteDraftClient, behind the engine's {@link DraftLink} interface.
 */
import type { RoundCore, RoundRequest } from "@tapwire/client";
import type { SampleMeta } from "@tapwire/wire";
import type { DraftLink, LinkDrafts, LinkRequest, LinkRound } from "./engine.js";

interface MutableRoundRequest {
  slot: number;
  generation: number;
  anchorPos: number;
  anchorToken: number;
  newRows: Uint8Array | null;
  needDraft: boolean;
  nOut: number;
  sampleMeta: SampleMeta | null;
}

/** {@link DraftLink} over a RoundCore; request objects are reused between rounds. */
export class RoundCoreLink implements DraftLink {
  private readonly reqs: MutableRoundRequest[] = [];
  private readonly drafts: Array<LinkDrafts | null> = [];
  private readonly release: number[] = [];

  constructor(private readonly core: RoundCore) {}

  async round(
    reqs: readonly LinkRequest[],
    released: ReadonlyArray<{ slot: number; generation: number }>,
  ): Promise<LinkRound> {
    const n = reqs.length;
    for (let i = 0; i < n; i++) {
      const r = reqs[i] as LinkRequest;
      let q = this.reqs[i];
      if (!q) {
        q = {
          slot: 0,
          generation: 0,
          anchorPos: 0,
          anchorToken: 0,
          newRows: null,
          needDraft: false,
          nOut: 0,
          sampleMeta: null,
        };
        this.reqs[i] = q;
      }
      q.slot = r.slot;
      q.generation = r.generation;
      q.anchorPos = r.anchorPos;
      q.anchorToken = r.anchorToken;
      q.newRows = r.nRows > 0 ? r.rows : null;
      q.needDraft = r.want > 0;
      q.nOut = Math.max(r.want, 0);
      q.sampleMeta = r.sample;
    }
    this.release.length = 0;
    for (const x of released) this.release.push(x.slot);
    const res = await this.core.round({
      requests: this.reqs as readonly RoundRequest[],
      nRequests: n,
      release: this.release,
      batchSize: n,
    });
    this.drafts.length = n;
    for (let i = 0; i < n; i++) {
      const d = res.drafts[i];
      this.drafts[i] =
        d && d.k > 0
          ? {
              k: d.k,
              depth: d.depth,
              ids: d.ids,
              offset: 0,
              conf: d.conf,
              margin: d.margin,
              mask: d.sampledMask,
              support: d.supportIds,
              q: d.proposalQ,
            }
          : null;
    }
    return {
      drafts: this.drafts,
      outcome: res.outcome === "idle" ? "idle" : res.outcome,
      rttMs: res.rttUs > 0 ? res.rttUs / 1000 : null,
      resynced: res.resynced,
      deferred: res.deferred,
    };
  }
}
