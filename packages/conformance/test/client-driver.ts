/**
 * A rank-0 engine loop for the client mode's CI run: tapwire's RemoteDraftClient and RoundCore,
 * three slots decoding one token per round, and a supervisor that replaces a disabled client by
 * a fresh one (a new process would get a new session id, CONTRACT 6.2).
 */
import type { RemoteDraftClientOptions } from "@tapwire/client";
import { RemoteDraftClient, RoundCore } from "@tapwire/client";

export interface Driver {
  stop(): Promise<void>;
  /** Disabled reasons seen, in order. */
  readonly disabledReasons: string[];
  /** Clients started. */
  readonly clients: number;
}

export const DRIVER_GEOMETRY = { window: 8, numSpec: 4, numTaps: 1, hidden: 8, vocabSize: 1000 };

export function startDriver(endpoint: string, opts: Partial<RemoteDraftClientOptions> = {}): Driver {
  const rowBytes = DRIVER_GEOMETRY.numTaps * DRIVER_GEOMETRY.hidden * 2;
  let stopped = false;
  const disabledReasons: string[] = [];
  let clients = 0;
  const make = () => {
    clients++;
    const client = new RemoteDraftClient({
      endpoint,
      drafterIdentity: new Uint8Array(32),
      markovIdentity: new Uint8Array(32),
      ...DRIVER_GEOMETRY,
      maxSlots: 16,
      maxRowsPerStep: 256,
      backoffMs: 300,
      backoffMaxMs: 300,
      requestTimeoutMs: 300,
      connectTimeoutMs: 500,
      ...opts,
    } as RemoteDraftClientOptions);
    return { client, core: new RoundCore({ client }) };
  };
  const loop = (async () => {
    let { client, core } = make();
    const pos = [5, 9, 3];
    const gen = [1, 1, 1];
    let first = true;
    while (!stopped) {
      if (client.disabled) {
        disabledReasons.push(String(client.disabledReason));
        await client.close();
        ({ client, core } = make());
        first = true;
      }
      const requests = pos.map((p, slot) => {
        const n = first ? p : 1;
        return {
          slot,
          generation: gen[slot]!,
          anchorPos: p,
          anchorToken: (p * 7 + slot) % DRIVER_GEOMETRY.vocabSize,
          newRows: new Uint8Array(n * rowBytes).fill(0x3f),
          newRowsStart: p - n,
          nOut: slot === 1 ? 2 : 0,
        };
      });
      try {
        await core.round({ requests });
      } catch {
        // a round refused on the client side: the next one tries again
      }
      first = false;
      for (let i = 0; i < pos.length; i++) pos[i]! += 1;
      // Every 40 tokens a slot takes a new request (new generation, short prompt).
      for (let i = 0; i < pos.length; i++) {
        if (pos[i]! > 40) {
          pos[i] = 2;
          gen[i]! += 1;
        }
      }
      await new Promise((r) => setTimeout(r, 5));
    }
    await client.close();
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
    },
    disabledReasons,
    get clients() {
      return clients;
    },
  };
}
