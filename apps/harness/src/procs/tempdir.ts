/**
 * The run's temp dir, marked with its owner (issue 19): `owner.json` holds the harness's pid and
 * the kernel's start time of that pid. A harness killed by SIGKILL cannot remove its dir; the
 * next harness to start removes every `tapwire-harness-*` dir whose owner is gone (pid not
 * running, or running with another start time: a reused pid). Dirs without a marker are left
 * alone (another harness between `mkdtemp` and writing its marker, or not ours).
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** The prefix of every run dir under the OS temp dir. */
export const RUN_DIR_PREFIX = "tapwire-harness-";
/** The marker file in a run dir. */
export const OWNER_FILE = "owner.json";

interface Owner {
  pid: number;
  /** Field 22 of /proc/PID/stat (clock ticks since boot), null where there is no /proc. */
  startTime: string | null;
}

/** The start time of `pid` as the kernel states it, or null (no /proc, or no such process). */
function startTimeOf(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // "pid (comm) S ppid ...": comm may hold spaces and parentheses; fields follow the last ")"
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (fields[0] === "Z" || fields[0] === "X") return null;
    return fields[19] ?? null;
  } catch {
    return null;
  }
}

/** True when the process that wrote `o` still runs. */
function ownerAlive(o: Owner): boolean {
  if (o.startTime !== null) return startTimeOf(o.pid) === o.startTime;
  try {
    process.kill(o.pid, 0);
    return true;
  } catch (e) {
    return (e as { code?: string }).code === "EPERM";
  }
}

/** Creates this run's dir under `base` (default the OS temp dir), marked with this process as owner. */
export function makeRunDir(base = tmpdir()): string {
  const dir = mkdtempSync(join(base, RUN_DIR_PREFIX));
  const owner: Owner = { pid: process.pid, startTime: startTimeOf(process.pid) };
  writeFileSync(join(dir, OWNER_FILE), `${JSON.stringify(owner)}\n`);
  return dir;
}

/** Removes the run dirs under `base` whose owner is gone; returns the paths removed. */
export function removeStaleRunDirs(base = tmpdir()): string[] {
  const removed: string[] = [];
  let names: string[];
  try {
    names = readdirSync(base);
  } catch {
    return removed;
  }
  for (const name of names) {
    if (!name.startsWith(RUN_DIR_PREFIX)) continue;
    const dir = join(base, name);
    let owner: Owner;
    try {
      owner = JSON.parse(readFileSync(join(dir, OWNER_FILE), "utf8")) as Owner;
    } catch {
      continue;
    }
    if (typeof owner.pid !== "number" || owner.pid === process.pid || ownerAlive(owner)) continue;
    rmSync(dir, { recursive: true, force: true });
    removed.push(dir);
  }
  return removed;
}
