/**
 * Issue 21: etcd as a child that dies with the harness. etcd itself cannot watch a parent pipe,
 * so the harness starts this small keeper (`node etcd-main.js --exit-with-parent`), which starts
 * a loopback etcd (`@tapwire/testing` startEtcd: free ports, a temp data dir), prints its
 * `listening` line (`endpoint`, `clientUrl`, `etcdPid`), obeys `{"cmd":"stop"}` and
 * `{"cmd":"start"}` lines on stdin (answering `{"msg":"etcd","state":…}`), and when stdin ends
 * (the harness died, SIGKILL included) or on SIGTERM kills etcd, removes its data dir and exits.
 */
import { createInterface } from "node:readline";
import { startEtcd } from "@tapwire/testing";

const out = (o: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(o)}\n`);

async function main(): Promise<void> {
  const etcd = await startEtcd();
  let ending = false;
  const end = async () => {
    if (ending) return;
    ending = true;
    await etcd.close().catch(() => undefined);
    process.exit(0);
  };
  process.once("SIGTERM", () => void end());
  process.once("SIGINT", () => void end());
  // commands in order: a start never overtakes the stop before it
  let chain: Promise<void> = Promise.resolve();
  const rl = createInterface({ input: process.stdin });
  rl.on("line", (l) => {
    let cmd: unknown;
    try {
      cmd = (JSON.parse(l) as { cmd?: unknown }).cmd;
    } catch {
      return;
    }
    chain = chain.then(async () => {
      if (cmd === "stop") {
        await etcd.stop();
        out({ msg: "etcd", state: "stopped" });
      } else if (cmd === "start") {
        await etcd.start();
        out({ msg: "etcd", state: "started", etcdPid: etcd.pid });
      }
    });
  });
  if (process.argv.includes("--exit-with-parent")) rl.once("close", () => void end());
  out({ msg: "listening", endpoint: etcd.endpoint, clientUrl: etcd.clientUrl, etcdPid: etcd.pid });
}

main().catch((e: unknown) => {
  process.stderr.write(`etcd keeper: ${e instanceof Error ? e.message : String(e)}\n`);
  process.exit(3);
});
