/**
 * Progress while the run goes, on stderr (stdout carries only the report): a redrawn bar on a
 * terminal, one plain line every few seconds otherwise (CI logs, pipes).
 */
import type { ProgressMode } from "../cli/cli.js";

/** What the progress line shows. */
export interface ProgressState {
  phase: string;
  done: number;
  total: number;
  tokens: number;
  rounds: number;
  meanAccepted: number;
  ecLoaded: number;
  faults: number;
}

/** Bar width in characters when the terminal has room for it. */
const BAR_WIDTH = 24;
/** Narrowest bar drawn; below this the bar is left out. */
const MIN_BAR_WIDTH = 8;

/**
 * One bar line that fits in `columns - 1` characters (a line as wide as the terminal would wrap
 * on some terminals, and `\r` only returns to the start of the last visual line: the bar would
 * stack instead of redrawing). The bar shrinks first, then the tail is cut with "…".
 */
export function barLine(s: ProgressState, tail: string, columns: number | undefined): string {
  const max = Math.max(10, (columns !== undefined && columns > 0 ? columns : 80) - 1);
  const count = `${s.done}/${s.total}`;
  const frac = s.total > 0 ? Math.min(1, s.done / s.total) : 0;
  const fixed = `${s.phase} [] ${count}  ${tail}`.length;
  const width = Math.min(BAR_WIDTH, max - fixed);
  let line: string;
  if (width >= MIN_BAR_WIDTH) {
    const fill = Math.round(frac * width);
    line = `${s.phase} [${"#".repeat(fill)}${"-".repeat(width - fill)}] ${count}  ${tail}`;
  } else {
    line = `${s.phase} ${count} ${Math.round(frac * 100)}%  ${tail}`;
  }
  return line.length <= max ? line : `${line.slice(0, max - 1)}…`;
}

/** Writes progress to a stream in the chosen mode. */
export class Progress {
  private readonly mode: "bar" | "lines" | "off";
  private readonly out: NodeJS.WriteStream;
  private readonly startMs = performance.now();
  private lastDraw = 0;
  private drewBar = false;
  private readonly intervalMs: number;

  /**
   * @param mode auto: bar when `out` is a TTY, lines otherwise
   * @param out stderr by default
   */
  constructor(mode: ProgressMode, out: NodeJS.WriteStream = process.stderr, intervalMs = 2000) {
    this.out = out;
    this.mode = mode === "auto" ? (out.isTTY ? "bar" : "lines") : mode;
    this.intervalMs = this.mode === "bar" ? 100 : intervalMs;
  }

  /** Shows `s` if enough time passed since the last update (or `force`). */
  update(s: ProgressState, force = false): void {
    if (this.mode === "off") return;
    const now = performance.now();
    if (!force && now - this.lastDraw < this.intervalMs) return;
    this.lastDraw = now;
    const secs = ((now - this.startMs) / 1000).toFixed(1);
    const tail = `${s.tokens} tok  ${s.rounds} rounds  acc ${s.meanAccepted.toFixed(2)}  ec ${s.ecLoaded}${s.faults > 0 ? `  faults ${s.faults}` : ""}  ${secs}s`;
    if (this.mode === "bar") {
      this.out.write(`\r\x1b[2K${barLine(s, tail, this.out.columns)}`);
      this.drewBar = true;
    } else {
      this.out.write(`[harness] ${s.phase}: ${s.done}/${s.total} requests, ${tail}\n`);
    }
  }

  /** Prints a message on its own line (clearing the bar first). */
  note(msg: string): void {
    if (this.mode === "off") return;
    if (this.drewBar) this.out.write("\r\x1b[2K");
    this.out.write(`[harness] ${msg}\n`);
    this.lastDraw = 0;
  }

  /** Ends the bar's line. */
  finish(): void {
    if (this.drewBar) this.out.write("\r\x1b[2K");
    this.drewBar = false;
  }
}
