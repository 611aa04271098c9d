/**
 * The relay process started by `startRelay` (inside the router namespace): TCP forwards with a
 * link's delay, jitter and stalls, added on demand. Not part of the public API.
 *
 * argv: `--link <spec>`. stdin: one JSON command per line; stdout: one JSON line per answer
 * (`{ id, ok, … }`) plus `{ msg: "listening" }` once ready. EOF on stdin (the parent died, however
 * it died) closes everything and exits.
 * @internal
 * @packageDocumentation
 */
import { createInterface } from "node:readline";
import type { FaultProxy, FaultProxyStats } from "./fault-proxy.js";
import { startFaultProxy } from "./fault-proxy.js";
import { parseLinkSpec } from "./link-spec.js";

const MAX_FORWARDS = 256;
const MAX_LINE = 4096;

function out(obj: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(obj)}\n`);
}

const argLink = process.argv.indexOf("--link");
const spec = parseLinkSpec(argLink >= 0 ? (process.argv[argLink + 1] ?? "") : "");
const impairment = {
  delayMs: spec.delayMs,
  jitterMs: spec.jitterMs,
  stallProbability: spec.stallProbability,
  stallMs: spec.stallMs,
  seed: spec.seed,
};
const forwards = new Map<string, { proxy: FaultProxy; target: { host: string; port: number } }>();
let seedOffset = 0;

type Cmd = {
  id?: unknown;
  op?: unknown;
  listen?: { host?: unknown; port?: unknown };
  target?: { host?: unknown; port?: unknown };
  localAddress?: unknown;
};

function isPort(p: unknown, zeroOk: boolean): p is number {
  return Number.isInteger(p) && (p as number) >= (zeroOk ? 0 : 1) && (p as number) <= 65535;
}

async function handle(cmd: Cmd): Promise<Record<string, unknown>> {
  switch (cmd.op) {
    case "forward": {
      const lh = cmd.listen?.host;
      const lp = cmd.listen?.port;
      const th = cmd.target?.host;
      const tp = cmd.target?.port;
      if (typeof lh !== "string" || !isPort(lp, true))
        return { ok: false, error: "listen must be { host, port }" };
      if (typeof th !== "string" || !isPort(tp, false))
        return { ok: false, error: "target must be { host, port }" };
      if (cmd.localAddress !== undefined && typeof cmd.localAddress !== "string") {
        return { ok: false, error: "localAddress must be a string" };
      }
      if (forwards.size >= MAX_FORWARDS) return { ok: false, error: `at most ${MAX_FORWARDS} forwards` };
      // Each forward draws from its own stream of the seed: repeatable, yet not in lockstep.
      const proxy = await startFaultProxy(
        { host: th, port: tp },
        {
          host: lh,
          port: lp,
          impairment: { ...impairment, seed: impairment.seed + seedOffset++ },
          ...(cmd.localAddress === undefined ? {} : { localAddress: cmd.localAddress }),
        },
      );
      forwards.set(`${lh}:${proxy.port}`, { proxy, target: { host: th, port: tp } });
      return { ok: true, host: lh, port: proxy.port };
    }
    case "unforward": {
      const key = `${String(cmd.listen?.host)}:${String(cmd.listen?.port)}`;
      const f = forwards.get(key);
      if (f === undefined) return { ok: false, error: `no forward on ${key}` };
      forwards.delete(key);
      await f.proxy.close();
      return { ok: true };
    }
    case "stats": {
      const list: { listen: string; target: string; stats: FaultProxyStats }[] = [];
      for (const [key, f] of forwards) {
        list.push({ listen: key, target: `${f.target.host}:${f.target.port}`, stats: f.proxy.stats });
      }
      return { ok: true, forwards: list };
    }
    default:
      return { ok: false, error: `unknown op ${JSON.stringify(cmd.op)}` };
  }
}

async function shutdown(code: number): Promise<void> {
  await Promise.all([...forwards.values()].map((f) => f.proxy.close()));
  process.exit(code);
}

const rl = createInterface({ input: process.stdin, crlfDelay: Number.POSITIVE_INFINITY });
rl.on("line", (line) => {
  if (line.length > MAX_LINE) {
    out({ ok: false, error: `command above ${MAX_LINE} bytes` });
    return;
  }
  let cmd: Cmd;
  try {
    const v: unknown = JSON.parse(line);
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw new Error("not an object");
    cmd = v as Cmd;
  } catch (err) {
    out({ ok: false, error: `bad command: ${(err as Error).message}` });
    return;
  }
  handle(cmd).then(
    (r) => out({ id: cmd.id, ...r }),
    (err: unknown) => out({ id: cmd.id, ok: false, error: (err as Error).message }),
  );
});
rl.on("close", () => void shutdown(0));
process.on("SIGTERM", () => void shutdown(0));
out({ msg: "listening", pid: process.pid, link: process.argv[argLink + 1] ?? "none" });
