import { spawnSync } from "node:child_process";
import { decode, encode } from "@msgpack/msgpack";
import { Registry } from "@tapwire/stats";
import { spawnBin } from "@tapwire/testing";
import { describe, expect, it } from "vitest";
import { Dealer } from "zeromq";
import { ConsumerConnector } from "../src/index.js";
import { Driver } from "./helpers/drive.js";
import { PRODUCER_BIN } from "./helpers/proc.js";

// Issue 19 item 2: a producer bound to a wildcard announces an address consumers can connect to
// (the rule of @tapwire/stats advertiseEndpoint), in its listening line and in every grant's
// agent metadata (EC-CONTRACT 5.3), across a real process boundary.
const BB = 4096;
const NBYTES = 3 * BB + 17;

/** One XferReq built from the EC-CONTRACT 3 key table (not by the package's encoder); the raw ack map. */
async function rawAck(control: string, compat: string): Promise<Record<string, unknown>> {
  const d = new Dealer({ linger: 0, receiveTimeout: 15_000 });
  d.connect(control);
  try {
    await d.send(
      encode({ mm_hash: "img", compatibility_hash: compat, session_id: "raw-adv", connector_version: 2 }),
    );
    const [reply] = await d.receive();
    return decode(reply!) as Record<string, unknown>;
  } finally {
    d.close();
  }
}

describe("tapwire-ec-producer --advertise (issue 19)", () => {
  it("bound to 0.0.0.0, it announces the --advertise host; a consumer that knows only that gets the transfer", async () => {
    // 127.0.0.2 is neither the bind address nor a wildcard; Linux delivers all of 127/8 to lo.
    const child = await spawnBin(PRODUCER_BIN, [
      "--control",
      "tcp://0.0.0.0:0",
      "--data",
      "tcp://0.0.0.0:0",
      "--advertise",
      "127.0.0.2",
      "--block-bytes",
      String(BB),
      "--num-blocks",
      "64",
      "--prepopulate",
      `img:${NBYTES}`,
      "--log-level",
      "error",
    ]);
    try {
      const l = child.readyLine.json!;
      const bind = l["bind"] as { control: string; data: string };
      const dataPort = /^tcp:\/\/0\.0\.0\.0:(\d+)$/.exec(bind.data)?.[1];
      const controlPort = /^tcp:\/\/0\.0\.0\.0:(\d+)$/.exec(bind.control)?.[1];
      expect(dataPort).toBeDefined();
      expect(controlPort).toBeDefined();
      expect(l["data"]).toBe(`tcp://127.0.0.2:${dataPort}`);
      expect(l["control"]).toBe(`tcp://127.0.0.2:${controlPort}`);
      expect(l["advertise"]).toEqual({ host: "127.0.0.2", source: "advertise" });
      const compat = String(l["compatibilityHash"]);
      // the grant's agent metadata carries the advertised data endpoint, never 0.0.0.0
      const ack = await rawAck(String(l["control"]), compat);
      expect(ack["status"]).toBe(0);
      const meta = decode(ack["agent_metadata"] as Uint8Array) as { endpoint: string };
      expect(meta.endpoint).toBe(`tcp://127.0.0.2:${dataPort}`);
      // a consumer that knows only the announced control endpoint loads the entry
      const consumer = await ConsumerConnector.create({
        numBlocks: 64,
        blockBytes: BB,
        compatibility: compat,
        registry: new Registry(),
      });
      const d = new Driver(consumer).start();
      try {
        expect(await d.fetch("img", String(l["control"]), NBYTES, 15_000)).toBe("loaded");
        expect(d.mismatched).toEqual([]);
      } finally {
        d.stop();
        await consumer.close();
      }
    } finally {
      await child.kill("SIGTERM");
    }
  });

  it("a bad --advertise exits 2 naming it", () => {
    for (const a of ["0.0.0.0", "[::]", "host:0", "a b"]) {
      const r = spawnSync(process.execPath, [PRODUCER_BIN, "--advertise", a], {
        encoding: "utf8",
        timeout: 20_000,
      });
      expect(r.status, a).toBe(2);
      expect(r.stderr).toMatch(/--advertise/);
    }
  });

  it("bound to 0.0.0.0 where no interface but loopback is up, without --advertise: exit 2 naming --advertise", () => {
    // A network namespace of this test's own (only `lo`, down): no address to announce. Root only
    // (CI is root); removed also after failure.
    const ns = `i19adv-${process.pid}`;
    expect(spawnSync("ip", ["netns", "add", ns]).status).toBe(0);
    try {
      const r = spawnSync(
        "ip",
        [
          "netns",
          "exec",
          ns,
          process.execPath,
          PRODUCER_BIN,
          "--data",
          "tcp://0.0.0.0:0",
          "--control",
          "tcp://0.0.0.0:0",
        ],
        { encoding: "utf8", timeout: 20_000 },
      );
      expect(r.stderr).toMatch(/no non-loopback interface is up.*--advertise HOST\[:PORT\]/);
      expect(r.status).toBe(2);
      // with --advertise it starts (and announces what it was told)
      const ok = spawnSync(
        "ip",
        [
          "netns",
          "exec",
          ns,
          "sh",
          "-c",
          `ip link set lo up && timeout -s INT 3 ${process.execPath} ${PRODUCER_BIN} --data tcp://0.0.0.0:0 --control tcp://0.0.0.0:0 --advertise 10.99.0.1`,
        ],
        { encoding: "utf8", timeout: 20_000 },
      );
      const listening = ok.stdout.split("\n").find((x) => x.includes('"msg":"listening"'));
      expect(listening).toBeDefined();
      expect(JSON.parse(listening!).data).toMatch(/^tcp:\/\/10\.99\.0\.1:\d+$/);
    } finally {
      spawnSync("ip", ["netns", "del", ns]);
    }
  });
});
