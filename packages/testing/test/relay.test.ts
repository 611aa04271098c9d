// The relay process on loopback (no namespace, no root): forwards with the link's delay, answers
// bad commands with typed errors, and dies with its parent whatever killed it.
import { connect } from "node:net";
import { fileURLToPath } from "node:url";
import { afterEach, expect, test } from "vitest";
import { isAlive, killAllChildren, spawnBin, startEchoServer, startRelay, waitUntil } from "../src/index.js";

const PARENT = fileURLToPath(new URL("./fixtures/relay-parent.mjs", import.meta.url));
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
  await killAllChildren();
});

test("a forward delays both directions; bad commands are TESTING_RELAY errors naming the problem", async () => {
  const echo = await startEchoServer();
  cleanups.push(() => echo.close());
  const relay = await startRelay({ link: "delay=5ms seed=4" });
  cleanups.push(() => relay.close());
  expect(relay.link.delayMs).toBe(5);
  const port = await relay.forward({ host: "127.0.0.1", port: 0 }, { host: "127.0.0.1", port: echo.port });
  expect(port).toBeGreaterThan(0);
  const s = connect({ host: "127.0.0.1", port, noDelay: true });
  cleanups.push(async () => void s.destroy());
  await new Promise((r) => s.once("connect", r));
  const t0 = performance.now();
  const got = new Promise((r) => s.once("data", r));
  s.write("ping");
  await got;
  expect(performance.now() - t0).toBeGreaterThanOrEqual(10);
  const [f] = await relay.stats();
  expect(f).toMatchObject({ listen: `127.0.0.1:${port}`, target: `127.0.0.1:${echo.port}` });
  expect(f!.stats.link.delayed).toBeGreaterThanOrEqual(2);
  await expect(
    relay.forward({ host: "127.0.0.1", port }, { host: "127.0.0.1", port: echo.port }),
  ).rejects.toMatchObject({
    code: "TESTING_RELAY",
    message: expect.stringMatching(/EADDRINUSE/),
  });
  await expect(relay.forward({ host: "127.0.0.1", port: 0 }, { host: "127.0.0.1", port: 0 })).rejects.toThrow(
    /target must be \{ host, port \}/,
  );
  await expect(relay.unforward({ host: "127.0.0.1", port: 1 })).rejects.toThrow(/no forward on 127.0.0.1:1/);
  await relay.unforward({ host: "127.0.0.1", port });
  expect(await relay.stats()).toEqual([]);
  await expect(startRelay({ link: "delay=1ms jitter=3ms" })).rejects.toThrow(
    /jitter 3 ms is above delay 1 ms/,
  );
});

test("the relay exits when its parent is SIGKILLed (its stdin closes)", async () => {
  const parent = await spawnBin(PARENT, []);
  const relayPid = parent.readyLine.json!.relay as number;
  expect(isAlive(relayPid)).toBe(true);
  await parent.kill("SIGKILL");
  await waitUntil(() => !isAlive(relayPid), { timeoutMs: 20_000, what: "the orphaned relay gone" });
});
