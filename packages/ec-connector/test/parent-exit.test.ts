// Issue 19: children die with their parent. A supervisor that starts tapwire-ec-producer with
// --exit-with-parent (stdin a pipe it holds) is SIGKILLed: the producer must notice the pipe's
// end, close its sockets and exit; its control and data ports are free after.
//
// "Exited" means every thread of the producer, not only its main one: `isAlive` reads the
// thread-group leader, a zombie as soon as the main thread is done with `exit_group`, while the
// other threads (libzmq's I/O thread among them, which closes the control listener) are still
// exiting and still hold the process's files. On a loaded machine that window is long enough
// for a bind to the control port to fail. And "its ports are freed" is checked on the
// producer's own sockets (by inode in /proc/net/tcp), so that another test taking the same
// ephemeral port once it is free cannot fail it.
import net from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { isAlive, type Supervisor, startSupervisor, waitUntil } from "@tapwire/testing";
import { afterEach, describe, expect, test } from "vitest";
import { liveThreads, socketInodesOf, tcpSockets } from "./helpers/sockets.js";

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
    // the producer's own listening sockets on its two ports
    const mine = socketInodesOf(p.pid);
    const held = new Set(
      tcpSockets()
        .filter((s) => ports.includes(s.port) && s.state === "0A" && mine.has(s.inode))
        .map((s) => s.inode),
    );
    for (const port of ports) {
      expect(tcpSockets().some((s) => s.port === port && held.has(s.inode))).toBe(true);
    }
    sup.proc.kill("SIGKILL");
    await waitUntil(() => !isAlive(p.pid) && liveThreads(p.pid) === 0, {
      timeoutMs: 20_000,
      what: `every thread of producer ${p.pid} to exit`,
    });
    // every thread gone: the kernel closed its files, none of its sockets is left
    expect(tcpSockets().filter((s) => held.has(s.inode))).toEqual([]);
    for (const port of ports) {
      // free, unless another test's socket took the ephemeral port since
      const other = () => tcpSockets().some((s) => s.port === port && s.inode !== 0 && !held.has(s.inode));
      expect((await portFree(port)) || other()).toBe(true);
    }
    const msgs = sup.linesOf(p).map((l) => `${l.msg}${l.signal !== undefined ? ` ${l.signal}` : ""}`);
    expect(msgs).toContain("closing parent-exit");
    expect(msgs).toContain("closed parent-exit");
  }, 40_000);
});
