// The README example, verbatim except for the import path (test/readme.test.ts keeps them equal).
import { once } from "node:events";
import { connect } from "node:net";
import { afterAll, expect, test } from "vitest";
import { killAllChildren, startEchoServer, startFaultProxy } from "../src/index.js";

afterAll(killAllChildren);

test("a reply corrupted on the way back is seen by the client", async () => {
  const echo = await startEchoServer(); // stands in for a worker
  const proxy = await startFaultProxy(echo.target); // listens on tcp://127.0.0.1:<port>
  proxy.setFault({ kind: "corrupt", offset: 2, direction: "down" });
  const s = connect({ host: "127.0.0.1", port: proxy.port });
  s.write(Buffer.from([1, 2, 3, 4]));
  const [reply] = (await once(s, "data")) as [Buffer];
  expect([...reply]).toEqual([1, 2, 3 ^ 0xff, 4]);
  expect(proxy.stats.faults.corrupt).toBe(1);
  s.destroy();
  await proxy.close();
  await echo.close();
});
