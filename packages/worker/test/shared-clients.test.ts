// CONTRACT 12.1 checked from outside (issue 20 "Done when"): four copies of an independent client
// written from the contract in another language (Python 3, stdlib only: fixtures/contract_client.py)
// run their scenario at once against one `tapwire-worker --max-sessions 4` bin, each checking every
// reply; a fifth gets BUSY while all four are live and is admitted once one closes its connection;
// STATS on one session's connection never shows another's id or seq; a RESET of one leaves the
// others' windows whole.
import { type ChildProcess, spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, test } from "vitest";
import { children, spawnWorker } from "./spawn.js";

const CLIENT = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "contract_client.py");
// Python 3 is on every machine this suite runs on (Debian; CI installs it): no skip.
const PY = "python3";

afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null) c.kill("SIGKILL");
});

/** A Python client process with a line reader for its JSON events. */
class Py {
  readonly proc: ChildProcess;
  readonly #events: Record<string, unknown>[] = [];
  readonly #waiters: ((e: Record<string, unknown>) => void)[] = [];
  readonly exit: Promise<number | null>;
  constructor(args: string[]) {
    this.proc = spawn(PY, [CLIENT, ...args], { stdio: ["pipe", "pipe", "inherit"] });
    children.push(this.proc);
    this.exit = new Promise((r) => this.proc.on("exit", (c) => r(c)));
    createInterface({ input: this.proc.stdout! }).on("line", (l) => {
      const e = JSON.parse(l) as Record<string, unknown>;
      const w = this.#waiters.shift();
      if (w !== undefined) w(e);
      else this.#events.push(e);
    });
  }
  next(): Promise<Record<string, unknown>> {
    const e = this.#events.shift();
    if (e !== undefined) return Promise.resolve(e);
    return Promise.race([
      new Promise<Record<string, unknown>>((r) => this.#waiters.push(r)),
      this.exit.then((c) => ({ event: "exit", code: c })),
    ]);
  }
  async cmd(line: string): Promise<Record<string, unknown>> {
    this.proc.stdin!.write(`${line}\n`);
    return this.next();
  }
}

describe("CONTRACT 12.1 from outside: Python clients against tapwire-worker --max-sessions 4", () => {
  test("four at once, a fifth BUSY then admitted, STATS isolation, RESET scoped", async () => {
    const w = await spawnWorker([
      "--drafter",
      "null",
      "--listen",
      "tcp://127.0.0.1:0",
      "--max-sessions",
      "4",
      "--num-taps",
      "2",
      "--hidden",
      "16",
      "--window",
      "8",
      "--num-spec",
      "4",
      "--vocab",
      "512",
      "--log-level",
      "warn",
    ]);
    const ep = (w.listening.endpoints as string[])[0]!;
    const [host, port] = ep.slice("tcp://".length).split(":");
    const l = w.listening as Record<string, string | number>;
    const geom = (session: number, name: string) => [
      host!,
      port!,
      String(session),
      name,
      "12",
      String(l.drafterIdentity),
      String(l.markovIdentity),
      String(l.window),
      String(l.numSpec),
      String(l.vocabSize),
      "2",
      "16",
    ];
    const ids = [0x7a3b1c01, 0x7a3b1c02, 0x7a3b1c03, 0x7a3b1c04];
    const four = ids.map((id, k) => new Py(geom(id, `py-engine-${k}`)));
    const ready = await Promise.all(four.map((c) => c.next()));
    for (const r of ready) expect(r, JSON.stringify(r)).toMatchObject({ event: "ready" });
    // A fifth while all four are live: BUSY.
    const fifth = new Py([...geom(0x7a3b1c05, "py-engine-4"), "wait"]);
    expect(await fifth.next()).toEqual({ event: "hello", status: 10 });
    // STATS on each connection: its own id and seq only.
    for (let k = 0; k < 4; k++) {
      const others = ids.filter((_, j) => j !== k).join(",");
      expect(await four[k]!.cmd(`stats ${others}`)).toEqual({ event: "stats", ok: true });
    }
    // RESET of one: its windows empty, the others' whole.
    expect(await four[0]!.cmd("reset")).toEqual({ event: "reset", ok: true });
    for (const c of four.slice(1)) expect(await c.cmd("check")).toEqual({ event: "check", ok: true });
    // One closes its connection (the process ends): the fifth is admitted as soon as the worker
    // has seen the close (bounded retries).
    expect(await four[3]!.cmd("quit")).toEqual({ event: "exit", code: 0 });
    let st: Record<string, unknown> = { status: 10 };
    for (let i = 0; i < 100 && st.status === 10; i++) {
      await new Promise((r) => setTimeout(r, 20));
      st = await fifth.cmd("hello");
    }
    expect(st).toEqual({ event: "hello", status: 0 });
    expect(await fifth.next()).toMatchObject({ event: "ready" });
    const fiveIds = [ids[0], ids[1], ids[2]].join(",");
    expect(await fifth.cmd(`stats ${fiveIds}`)).toEqual({ event: "stats", ok: true });
    for (const c of [...four.slice(0, 3), fifth])
      expect(await c.cmd("check")).toEqual({ event: "check", ok: true });
    for (const c of [...four.slice(0, 3), fifth])
      expect(await c.cmd("quit")).toEqual({ event: "exit", code: 0 });
  }, 60_000);
});
