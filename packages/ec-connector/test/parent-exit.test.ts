// Issue 19: children die with their parent. A supervisor that starts tapwire-ec-producer with
// --exit-with-parent (stdin a pipe it holds) is SIGKILLed: the producer must notice the pipe's
// end, close its sockets and exit; its control and data ports are free after.
import net from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { isAlive, type Supervisor, startSupervisor, waitUntil } from "@tapwire/testing";
import { afterEach, describe, expect, test } from "vitest";

const BIN = join(dirname(fileURLToPath(import.meta.url)), "..", "dist", "bin", "producer.js");
const started: Supervisor[] = [];
afterEach(() => {
  for (const s of started.splice(0)) s.cleanup();
});

function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

const portOf = (ep: unknown) => Number(/:(\d+)$/.exec(String(ep))?.[1]);

describe("tapwire-ec-producer --exit-with-parent (issue 19)", () => {
  test("SIGKILL of the supervisor: the producer exits cleanly and frees its ports", async () => {
    const args = ["--control", "tcp://127.0.0.1:0", "--data", "tcp://127.0.0.1:0", "--num-blocks", "16"];
    const sup = await startSupervisor([{ bin: BIN, args: [...args, "--exit-with-parent"] }]);
    started.push(sup);
    const p = sup.children[0]!;
    const ports = [portOf(p.listening.control), portOf(p.listening.data)];
    for (const port of ports) expect(await portFree(port)).toBe(false);
    sup.proc.kill("SIGKILL");
    await waitUntil(() => !isAlive(p.pid), { timeoutMs: 20_000, what: `producer ${p.pid} to exit` });
    for (const port of ports) expect(await portFree(port)).toBe(true);
    const msgs = sup.linesOf(p).map((l) => `${l.msg}${l.signal !== undefined ? ` ${l.signal}` : ""}`);
    expect(msgs).toContain("closing parent-exit");
    expect(msgs).toContain("closed parent-exit");
  }, 40_000);
});
