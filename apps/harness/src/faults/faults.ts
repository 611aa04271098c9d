/**
 * `--faults`: a fixed schedule of faults injected while the engine runs, each after the previous
 * one recovered, with what recovering took (counter deltas from the injection until the next
 * fault or the end of the run: reconnects, resyncs, retries, fallbacks).
 *
 * - link_stall: the fault proxy holds every byte for longer than the STEP timeout (client
 *   timeouts, reconnect, resync);
 * - worker_kill: SIGKILL of the drafter worker, restarted on the same endpoint (transport errors,
 *   connect failures while it is down, a new epoch, resync of every slot);
 * - encoder_restart: SIGKILL of the encoder, restarted on the same control endpoint (transfers
 *   in flight fail; retries, re-registration of the new agent, local fallbacks);
 * - corrupt_reply: every connection is dropped and one byte of the first STEP reply on the new
 *   connection is flipped (a refused reply, reconnect, resync).
 * The engine never waits for any of this: rounds go on target-only while the link is down.
 */
import type { FaultProxy } from "@tapwire/testing";
import type { RoundHook } from "../engine/engine.js";
import type { ChildService } from "../procs/procs.js";
import type { FaultRecord } from "../report/report.js";

/** What the fault driver acts on and observes. */
export interface FaultTargets {
  worker: ChildService;
  encoder: ChildService | null;
  /** The proxy between client and worker (tcp only), or null. */
  proxy: FaultProxy | null;
  /** The client's connection epoch (successful HELLOs so far). */
  linkEpoch(): number;
  /** True while the client has a ready connection. */
  ready(): boolean;
  /** Embedding transfers completed so far. */
  ecOk(): number;
  /** Embedding transfers in flight now (the encoder is restarted while one is, when it can be). */
  ecInFlight(): number;
  /** Starts one probe transfer of an item no request needs (after the encoder restart). */
  probeEncoder(): void;
  /** Counters whose deltas describe a recovery (client outcomes, hellos, resyncs, EC retries, ...). */
  counters(): Record<string, number>;
  /** STEP timeout of the client (a stall must outlast it). */
  stepTimeoutMs: number;
  log(msg: string): void;
}

type Kind = FaultRecord["kind"];

interface Planned {
  kind: Kind;
  /** Fraction of requests completed before it fires. */
  at: number;
}

/** Held-back requests let through per phase of the schedule when one running request is enough. */
const MAX_TRICKLES = 2;
/** Quiet time after a recovery before the next fault, so that its effects are attributed to it. */
const QUIET_MS = 500;
/** How long a fault may wait past its threshold for a better moment (a transfer in flight). */
const MOMENT_WAIT_MS = 1000;

/** The schedule: fractions of completed requests. */
export const FAULT_PLAN: readonly Planned[] = [
  { kind: "link_stall", at: 0.1 },
  { kind: "worker_kill", at: 0.2 },
  { kind: "encoder_restart", at: 0.3 },
  { kind: "corrupt_reply", at: 0.4 },
];

/** Offset of the first STEP reply's seq byte on a new connection: HELLO reply (4 + 24 + 128), length prefix, header offset 8. */
export const CORRUPT_OFFSET = 4 + 24 + 128 + 4 + 8;
/** Share of requests that arrive on schedule while faults are still pending. */
export const HOLD_BACK = 0.6;
/** Give up waiting for a recovery after this long and move on. */
const RECOVERY_GIVE_UP_MS = 15_000;

interface Active {
  rec: FaultRecord;
  before: Record<string, number>;
  /** True once the fault's own action is over (restart done, stall released, byte flipped). */
  cleared: boolean;
  /** Link: the connection epoch the recovery must pass; encoder: completed transfers. */
  baseline: number;
  injectedAt: number;
}

/** How the process `pid` of `svc` ended, from its exit records (null if not seen). */
function lastExit(svc: ChildService, pid: number | null): FaultRecord["killedExit"] {
  const e = [...svc.exits].reverse().find((x) => x.pid === pid);
  return e ? { code: e.code, signal: e.signal } : null;
}

/** Drives {@link FAULT_PLAN} from the engine's round hook. */
export class FaultDriver {
  private next = 0;
  private dueSince: number | null = null;
  /** The fault whose recovery is awaited. */
  private active: Active | null = null;
  /** The last fault injected: its record collects counter deltas until the next one. */
  private open: Active | null = null;
  private completed = 0;
  private total = 0;
  private quietUntil = 0;
  private now = 0;
  private phase = "";
  private trickles = 0;
  private readonly records: FaultRecord[] = [];
  private readonly pending: Array<Promise<void>> = [];
  private readonly plan: Planned[];
  /** Errors of fault actions (a restart that failed), reported. */
  readonly errors: string[] = [];
  /** Faults of the plan left out for this configuration, with why. */
  readonly skipped: string[] = [];

  constructor(private readonly t: FaultTargets) {
    this.plan = FAULT_PLAN.filter((p) => {
      if ((p.kind === "link_stall" || p.kind === "corrupt_reply") && !t.proxy) {
        this.skipped.push(`fault ${p.kind} skipped: it needs the fault proxy (--draft-transport tcp)`);
        t.log(this.skipped[this.skipped.length - 1] as string);
        return false;
      }
      if (p.kind === "encoder_restart" && !t.encoder) return false;
      return true;
    });
  }

  /** Faults injected so far. */
  get injected(): readonly FaultRecord[] {
    return this.records;
  }

  /** The engine's round hook. */
  readonly hook: RoundHook = ({ completed, total, elapsedMs, running }) => {
    this.completed = completed;
    this.total = total;
    this.now = elapsedMs;
    this.checkRecovery(elapsedMs);
    if (this.active || elapsedMs < this.quietUntil) return;
    const p = this.plan[this.next];
    if (!p || completed < p.at * total) return;
    this.dueSince ??= elapsedMs;
    // link faults only while requests run, so that the next round's STEP meets them
    if ((p.kind === "link_stall" || p.kind === "corrupt_reply") && running === 0) return;
    // the encoder is restarted mid-transfer when possible (the interesting case: reads in flight)
    if (
      p.kind === "encoder_restart" &&
      this.t.ecInFlight() === 0 &&
      elapsedMs - this.dueSince < MOMENT_WAIT_MS
    )
      return;
    this.next++;
    this.dueSince = null;
    this.inject(p.kind, elapsedMs);
  };

  private checkRecovery(nowMs: number): void {
    const a = this.active;
    if (!a) return;
    const t = this.t;
    if (
      a.rec.kind === "corrupt_reply" &&
      !a.cleared &&
      t.proxy &&
      t.proxy.stats.faults.corrupt > a.baseline
    ) {
      // one flipped byte is enough: new connections must pass untouched
      t.proxy.setFault(null);
      a.cleared = true;
      a.baseline = t.linkEpoch();
    }
    let recovered = false;
    if (a.cleared) {
      // the link is back once a HELLO succeeded after the fault (a newer epoch: every slot resyncs
      // on its next round); the encoder once a transfer completed after the restart
      recovered =
        a.rec.kind === "encoder_restart" ? t.ecOk() > a.baseline : t.ready() && t.linkEpoch() > a.baseline;
    }
    if (recovered) {
      a.rec.recoveredAfterMs = nowMs - a.injectedAt;
    } else if (nowMs - a.injectedAt < RECOVERY_GIVE_UP_MS) {
      return;
    }
    // let the recovery show (resync rounds, retried transfers) before the next fault
    this.quietUntil = nowMs + QUIET_MS;
    t.log(
      `fault ${a.rec.kind}: ${recovered ? `recovered after ${Math.round(nowMs - a.injectedAt)} ms` : "no recovery observed"}`,
    );
    this.active = null;
  }

  /** Records what happened since `a` was injected (until the next fault or the end of the run). */
  private close(a: Active): void {
    const after = this.t.counters();
    for (const [k, v] of Object.entries(after)) {
      const d = v - (a.before[k] ?? 0);
      if (d !== 0) a.rec.recovery[k] = d;
    }
  }

  private inject(kind: Kind, nowMs: number): void {
    const t = this.t;
    if (this.open) this.close(this.open);
    const rec: FaultRecord = {
      kind,
      atMs: nowMs,
      detail: "",
      recovery: {},
      recoveredAfterMs: null,
      killedPid: null,
      killedExit: null,
      newPid: null,
    };
    const a: Active = {
      rec,
      before: t.counters(),
      cleared: false,
      baseline: t.linkEpoch(),
      injectedAt: nowMs,
    };
    this.records.push(rec);
    this.active = a;
    this.open = a;
    const run = (what: Promise<void>) => {
      this.pending.push(
        what.catch((e: unknown) => {
          const msg = `${kind}: ${e instanceof Error ? e.message : String(e)}`;
          this.errors.push(msg);
          t.log(`fault action failed: ${msg}`);
        }),
      );
    };
    switch (kind) {
      case "link_stall": {
        const ms = Math.max(300, 2 * t.stepTimeoutMs);
        rec.detail = `proxy held all bytes for ${ms} ms (STEP timeout ${t.stepTimeoutMs} ms)`;
        t.proxy!.setFault({ kind: "stall" });
        run(
          new Promise<void>((resolve) => {
            setTimeout(() => {
              t.proxy!.setFault(null);
              a.cleared = true;
              resolve();
            }, ms);
          }),
        );
        break;
      }
      case "worker_kill": {
        const pid = t.worker.pid;
        rec.killedPid = pid;
        rec.detail = `SIGKILL worker pid ${pid}, restarted on the same endpoint`;
        run(
          (async () => {
            await t.worker.kill("SIGKILL");
            rec.killedExit = lastExit(t.worker, pid);
            await new Promise((r) => setTimeout(r, 50));
            await t.worker.start();
            rec.newPid = t.worker.pid;
            rec.detail += ` (new pid ${t.worker.pid})`;
            a.cleared = true;
          })(),
        );
        break;
      }
      case "encoder_restart": {
        const enc = t.encoder!;
        const pid = enc.pid;
        rec.killedPid = pid;
        rec.detail = `SIGKILL encoder pid ${pid} with ${t.ecInFlight()} transfer(s) in flight, restarted on the same control endpoint`;
        run(
          (async () => {
            a.baseline = t.ecOk();
            await enc.kill("SIGKILL");
            rec.killedExit = lastExit(enc, pid);
            await new Promise((r) => setTimeout(r, 100));
            await enc.start();
            rec.newPid = enc.pid;
            rec.detail += ` (new pid ${enc.pid}); a probe transfer checks it serves again`;
            a.baseline = t.ecOk();
            a.cleared = true;
            t.probeEncoder();
          })(),
        );
        break;
      }
      case "corrupt_reply": {
        rec.detail = `dropped the link's connections, flipped byte ${CORRUPT_OFFSET} of the reply stream (first STEP reply's seq)`;
        a.baseline = t.proxy!.stats.faults.corrupt;
        t.proxy!.setFault({ kind: "corrupt", offset: CORRUPT_OFFSET, direction: "down" });
        t.proxy!.dropAll();
        break;
      }
    }
    t.log(`fault injected: ${kind}: ${rec.detail}`);
  }

  /** Waits for fault actions still running (a restart) and closes the last record. */
  async settle(): Promise<void> {
    await Promise.all(this.pending);
    if (this.active?.rec.kind === "corrupt_reply") this.t.proxy?.setFault(null);
    this.active = null;
    if (this.open) this.close(this.open);
    this.open = null;
  }

  /** True once every planned fault fired and recovered (or was given up). */
  get done(): boolean {
    return this.next >= this.plan.length && this.active === null;
  }

  /**
   * The engine's arrival cap: until the schedule is done, only the first {@link HOLD_BACK} share
   * of requests arrives on time; after that one more arrives whenever nothing runs and the
   * schedule needs traffic (a fault waiting to meet a STEP, a transfer after the encoder restart),
   * and none while a restarted worker is awaited, so the run cannot end before the last fault
   * recovered, however slow the machine.
   */
  readonly arrivalCap = (p: { arrived: number; running: number; total: number; waiting: number }): number => {
    if (this.done) return Number.POSITIVE_INFINITY;
    const free = Math.floor(HOLD_BACK * p.total);
    if (p.arrived < free) return free;
    if (p.running > 0 || p.waiting === 0) return p.arrived;
    const need = this.trafficNeed();
    const a = this.active;
    const phase = `${this.next}:${a ? (a.cleared ? "cleared" : "active") : this.now < this.quietUntil ? "quiet" : "waiting"}`;
    if (phase !== this.phase) {
      this.phase = phase;
      this.trickles = 0;
    }
    if (need === "none" || (need === "some" && this.trickles >= MAX_TRICKLES)) return p.arrived;
    this.trickles++;
    return p.arrived + 1;
  };

  /**
   * Whether the schedule can only move on with a request running: "unlimited" while completions
   * are needed to reach the next threshold, "some" (at most {@link MAX_TRICKLES} requests per
   * phase) when one running request is enough, "none" while a restart is awaited.
   */
  private trafficNeed(): "none" | "some" | "unlimited" {
    const a = this.active;
    if (!a) {
      const p = this.plan[this.next];
      if (!p) return "none";
      if (this.completed < p.at * this.total) return "unlimited";
      if (this.now < this.quietUntil) return "some"; // the recovery's resync rounds need a request
      // link faults need a running request; the encoder restart waits for a transfer in flight
      // (or its timeout), not for traffic
      return p.kind === "encoder_restart" ? "none" : "some";
    }
    switch (a.rec.kind) {
      case "corrupt_reply":
        // a STEP on the new connection must meet the flipped byte: traffic once it is up
        return !a.cleared && this.t.ready() ? "some" : "none";
      default:
        // a reconnect needs no traffic; the encoder's probe transfer proves its recovery
        return "none";
    }
  }

  /** Faults of the plan that never fired (the run ended first). */
  get notInjected(): Kind[] {
    return this.plan.slice(this.next).map((p) => p.kind);
  }
}
