// The shm+unix transport (issue 23, docs/transport.md "shm"): requests reach the handler exactly
// as over unix (CONTRACT 3), the doorbell refuses hostile input with typed errors, nothing stays
// in /dev/shm after SIGKILL of either side, and mapping failures fall back to the socket.
import { execFileSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as net from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { spawnBin, uniqueSocketPath, waitUntil } from "@tapwire/testing";
import { afterEach, describe, expect, test } from "vitest";
import { listen, makeClient, type ReceivePlan, type RpcServer, TransportError } from "../src/index.js";
import { setKoffiLoader } from "../src/shm.js";
import type { ShmClient } from "../src/shm-client.js";
import { caseOf } from "./helpers/env.js";
import { spawnServer } from "./helpers/raw.js";

const here = dirname(fileURLToPath(import.meta.url));
const open: { close(): unknown }[] = [];
afterEach(async () => {
  for (const o of open.splice(0)) await o.close();
  setKoffiLoader(() => import("koffi"));
});

function ours(pid: number): string[] {
  return fs.readdirSync("/dev/shm").filter((n) => n.startsWith(`tapwire-${pid}-`));
}

/** Echo handler: what the transport handed over, as one buffer (head + placed segments). */
function echo(req: Uint8Array, _c: unknown, placed?: ReceivePlan): Uint8Array {
  if (placed === undefined) return Buffer.from(req);
  return Buffer.concat([req, ...placed.segments]);
}

async function pair(
  scheme: "unix" | "shm+unix",
  receiveInto?: (h: Uint8Array, n: number) => ReceivePlan | number | null,
) {
  const srv = await listen(
    `${scheme}://${uniqueSocketPath("shm")}`,
    echo,
    receiveInto ? { receiveInto } : {},
  );
  const c = makeClient(srv.endpoint);
  open.push(c, srv);
  await c.connect();
  return { srv, c };
}

function payload(n: number, seed: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + seed) & 0xff;
  return b;
}

describe("shm+unix: the same requests and replies as unix (CONTRACT 3)", () => {
  test("inline, copied and staged parts: the handler sees exactly the unix bytes", async () => {
    const u = await pair("unix");
    const s = await pair("shm+unix");
    const sc = s.c as ShmClient;
    expect(sc.shmActive).toBe(true);
    expect(ours(process.pid)).toEqual([]); // unlinked once both ends hold it
    const area = sc.sendArea as Uint8Array;
    const replyU = Buffer.alloc(4 << 20);
    const replyS = Buffer.alloc(4 << 20);
    const shapes: Uint8Array[][] = [
      [payload(1, 1)],
      [payload(100, 2)],
      [payload(24, 3), payload(70_000, 4)],
      [payload(24, 5), payload(20_000, 6), payload(10, 7), payload(3 << 20, 8)],
    ];
    for (const parts of shapes) {
      const nu = await u.c.requestParts(parts, replyU, 10_000);
      const ns = await s.c.requestParts(parts, replyS, 10_000);
      expect(ns).toBe(nu);
      expect(replyS.subarray(0, ns).equals(replyU.subarray(0, nu))).toBe(true);
    }
    // staged: the caller wrote into the stage area; the request leaves by offset (no copy here)
    const rows = payload(1536 * 1024, 9);
    area.set(rows, 4096);
    const head = payload(48, 10);
    const nu = await u.c.requestParts([head, rows], replyU, 10_000);
    const ns = await s.c.requestParts([head, area.subarray(4096, 4096 + rows.length)], replyS, 10_000);
    expect(replyS.subarray(0, ns).equals(replyU.subarray(0, nu))).toBe(true);
    const whole = await s.c.request(area.subarray(4096, 4096 + rows.length), replyS, 10_000);
    expect(replyS.subarray(0, whole).equals(rows)).toBe(true);
  });

  test("receiveInto: the rest of a request is copied once from the mapping into the plan's segments", async () => {
    const plans: number[] = [];
    const hook = (h: Uint8Array, n: number): ReceivePlan | number | null => {
      if (h.length < 24) return 24;
      plans.push(n);
      const rest = n - 24;
      return { headBytes: 24, segments: [Buffer.alloc(rest >> 1), Buffer.alloc(rest - (rest >> 1))] };
    };
    const u = await pair("unix", hook);
    const s = await pair("shm+unix", hook);
    const replyU = Buffer.alloc(1 << 21);
    const replyS = Buffer.alloc(1 << 21);
    const parts = [payload(24, 1), payload(64 * 24 * 1024, 2)];
    const nu = await u.c.requestParts(parts, replyU, 10_000);
    const ns = await s.c.requestParts(parts, replyS, 10_000);
    expect(replyS.subarray(0, ns).equals(replyU.subarray(0, nu))).toBe(true);
    expect(plans).toEqual([nu, nu]); // both placed
    expect(await sampleOf(s.srv, "transport_server_placed_messages")).toBe(1);
  });

  test("without koffi the client says so once and every byte goes on the socket", async () => {
    setKoffiLoader(() => Promise.reject(new Error("Cannot find package 'koffi'")));
    const seen: string[] = [];
    const srv = await listen(`shm+unix://${uniqueSocketPath("shm")}`, echo);
    const c = makeClient(srv.endpoint, { onShmFallback: (e) => seen.push(e.code) }) as ShmClient;
    open.push(c, srv);
    await c.connect();
    expect(seen).toEqual(["TRANSPORT_SHM_UNAVAILABLE"]);
    expect(c.shmActive).toBe(false);
    expect(c.sendArea).toBeNull();
    const msg = payload(300_000, 3);
    const reply = Buffer.alloc(1 << 20);
    const n = await c.request(msg, reply, 10_000);
    expect(reply.subarray(0, n).equals(msg)).toBe(true);
  });

  test("options are validated naming the bad one", () => {
    expect(() => makeClient("shm+unix:///tmp/x.sock", { shmBytes: 1000 })).toThrow(/option shmBytes/);
    expect(() => makeClient("shm+unix:///tmp/x.sock", { shmDir: "rel" })).toThrow(/option shmDir/);
    expect(() => makeClient("shm+unix://rel")).toThrow(TransportError);
  });
});

async function sampleOf(srv: RpcServer, name: string): Promise<number> {
  const text = await srv.registry.prometheus();
  const m = new RegExp(`^${name}(?:_total)? (\\d+)`, "m").exec(text);
  return m === null ? Number.NaN : Number(m[1]);
}

/** A raw doorbell peer: length-prefixed messages on the unix socket, replies collected. */
class RawBell {
  readonly sock: net.Socket;
  closed = false;
  #acc = Buffer.alloc(0);
  readonly replies: Buffer[] = [];
  constructor(path: string) {
    this.sock = net.connect(path);
    this.sock.on("error", () => {});
    this.sock.on("close", () => {
      this.closed = true;
    });
    this.sock.on("data", (d: Buffer) => {
      this.#acc = Buffer.concat([this.#acc, d]);
      while (this.#acc.length >= 4 && this.#acc.length >= 4 + this.#acc.readUInt32LE(0)) {
        const len = this.#acc.readUInt32LE(0);
        this.replies.push(this.#acc.subarray(4, 4 + len));
        this.#acc = this.#acc.subarray(4 + len);
      }
    });
  }
  send(body: Buffer): void {
    const p = Buffer.alloc(4);
    p.writeUInt32LE(body.length, 0);
    this.sock.write(Buffer.concat([p, body]));
  }
  close(): void {
    this.sock.destroy();
  }
}

/** Docs/transport.md "shm": ATTACH = kind 1, version 1, size, name length, name. */
function attachMsg(name: string, size: number): Buffer {
  const b = Buffer.alloc(16 + name.length);
  b.writeUInt32LE(1, 0);
  b.writeUInt32LE(1, 4);
  b.writeUInt32LE(size, 8);
  b.writeUInt32LE(name.length, 12);
  b.write(name, 16, "latin1");
  return b;
}

/** BELL = kind 2, seq, total, region count (u16), 0 (u16), regions (offset, length), inline bytes. */
function bellMsg(seq: number, regions: [number, number][], inline: Buffer, total?: number): Buffer {
  const b = Buffer.alloc(16 + 8 * regions.length);
  b.writeUInt32LE(2, 0);
  b.writeUInt32LE(seq, 4);
  b.writeUInt32LE(total ?? inline.length + regions.reduce((a, r) => a + r[1], 0), 8);
  b.writeUInt16LE(regions.length, 12);
  regions.forEach(([o, l], i) => {
    b.writeUInt32LE(o, 16 + 8 * i);
    b.writeUInt32LE(l, 20 + 8 * i);
  });
  return Buffer.concat([b, inline]);
}

describe("shm+unix: a slow ATTACH answer (a loaded host)", () => {
  test("the ATTACH gets what the connect timeout leaves (at least 5 s): answered after 6 s, the session still attaches", async () => {
    // A server written from the table (docs/transport.md "shm"): it answers the ATTACH OK only
    // after 6 s, as a host busy mapping many clients' session files might.
    const path = uniqueSocketPath("shms");
    let attachAt = 0;
    const socks = new Set<net.Socket>();
    const srv = net.createServer((sock) => {
      socks.add(sock);
      sock.on("error", () => undefined);
      sock.once("data", (d: Buffer) => {
        expect(d.readUInt32LE(4)).toBe(1); // kind ATTACH
        attachAt = performance.now();
        setTimeout(() => {
          const ok = Buffer.alloc(8);
          ok.writeUInt32LE(4, 0); // length prefix
          ok.writeUInt32LE(0, 4); // status OK
          sock.write(ok);
        }, 6_000);
      });
    });
    await new Promise<void>((r) => srv.listen(path, r));
    open.push({
      close: () =>
        new Promise<void>((r) => {
          for (const k of socks) k.destroy();
          srv.close(() => r());
        }),
    });
    const seen: string[] = [];
    const c = makeClient(`shm+unix://${path}`, { onShmFallback: (e) => seen.push(e.code) }) as ShmClient;
    open.push(c);
    await c.connect(20_000);
    expect(performance.now() - attachAt).toBeGreaterThanOrEqual(5_900);
    expect(seen).toEqual([]);
    expect(c.shmActive).toBe(true);
    expect(c.sendArea).not.toBeNull();
  }, 30_000);
});

describe("shm+unix: hostile doorbells close the connection with a typed error, the server lives", () => {
  const SIZE = 128 * 1024;
  async function attached(): Promise<{ srv: RpcServer; errors: unknown[]; bell: RawBell; name: string }> {
    const errors: unknown[] = [];
    const path = uniqueSocketPath("shmh");
    const srv = await listen(`shm+unix://${path}`, echo, { onError: (e) => errors.push(e) });
    open.push(srv);
    const name = `tapwire-${process.pid}-${"0123456789abcdef"
      .split("")
      .sort(() => Math.random() - 0.5)
      .join("")}`;
    const file = join("/dev/shm", name);
    fs.writeFileSync(file, Buffer.alloc(SIZE, 0x5a), { mode: 0o600 });
    const bell = new RawBell(path);
    open.push(bell);
    bell.send(attachMsg(name, SIZE));
    await waitUntil(() => bell.replies.length === 1, { timeoutMs: 10_000 });
    fs.rmSync(file);
    expect(bell.replies[0]!.readUInt32LE(0)).toBe(0); // OK
    return { srv, errors, bell, name };
  }

  test("a well-formed doorbell built from the table is answered with the described bytes", async () => {
    const { bell } = await attached();
    bell.send(
      bellMsg(
        1,
        [
          [100, 10],
          [0, 5],
        ],
        Buffer.from("hi"),
      ),
    );
    await waitUntil(() => bell.replies.length === 2, { timeoutMs: 10_000 });
    expect(bell.replies[1]).toEqual(Buffer.concat([Buffer.from("hi"), Buffer.alloc(15, 0x5a)]));
  });

  const cases: [string, (seq: number) => Buffer[]][] = [
    ["a region outside the mapping", (q) => [bellMsg(q, [[SIZE - 4, 8]], Buffer.alloc(0))]],
    ["a region past 2^32", (q) => [bellMsg(q, [[0xffff_fff0, 0x20]], Buffer.alloc(0))]],
    [
      "overlapping regions",
      (q) => [
        bellMsg(
          q,
          [
            [0, 100],
            [50, 100],
          ],
          Buffer.alloc(0),
        ),
      ],
    ],
    [
      "a region inside an earlier one after an ascending run",
      (q) => [
        bellMsg(
          q,
          [
            [0, 10],
            [100, 10],
            [200, 10],
            [103, 2],
          ],
          Buffer.alloc(0),
        ),
      ],
    ],
    [
      "overlapping regions in descending order",
      (q) => [
        bellMsg(
          q,
          [
            [50, 100],
            [0, 60],
          ],
          Buffer.alloc(0),
        ),
      ],
    ],
    ["an empty region", (q) => [bellMsg(q, [[0, 0]], Buffer.alloc(0))]],
    ["a replayed seq", (q) => [bellMsg(q, [[0, 4]], Buffer.alloc(0)), bellMsg(q, [[0, 4]], Buffer.alloc(0))]],
    ["a seq skipping ahead", (q) => [bellMsg(q + 5, [[0, 4]], Buffer.alloc(0))]],
    ["a total that does not add up", (q) => [bellMsg(q, [[0, 4]], Buffer.alloc(2), 99)]],
    ["more regions than sent", (q) => [bellMsg(q, [[0, 4]], Buffer.alloc(0)).subarray(0, 18)]],
    ["an unknown kind", () => [Buffer.from([9, 0, 0, 0, 1, 2, 3])]],
    ["a second ATTACH", () => [attachMsg(`tapwire-${process.pid}-0000000000000000`, SIZE)]],
    ["garbage", () => [Buffer.from([1, 2])]],
  ];
  test.each(cases)("%s", async (_n, msgs) => {
    const { srv, errors, bell } = await attached();
    for (const m of msgs(1)) bell.send(m);
    await waitUntil(() => bell.closed, { timeoutMs: 10_000 });
    expect(errors.length).toBeGreaterThan(0);
    expect(errors.every((e) => e instanceof TransportError)).toBe(true);
    expect((errors.at(-1) as TransportError).code).toBe("TRANSPORT_PROTOCOL");
    // the server still serves
    const c = makeClient(srv.endpoint);
    open.push(c);
    await c.connect();
    const r = Buffer.alloc(16);
    expect(await c.request(Buffer.from("alive"), r, 10_000)).toBe(5);
  });

  test("regions before an ATTACH, and ATTACH of a path outside /dev/shm, are refused", async () => {
    const errors: unknown[] = [];
    const path = uniqueSocketPath("shmh");
    const srv = await listen(`shm+unix://${path}`, echo, { onError: (e) => errors.push(e) });
    open.push(srv);
    const a = new RawBell(path);
    open.push(a);
    a.send(attachMsg("../../etc/passwd", SIZE));
    await waitUntil(() => a.replies.length === 1, { timeoutMs: 10_000 });
    expect(a.replies[0]!.readUInt32LE(0)).toBe(1); // REFUSED: the client falls back
    const b = new RawBell(path);
    open.push(b);
    b.send(bellMsg(1, [[0, 4]], Buffer.alloc(0)));
    await waitUntil(() => b.closed, { timeoutMs: 10_000 });
    expect((errors.at(-1) as TransportError).code).toBe("TRANSPORT_PROTOCOL");
  });
});

describe("shm+unix: nothing left in /dev/shm after SIGKILL of either side", () => {
  test("SIGKILL of the client: no file of its pid, the server drops the connection, a restart works", async () => {
    const srv = await listen(`shm+unix://${uniqueSocketPath("shmk")}`, echo);
    open.push(srv);
    for (let round = 0; round < 2; round++) {
      const child = await spawnBin(join(here, "fixtures", "shm-child-client.ts"), [srv.endpoint], {
        nodeArgs: ["--import", "tsx"],
        cwd: join(here, ".."),
        ready: (l) => l.json?.msg === "attached",
      });
      expect(child.readyLine.json).toMatchObject({ active: true, same: true });
      expect(ours(child.pid)).toEqual([]);
      await child.kill("SIGKILL");
      expect(ours(child.pid)).toEqual([]);
      await waitUntil(() => srv.connections === 0, { timeoutMs: 10_000 });
    }
  });

  test("SIGKILL of the server: the client's next request fails typed, it reconnects to a restarted server", async () => {
    const t = caseOf("unix");
    const sock = uniqueSocketPath("shmk");
    const first = await spawnServer({ ...t, listen: () => `shm+unix://${sock}` });
    const c = makeClient(first.endpoint) as ShmClient;
    open.push(c);
    await c.connect();
    expect(c.shmActive).toBe(true);
    const r = Buffer.alloc(1 << 20);
    const msg = payload(100_000, 1);
    expect(await c.request(msg, r, 10_000)).toBe(msg.length);
    await first.child.kill("SIGKILL");
    expect(ours(first.child.pid)).toEqual([]);
    expect(ours(process.pid)).toEqual([]);
    await expect(c.request(msg, r, 10_000)).rejects.toBeInstanceOf(TransportError);
    // Once the drop is seen, a request is refused with why, naming the endpoint the user gave.
    await waitUntil(() => !c.connected);
    const refused = await c.request(msg, r, 10_000).then(
      () => null,
      (e: unknown) => e as TransportError,
    );
    expect(refused?.code).toBe("TRANSPORT_CLOSED");
    expect(refused?.message).toContain(`shm+unix://${sock}`);
    expect(refused?.message).not.toContain("not connected");
    fs.rmSync(sock, { force: true });
    const second = await spawnServer({ ...t, listen: () => `shm+unix://${sock}` });
    try {
      await c.connect();
      expect(c.shmActive).toBe(true);
      expect(await c.request(msg, r, 10_000)).toBe(msg.length);
      expect(r.subarray(0, msg.length).equals(msg)).toBe(true);
    } finally {
      c.close();
      await second.child.kill("SIGKILL");
    }
    expect(ours(process.pid)).toEqual([]);
  });

  test("a stale file of a dead pid is swept by the next client", async () => {
    // a pid that is surely dead: a child that already exited
    const dead = Number(
      execFileSync(process.execPath, ["-e", "process.stdout.write(String(process.pid))"]).toString(),
    );
    const stale = join("/dev/shm", `tapwire-${dead}-00112233aabbccdd`);
    fs.writeFileSync(stale, "x", { mode: 0o600 });
    const srv = await listen(`shm+unix://${uniqueSocketPath("shms")}`, echo);
    open.push(srv);
    const child = await spawnBin(join(here, "fixtures", "shm-child-client.ts"), [srv.endpoint], {
      nodeArgs: ["--import", "tsx"],
      cwd: join(here, ".."),
      ready: (l) => l.json?.msg === "attached",
    });
    await child.kill("SIGKILL");
    expect(fs.existsSync(stale)).toBe(false);
  });
});

describe("shm+unix: a /dev/shm too small for the mapping", () => {
  test("in a mount namespace with a 64 KiB /dev/shm the client names both sizes and falls back", async () => {
    const srv = await listen(`shm+unix://${uniqueSocketPath("shmn")}`, echo);
    open.push(srv);
    const fixture = join(here, "fixtures", "shm-child-client.ts");
    const script = `mount -t tmpfs -o size=64k tmpfs /dev/shm && exec "${process.execPath}" --import tsx "${fixture}" "${srv.endpoint}"`;
    const child = spawn("unshare", ["-m", "--propagation", "private", "sh", "-c", script], {
      cwd: join(here, ".."),
      stdio: ["ignore", "pipe", "pipe"],
    });
    const lines: Record<string, unknown>[] = [];
    let err = "";
    child.stderr.on("data", (d: Buffer) => {
      err += d.toString();
    });
    child.stdout.on("data", (d: Buffer) => {
      for (const l of d.toString().split("\n")) if (l.startsWith("{")) lines.push(JSON.parse(l));
    });
    try {
      await waitUntil(() => lines.some((j) => j.msg === "attached") || child.exitCode !== null, {
        timeoutMs: 30_000,
      });
      const fb = lines.find((j) => j.msg === "fallback");
      expect(fb, err).toMatchObject({ code: "TRANSPORT_SHM_SPACE" });
      expect(String(fb?.message)).toMatch(/has \d+ bytes free, a session mapping needs 16777216/);
      expect(lines.find((j) => j.msg === "attached")).toMatchObject({ active: false, same: true });
    } finally {
      child.kill("SIGKILL");
    }
  });
});

describe("shm+unix: CONTRACT 11 limits apply to the request a doorbell describes", () => {
  test("unbound: a request above unboundMaxMessageBytes gets onOversize's reply for its 24-byte header, then close", async () => {
    const heads: [string, number][] = [];
    const srv = await listen(`shm+unix://${uniqueSocketPath("shml")}`, echo, {
      unboundMaxMessageBytes: 4096,
      onOversize: (head, declared) => {
        heads.push([Buffer.from(head).toString("hex"), declared]);
        return Buffer.from("too large");
      },
    });
    const c = makeClient(srv.endpoint) as ShmClient;
    open.push(c, srv);
    await c.connect();
    expect(c.shmActive).toBe(true);
    const msg = payload(40_000, 4); // copied into the mapping, described by a region
    const r = Buffer.alloc(64);
    const n = await c.request(msg, r, 10_000);
    expect(r.subarray(0, n).toString()).toBe("too large");
    expect(heads).toEqual([[msg.subarray(0, 24).toString("hex"), 40_000]]);
    await waitUntil(() => !c.connected, { timeoutMs: 10_000 });
    expect(await sampleOf(srv, "transport_server_too_large")).toBe(1);
  });

  test("unbound: an inline doorbell past the limit (the fallback shape) gets onOversize's reply for the request's own header", async () => {
    // Bytes from docs/transport.md "shm" (BELL: kind 2, seq, total, region count, reserved; inline
    // request behind it), written by hand on a plain unix socket that never ATTACHes: only the
    // prefix, the BELL header and the request's 24-byte header are sent (found by
    // tapwire-conformance 11.4 / 3.shm.23: the inner socket closed without an answer).
    const heads: [string, number][] = [];
    const path = uniqueSocketPath("shmo");
    const srv = await listen(`shm+unix://${path}`, echo, {
      unboundMaxMessageBytes: 4096,
      onOversize: (head, declared) => {
        heads.push([Buffer.from(head).toString("hex"), declared]);
        return Buffer.from("too large");
      },
    });
    open.push(srv);
    const total = 1 << 20;
    const head = payload(24, 9);
    const bell = Buffer.alloc(16);
    bell.writeUInt32LE(2, 0); // BELL
    bell.writeUInt32LE(1, 4); // seq 1
    bell.writeUInt32LE(total, 8);
    const prefix = Buffer.alloc(4);
    prefix.writeUInt32LE(16 + total, 0);
    const sock = net.connect(path);
    const got: Buffer[] = [];
    let closed = false;
    sock.on("data", (d) => got.push(d));
    sock.on("error", () => {});
    sock.on("close", () => {
      closed = true;
    });
    await new Promise<void>((r) => sock.once("connect", () => r()));
    // split writes: the header must be read across them
    sock.write(Buffer.concat([prefix, bell.subarray(0, 10)]));
    await new Promise((r) => setTimeout(r, 20));
    sock.write(Buffer.concat([bell.subarray(10), head.subarray(0, 5)]));
    await new Promise((r) => setTimeout(r, 20));
    sock.write(head.subarray(5));
    await waitUntil(() => closed, { timeoutMs: 10_000 });
    const all = Buffer.concat(got);
    expect(all.readUInt32LE(0)).toBe(9);
    expect(all.subarray(4).toString()).toBe("too large");
    expect(heads).toEqual([[head.toString("hex"), total]]);
  });

  test("a receiveInto plan that does not add up closes the connection with TRANSPORT_BAD_OPTION; the handler never runs", async () => {
    const errors: unknown[] = [];
    let ran = 0;
    const srv = await listen(
      `shm+unix://${uniqueSocketPath("shml")}`,
      () => {
        ran++;
        return Buffer.from("x");
      },
      {
        receiveInto: () => ({ headBytes: 0, segments: [Buffer.alloc(3)] }),
        onError: (e) => errors.push(e),
      },
    );
    const c = makeClient(srv.endpoint);
    open.push(c, srv);
    await c.connect();
    await expect(c.request(payload(50_000, 1), Buffer.alloc(8), 10_000)).rejects.toBeInstanceOf(
      TransportError,
    );
    expect(ran).toBe(0);
    expect((errors[0] as TransportError).code).toBe("TRANSPORT_BAD_OPTION");
  });

  test("a second request while one is outstanding is TRANSPORT_BUSY and leaves the first intact", async () => {
    let release: (() => void) | null = null;
    const srv = await listen(`shm+unix://${uniqueSocketPath("shml")}`, async (req) => {
      const copy = Buffer.from(req);
      await new Promise<void>((r) => {
        release = r;
      });
      return copy;
    });
    const c = makeClient(srv.endpoint);
    open.push(c, srv);
    await c.connect();
    const first = payload(100_000, 7);
    const r = Buffer.alloc(1 << 18);
    const p = c.request(first, r, 10_000);
    await expect(c.request(payload(100_000, 8), Buffer.alloc(1 << 18), 10_000)).rejects.toMatchObject({
      code: "TRANSPORT_BUSY",
    });
    await waitUntil(() => release !== null, { timeoutMs: 10_000 });
    (release as unknown as () => void)();
    const n = await p;
    expect(r.subarray(0, n).equals(first)).toBe(true);
  });
});

describe("shm files: one owner of the creation rules (createSessionFile, createUnlinkedShmFile)", () => {
  test("an unlinked file: nothing in the directory, 0600, its pages allocated, the mapping shared through the fd", async () => {
    const { createUnlinkedShmFile, ShmRange } = await import("../src/index.js");
    const { loadLibcSync } = await import("../src/shm.js");
    const libc = loadLibcSync();
    const dir = fs.mkdtempSync(join("/dev/shm", "tw-unlinked-"));
    try {
      const range = new ShmRange(libc, 64 * 1024);
      const fd = createUnlinkedShmFile(libc, dir, range, { mapping: "a test region", lower: "or shrink it" });
      try {
        expect(fs.readdirSync(dir)).toEqual([]);
        const st = fs.fstatSync(fd);
        expect(st.mode & 0o777).toBe(0o600);
        expect(st.size).toBe(64 * 1024);
        expect(st.blocks * 512).toBeGreaterThanOrEqual(64 * 1024);
        range.bytes[100] = 42;
        const back = Buffer.alloc(1);
        fs.readSync(fd, back, 0, 1, 100);
        expect(back[0]).toBe(42);
      } finally {
        range.free();
        fs.closeSync(fd);
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test("no room: TRANSPORT_SHM_SPACE in the caller's words, nothing left open or on disk", async () => {
    const { createUnlinkedShmFile, ShmRange } = await import("../src/index.js");
    const { loadLibcSync } = await import("../src/shm.js");
    const libc = loadLibcSync();
    const free = fs.statfsSync("/dev/shm");
    const tooBig = free.bavail * free.bsize + 1024 * 1024 * 1024;
    const range = new ShmRange(libc, 4096);
    const fdsBefore = fs.readdirSync("/proc/self/fd").length;
    let err: unknown;
    try {
      createUnlinkedShmFile(
        libc,
        "/dev/shm",
        { size: tooBig, map: () => undefined } as unknown as InstanceType<typeof ShmRange>,
        {
          mapping: "the shared cache region (--shm-share-region)",
          lower: "or drop --shm-share-region",
          fallback: "); using the ordinary region and the ring",
        },
      );
    } catch (e) {
      err = e;
    } finally {
      range.free();
    }
    expect(err).toBeInstanceOf(TransportError);
    expect((err as TransportError).code).toBe("TRANSPORT_SHM_SPACE");
    expect((err as Error).message).toContain(`needs ${tooBig}`);
    expect((err as Error).message).toContain(
      "or drop --shm-share-region); using the ordinary region and the ring",
    );
    expect(fs.readdirSync("/proc/self/fd").length).toBe(fdsBefore);
  });
});
