/** The case lists of every mode, for `--list` and for tools that show them. */
import { CLIENT_CASES } from "./client/suite.js";
import { EC_CONSUMER_CASES, EC_CONSUMER_SUMMARY } from "./ec/consumer.js";
import { EC_EVENTS_CASES } from "./ec/events.js";
import { EC_PRODUCER_CASES } from "./ec/producer.js";
import { WORKER_CASES } from "./worker/suite.js";

/** A mode of the tester. */
export type Mode = "worker" | "client" | "ec-producer" | "ec-consumer" | "ec-producer-events";

/** What `--list` prints of a case. */
export interface CaseInfo {
  /** The case number (`6.2.3`). */
  id: string;
  /** What is sent and what must happen. */
  title: string;
  /** The contract sentence it checks. */
  cite: string;
}

/** Every case of `mode`, in run order. */
export function listCases(mode: Mode): CaseInfo[] {
  const defs =
    mode === "worker"
      ? WORKER_CASES
      : mode === "client"
        ? CLIENT_CASES
        : mode === "ec-producer"
          ? EC_PRODUCER_CASES
          : mode === "ec-producer-events"
            ? EC_EVENTS_CASES
            : [...EC_CONSUMER_CASES, EC_CONSUMER_SUMMARY];
  return defs.map((d) => ({ id: d.id, title: d.title, cite: d.cite }));
}
