// ClientError is branded with a registry symbol (issue 12 item 6, the undici pattern), so that
// `instanceof` holds for an error thrown by a second installed copy of the package.
import { expect, test } from "vitest";
import { ClientError, CONN_STATES } from "../src/index.js";

test("instanceof ClientError follows the Symbol.for brand, not the prototype", () => {
  const e = new ClientError("CLIENT_CLOSED", "closed");
  expect(e instanceof ClientError).toBe(true);
  expect(e instanceof Error).toBe(true);
  // what another copy's ClientError looks like: a different class carrying the same brand
  class OtherCopy extends Error {
    constructor() {
      super("other");
      Object.defineProperty(this, Symbol.for("tapwire.client.ClientError"), { value: true });
    }
  }
  expect(new OtherCopy() instanceof ClientError).toBe(true);
  expect(new Error("plain") instanceof ClientError).toBe(false);
  expect((null as unknown) instanceof ClientError).toBe(false);
});

test("the connection state table: CLOSED is terminal, DISABLED only closes, READY comes from CONNECTING", () => {
  expect(CONN_STATES.CLOSED).toEqual([]);
  expect(CONN_STATES.DISABLED).toEqual(["CLOSED"]);
  const into = (to: string) =>
    Object.entries(CONN_STATES)
      .filter(([, tos]) => (tos as readonly string[]).includes(to))
      .map(([from]) => from);
  expect(into("READY")).toEqual(["CONNECTING"]);
  expect(into("CONNECTING")).toEqual(["IDLE"]);
});
