import { spawnSync } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeTlsCredentials } from "@tapwire/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PRODUCER_BIN } from "./helpers/proc.js";

// Issue 19 item 4: the exit-code policy of every bin (docs/operations.md "Exit codes"):
// 2 usage/config error (never retried: RestartPreventExitStatus=2), 75 (EX_TEMPFAIL) bind
// failure (systemd retries), 1 any other failure; every message names the flag (and the file).
function run(args: string[]): { status: number | null; stderr: string } {
  const r = spawnSync(process.execPath, [PRODUCER_BIN, ...args], { encoding: "utf8", timeout: 20_000 });
  return { status: r.status, stderr: r.stderr };
}

describe("tapwire-ec-producer exit codes and messages (issue 19)", () => {
  const dir = join(tmpdir(), `ec-exit-${process.pid}`);
  let held: ReturnType<typeof createServer>;
  let port = 0;
  const f = (name: string) => join(dir, name);

  beforeAll(async () => {
    spawnSync("mkdir", ["-p", dir]);
    const tls = makeTlsCredentials();
    writeFileSync(f("cert.pem"), tls.serverCert);
    writeFileSync(f("key.pem"), tls.serverKey);
    writeFileSync(f("ca.pem"), tls.ca);
    writeFileSync(f("junk.txt"), "not a pem\n");
    writeFileSync(f("keys.json"), '{"publicKey":"short","secretKey":"short"}\n');
    writeFileSync(f("prepop.txt"), "img-a 1000\nbroken\n");
    held = createServer();
    await new Promise<void>((r) => held.listen(0, "127.0.0.1", r));
    port = (held.address() as { port: number }).port;
  });
  afterAll(async () => {
    await new Promise((r) => held.close(r));
    rmSync(dir, { recursive: true, force: true });
  });

  it("an address in use exits 75 naming the flag, for --control, --data and --metrics-listen", () => {
    for (const flag of ["control", "data", "metrics-listen"]) {
      const r = run([`--${flag}`, `tcp://127.0.0.1:${port}`]);
      expect(r.status, flag).toBe(75);
      expect(r.stderr, flag).toMatch(
        new RegExp(`^tapwire-ec-producer: --${flag}\\b.*(in use|EADDRINUSE)`, "i"),
      );
      expect(r.stderr.trimEnd().split("\n")).toHaveLength(1);
    }
  });

  it("an address not on this host exits 75 (EADDRNOTAVAIL: maybe not up yet)", () => {
    // 203.0.113.0/24 is TEST-NET-3 (RFC 5737): on no interface of this host
    const r = run(["--data", "tcp://203.0.113.77:0"]);
    expect(r.status).toBe(75);
    expect(r.stderr).toMatch(/--data/);
  });

  it("a --data unix path that is not a socket can never be bound: exit 2, not 75", () => {
    const r = run(["--data", `unix://${f("junk.txt")}`]);
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/--data/);
  });

  it("option values are named by their flags, never the internal option names", () => {
    const cases: [string[], RegExp][] = [
      [["--num-blocks", "0"], /--num-blocks: expected an integer/],
      [["--pin-lease-ms", "-5"], /--pin-lease-ms: expected a number/],
      [["--max-pinned-fraction", "2"], /--max-pinned-fraction: expected a number in \[0, 1\]/],
      [["--admin", "tcp://10.1.2.3:0"], /--admin: .*not loopback.*--admin-allow-remote/],
      [["--max-data-connections", "0"], /--max-data-connections: expected an integer/],
      [["--heartbeat-ttl-ms", "99999999"], /--heartbeat-ttl-ms: expected an integer/],
    ];
    for (const [args, re] of cases) {
      const r = run(args);
      expect(r.status, args.join(" ")).toBe(2);
      expect(r.stderr, args.join(" ")).toMatch(re);
      expect(r.stderr, args.join(" ")).not.toMatch(/option [a-z]+[A-Z]|adminAllowRemote|numBlocks/);
    }
  });

  it("unreadable or invalid files exit 2 naming the flag and the file", () => {
    const tlsOk = ["--tls-key", f("key.pem"), "--tls-ca", f("ca.pem")];
    const cases: [string[], string][] = [
      [["--tls-cert", f("junk.txt"), ...tlsOk, "--data", "tls://127.0.0.1:0"], `--tls-cert ${f("junk.txt")}`],
      [
        ["--tls-cert", f("cert.pem"), "--tls-key", f("junk.txt"), "--tls-ca", f("ca.pem")],
        `--tls-key ${f("junk.txt")}`,
      ],
      [
        ["--tls-cert", f("cert.pem"), "--tls-key", f("key.pem"), "--tls-ca", f("nope.pem")],
        `--tls-ca: cannot read ${f("nope.pem")}`,
      ],
      [["--curve-keys", f("keys.json"), "--curve-allow", f("junk.txt")], `--curve-keys ${f("keys.json")}`],
      [["--curve-keys", f("junk.txt"), "--curve-allow", f("junk.txt")], `--curve-keys ${f("junk.txt")}`],
      [["--prepopulate-file", f("prepop.txt")], `--prepopulate-file ${f("prepop.txt")}`],
    ];
    for (const [args, text] of cases) {
      const r = run(args);
      expect(r.status, args.join(" ")).toBe(2);
      expect(r.stderr, args.join(" ")).toContain(text);
      expect(r.stderr.trimEnd().split("\n")).toHaveLength(1);
    }
  });
});
