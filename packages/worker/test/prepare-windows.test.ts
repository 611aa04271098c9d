import { encodeHello, FrameStatus, frame, Op } from "@tapwire/wire";
import { describe, expect, test } from "vitest";
import type { FrameConn } from "../src/index.js";
import { WorkerCore } from "../src/index.js";
import { entry, helloFor, nullDrafter, stepFrame } from "./helpers.js";

// docs/worker.md "Compaction between STEPs": WorkerCore.prepareWindows() moves the rows the next
// multi-row append keeps, for the single current session and for every session of a shared worker
// (CONTRACT 12.1), and the windows the STEPs then build are the ones CONTRACT 7.2 says.
describe("WorkerCore.prepareWindows (compaction between STEPs)", () => {
  for (const maxSessions of [1, 2]) {
    test(`lockstep 8-row appends, ${maxSessions} session(s): prepared between STEPs, windows exact`, async () => {
      const d = nullDrafter({ window: 16 });
      const W = d.window;
      const core = new WorkerCore({ drafter: d, maxSlots: 4, maxRowsPerStep: 64, maxSessions });
      const sessions = maxSessions === 1 ? [0x51] : [0x51, 0x52];
      const conns = sessions.map((): FrameConn => ({}));
      for (let i = 0; i < sessions.length; i++) {
        const r = (await core.handle(
          frame({ op: Op.HELLO, seq: 1, session: sessions[i]! }, encodeHello(helloFor(d, { maxSlots: 4 }))),
          conns[i],
        )) as Uint8Array;
        expect(r[7]).toBe(FrameStatus.OK);
      }
      let prepared = 0;
      for (let step = 0; step < 4 * W; step++) {
        for (let i = 0; i < sessions.length; i++) {
          const pos = step * 8;
          const entries = [0, 1, 2, 3].map((slot) =>
            entry({ slot, rowStart: pos, nRows: 8, anchorPos: pos + 8 }),
          );
          const r = (await core.handle(
            stepFrame({ seq: step + 2, session: sessions[i]!, entries }),
            conns[i],
          )) as Uint8Array;
          expect(r[7]).toBe(FrameStatus.OK);
        }
        prepared += core.prepareWindows();
      }
      expect(prepared).toBeGreaterThan(0);
      const end = 4 * W * 8;
      for (let slot = 0; slot < 4; slot++) {
        const w = core.debugWindow(slot, sessions[sessions.length - 1]);
        expect(w.nRows).toBe(W);
        expect(w.firstPos).toBe(end - W);
      }
    });
  }
});
