/**
 * Issue 21: the encoders of a multi-instance run, shared by every engine process. `--encoders M`
 * starts M `tapwire-ec-producer` processes, each publishing its residency events (EC-CONTRACT
 * 10.1, 10.2) and, with `--discovery etcd`, registering under the run's prefix (`--register`: an
 * `encoder` record with its residency endpoints) so the engines' directories find them through
 * etcd. A restart (`--faults`) comes back on the same endpoints and registers again (a new
 * incarnation).
 */
import type { ProducerRecord } from "@tapwire/ec-connector";
import { ecGeometry, type RunScope, startEncoder } from "../procs/children.js";
import type { ChildService } from "../procs/procs.js";

/** Hello period of the shared encoders' events (ms): a gap at the tail is seen within one. */
export const SHARED_EVENTS_HEARTBEAT_MS = 250;

/** One shared encoder. */
export interface SharedEncoder {
  id: string;
  svc: ChildService;
  /** Its record (control, events, replay): what a static directory is given. */
  record: ProducerRecord;
  events: string[];
}

/** Starts `n` shared encoders; `register` holds the `--register …` flags with etcd (else empty). */
export async function startSharedEncoders(
  scope: RunScope,
  n: number,
  register: readonly string[],
): Promise<SharedEncoder[]> {
  const geo = ecGeometry(scope.cfg);
  const extra = ["--events-heartbeat-ms", String(SHARED_EVENTS_HEARTBEAT_MS), ...register];
  const out: SharedEncoder[] = [];
  for (let i = 0; i < n; i++) {
    const started = await startEncoder(scope, geo, {
      name: `encoder-${i}`,
      args: ["--events-listen", "tcp://127.0.0.1:0", "--replay-listen", "tcp://127.0.0.1:0", ...extra],
    });
    const svc = started.encoder;
    // startEncoder pins the events and replay endpoints for a restart but not the other extra
    // flags: the restarted encoder must register (and beat) again
    const args = [...svc.args];
    for (let j = 0; j < extra.length; j += 2) {
      if (!args.includes(extra[j] as string)) args.push(extra[j] as string, extra[j + 1] as string);
    }
    svc.setArgs(args);
    const el = started.listening;
    out.push({
      id: `encoder-${i}`,
      svc,
      record: {
        control: started.producerEndpoint,
        events: String(el["events"]),
        replay: String(el["replay"]),
      },
      events: [`started pid ${svc.pid}`],
    });
  }
  return out;
}
