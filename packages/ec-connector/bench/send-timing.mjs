// Loaded with `node --import` into a process by bench/control-probe.ts (issue 23): times each
// synchronous zeromq.js Socket.send() call of that process's ROUTER and DEALER sockets, and the
// gap from a ROUTER receive resolving to the next send, the process CPU time (all threads, the
// ZeroMQ I/O thread included) and context switches during the call, and prints the medians every 100 sends
// as one `send-timing {json}` line on stderr. Diagnosis only; never loaded by the package.
import { Dealer, Router } from "zeromq";

const role = process.env.TAPWIRE_SEND_TIMING_ROLE ?? String(process.pid);
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1] ?? 0;
};
for (const Cls of [Router, Dealer]) {
  const sync = [];
  const gap = [];
  const cpu = [];
  let ivcsw = 0;
  let vcsw = 0;
  let lastRecv = 0;
  const send = Cls.prototype.send;
  const receive = Cls.prototype.receive;
  Object.defineProperty(Cls.prototype, "receive", {
    configurable: true,
    writable: true,
    value: function (...a) {
      return receive.apply(this, a).then((m) => {
        lastRecv = performance.now();
        return m;
      });
    },
  });
  Object.defineProperty(Cls.prototype, "send", {
    configurable: true,
    writable: true,
    value: function (...a) {
      const ru0 = process.resourceUsage();
      const c0 = process.cpuUsage();
      const t = performance.now();
      if (lastRecv > 0) gap.push(t - lastRecv);
      lastRecv = 0;
      const r = send.apply(this, a);
      sync.push(performance.now() - t);
      const c1 = process.cpuUsage(c0);
      cpu.push((c1.user + c1.system) / 1000);
      const ru1 = process.resourceUsage();
      ivcsw += ru1.involuntaryContextSwitches - ru0.involuntaryContextSwitches;
      vcsw += ru1.voluntaryContextSwitches - ru0.voluntaryContextSwitches;
      if (sync.length === 100) {
        const line = {
          role,
          socket: Cls.name,
          send_sync_us_p50: Math.round(median(sync) * 10_000) / 10,
          recv_to_send_us_p50: Math.round(median(gap) * 10_000) / 10,
          process_cpu_us_p50: Math.round(median(cpu) * 10_000) / 10,
          involuntary_switches_per_send: ivcsw / sync.length,
          voluntary_switches_per_send: vcsw / sync.length,
        };
        process.stderr.write(`send-timing ${JSON.stringify(line)}\n`);
        sync.length = 0;
        gap.length = 0;
        cpu.length = 0;
        ivcsw = 0;
        vcsw = 0;
      }
      return r;
    },
  });
}
