// TransportError is branded with Symbol.for (undici lib/core/errors.js): `instanceof` holds for an
// error of another installed copy of this package, and for nothing else.
import { expect, test } from "vitest";
import { TransportError } from "../src/index.js";

test("instanceof TransportError holds across two copies of the module, and only for its errors", async () => {
  // A second module instance: what a second installed copy of @tapwire/transport is.
  const spec = "../src/errors.js?second-copy";
  const copy = (await import(/* @vite-ignore */ spec)) as typeof import("../src/errors.js");
  expect(copy.TransportError).not.toBe(TransportError);
  const other = new copy.TransportError("TRANSPORT_CLOSED", "from the other copy");
  expect(other instanceof TransportError).toBe(true);
  expect(new TransportError("TRANSPORT_BUSY", "here") instanceof copy.TransportError).toBe(true);
  expect(new Error("plain") instanceof TransportError).toBe(false);
  expect(({ code: "TRANSPORT_CLOSED" } as object) instanceof TransportError).toBe(false);
  expect((null as unknown as object) instanceof TransportError).toBe(false);
  expect(new TransportError("TRANSPORT_BUSY", "x") instanceof Error).toBe(true);
  expect(other.code).toBe("TRANSPORT_CLOSED");
});
