// What the kernel says about a process's threads and TCP sockets (Linux /proc), for tests that
// check a process is gone and its ports freed without racing its exit (issue 19).
import { readdirSync, readFileSync, readlinkSync } from "node:fs";

/**
 * The threads of `pid` that have not ended (state neither `Z` nor `X`), 0 once it is gone.
 * `isAlive(pid)` reads the thread-group leader only, and the leader is a zombie as soon as the
 * thread that called `exit_group` is done, while the other threads (libuv's pool, V8's
 * workers, libzmq's I/O thread) are still exiting and still share the open files: a listening
 * socket stays listening until the last of them is gone. Once this is 0, every thread has run
 * `exit_files`, so the kernel closed all the process's sockets.
 */
export function liveThreads(pid: number): number {
  let tasks: string[];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return 0;
  }
  let n = 0;
  for (const t of tasks) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${t}/stat`, "utf8");
      const state = stat.charAt(stat.lastIndexOf(")") + 2);
      if (state !== "Z" && state !== "X") n++;
    } catch {
      // this thread was released meanwhile
    }
  }
  return n;
}

/** One line of /proc/net/tcp or /proc/net/tcp6. */
export interface TcpSocket {
  /** The local port. */
  port: number;
  /** The kernel's state: `0A` is LISTEN, `06` TIME_WAIT, `01` ESTABLISHED. */
  state: string;
  /** The socket's inode (0 for a TIME_WAIT socket, which no file holds). */
  inode: number;
}

/** Every TCP socket of this network namespace, IPv4 and IPv6. */
export function tcpSockets(): TcpSocket[] {
  const out: TcpSocket[] = [];
  for (const f of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let text: string;
    try {
      text = readFileSync(f, "utf8");
    } catch {
      continue; // no IPv6
    }
    for (const line of text.split("\n").slice(1)) {
      const c = line.trim().split(/\s+/);
      if (c.length < 10) continue;
      const local = c[1]!;
      out.push({
        port: Number.parseInt(local.slice(local.lastIndexOf(":") + 1), 16),
        state: c[3]!,
        inode: Number(c[9]),
      });
    }
  }
  return out;
}

/** The inodes of the sockets `pid` has open (from its /proc/PID/fd links `socket:[INODE]`). */
export function socketInodesOf(pid: number): Set<number> {
  const out = new Set<number>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    let link: string;
    try {
      link = readlinkSync(`/proc/${pid}/fd/${fd}`);
    } catch {
      continue; // closed meanwhile
    }
    const m = /^socket:\[(\d+)\]$/.exec(link);
    if (m !== null) out.add(Number(m[1]));
  }
  return out;
}
