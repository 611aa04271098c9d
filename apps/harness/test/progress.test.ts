import { Writable } from "node:stream";
import { describe, expect, test } from "vitest";
import { barLine, Progress, type ProgressState } from "../src/report/progress.js";

/** A terminal `columns` wide with autowrap, enough of VT100 for `\r`, `\n` and `ESC[2K`. */
class FakeTty extends Writable {
  readonly isTTY = true;
  rows: string[][] = [[]];
  private r = 0;
  private c = 0;
  constructor(public columns: number) {
    super();
  }
  override _write(chunk: Buffer, _enc: BufferEncoding, cb: () => void): void {
    const s = String(chunk);
    for (let i = 0; i < s.length; i++) {
      const ch = s[i]!;
      if (s.startsWith("\x1b[2K", i)) {
        this.rows[this.r] = [];
        i += 3;
      } else if (ch === "\r") this.c = 0;
      else if (ch === "\n") this.newline();
      else {
        if (this.c === this.columns) this.newline();
        const row = this.rows[this.r]!;
        row[this.c++] = ch;
      }
    }
    cb();
  }
  private newline(): void {
    this.r++;
    this.c = 0;
    this.rows[this.r] ??= [];
  }
  /** Rows with something on them. */
  screen(): string[] {
    return this.rows.map((r) => r.join("")).filter((r) => r.trim() !== "");
  }
}

const state = (i: number): ProgressState => ({
  phase: "decoding",
  done: i * 137,
  total: 100_000,
  tokens: i * 123_456,
  rounds: i * 9_999,
  meanAccepted: 3.25,
  ecLoaded: i * 77,
  faults: 4,
});

describe("progress bar", () => {
  test("on an 80-column terminal the bar redraws in place: one line, never wider than 79", () => {
    const tty = new FakeTty(80);
    const p = new Progress("auto", tty as unknown as NodeJS.WriteStream);
    for (let i = 1; i <= 60; i++) p.update(state(i), true);
    const screen = tty.screen();
    expect(screen).toHaveLength(1);
    expect(screen[0]!.length).toBeLessThanOrEqual(79);
    expect(screen[0]).toMatch(/^decoding /);
    // a note goes on its own line above, the bar keeps redrawing below it
    p.note("worker pid 1234 listening on tcp://127.0.0.1:5555");
    for (let i = 61; i <= 70; i++) p.update(state(i), true);
    expect(tty.screen()).toHaveLength(2);
    p.finish();
    expect(tty.screen()).toHaveLength(1);
  });

  test("a resized terminal is followed on the next draw", () => {
    const tty = new FakeTty(120);
    const p = new Progress("bar", tty as unknown as NodeJS.WriteStream);
    p.update(state(3), true);
    expect(tty.screen()[0]).toContain("[");
    tty.columns = 40;
    tty.rows = [[]];
    for (let i = 4; i < 10; i++) p.update(state(i), true);
    expect(tty.screen()).toHaveLength(1);
    expect(tty.screen()[0]!.length).toBeLessThanOrEqual(39);
  });

  test("barLine shrinks the bar, then drops it, then cuts the tail", () => {
    const s = state(50);
    const tail = "1 tok  2 rounds  acc 3.00  ec 0  1.0s";
    expect(barLine(s, tail, 200)).toContain(`[${"#".repeat(2)}`);
    expect(barLine(s, tail, 200).match(/\[([#-]+)\]/)![1]).toHaveLength(24);
    const narrow = barLine(s, tail, 80);
    expect(narrow.length).toBeLessThanOrEqual(79);
    expect(narrow.match(/\[([#-]+)\]/)![1]!.length).toBeLessThan(24);
    const tiny = barLine(s, tail, 30);
    expect(tiny.length).toBeLessThanOrEqual(29);
    expect(tiny.endsWith("…")).toBe(true);
    expect(barLine(s, tail, undefined).length).toBeLessThanOrEqual(79);
  });
});
