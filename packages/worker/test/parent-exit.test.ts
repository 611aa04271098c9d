// Issue 19: children die with their parent. A supervisor that starts tapwire-worker with
// --exit-with-parent (stdin a pipe it holds) is SIGKILLed: the worker must notice the pipe's end,
// close its listeners and exit, whatever signal killed the supervisor; its port is free after.
import net from "node:net";
import { isAlive, type Supervisor, startSupervisor, waitUntil } from "@tapwire/testing";
import { afterEach, describe, expect, test } from "vitest";
import { BIN } from "./spawn.js";

const started: Supervisor[] = [];
afterEach(() => {
  for (const s of started.splice(0)) s.cleanup();
});

/** Whether 127.0.0.1:port can be bound again (the worker released it). */
function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

const ARGS = ["--drafter", "null", "--listen", "tcp://127.0.0.1:0", "--num-taps", "1", "--hidden", "8"];

describe("tapwire-worker --exit-with-parent (issue 19)", () => {
  test("SIGKILL of the supervisor: the worker exits cleanly and frees its port", async () => {
    const sup = await startSupervisor([{ bin: BIN, args: [...ARGS, "--exit-with-parent"] }]);
    started.push(sup);
    const w = sup.children[0]!;
    const port = Number(new URL(String((w.listening.endpoints as string[])[0])).port);
    expect(await portFree(port)).toBe(false);
    sup.proc.kill("SIGKILL");
    await waitUntil(() => !isAlive(w.pid), { timeoutMs: 20_000, what: `worker ${w.pid} to exit` });
    expect(await portFree(port)).toBe(true);
    const msgs = sup.linesOf(w).map((l) => `${l.msg}${l.signal !== undefined ? ` ${l.signal}` : ""}`);
    expect(msgs).toContain("closing parent-exit");
    expect(msgs).toContain("closed");
  }, 40_000);

  test("without the flag the worker outlives its supervisor (what the flag is for)", async () => {
    const sup = await startSupervisor([{ bin: BIN, args: ARGS }]);
    started.push(sup);
    const w = sup.children[0]!;
    sup.proc.kill("SIGKILL");
    await waitUntil(() => !isAlive(sup.proc.pid!), { timeoutMs: 10_000, what: "the supervisor to die" });
    // Bounded: a second of the worker still serving after its parent died.
    await new Promise((r) => setTimeout(r, 1000));
    expect(isAlive(w.pid)).toBe(true);
  }, 40_000);
});
