import type { Advertised } from "@tapwire/stats";
import { advertiseEndpoint, parseAdvertise } from "@tapwire/stats";

/**
 * Issue 19: where `EcProducer` tells peers to connect, by the one rule of `@tapwire/stats`
 * (`advertiseEndpoint`): `advertise` (`HOST[:PORT]`) when given, else the bind address unless it is
 * a wildcard, else the first non-loopback interface that is up (or `STATS_NO_ADVERTISE`).
 * PORT applies to the data endpoint only: it is the one the producer announces itself (in every
 * grant's agent metadata); the control endpoint keeps its bound port.
 */
export function advertiseData(bound: string, advertise: string | undefined): string {
  return advertiseEndpoint(bound, advertise === undefined ? {} : { advertise }).endpoint;
}

/** The advertised control endpoint (HOST of `advertise`, the bound port), with how it was chosen. */
export function advertiseControl(bound: string, advertise: string | undefined): Advertised {
  if (advertise === undefined) return advertiseEndpoint(bound);
  return advertiseEndpoint(bound, { advertise: { host: parseAdvertise(advertise).host } });
}

/** The data endpoint's resolution, for the `listening` line (`bound` as the server bound it). */
export function advertisedData(bound: string, advertise: string | undefined): Advertised {
  return advertiseEndpoint(bound, advertise === undefined ? {} : { advertise });
}
