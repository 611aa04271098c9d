// WireError is branded with Symbol.for (the undici pattern): instanceof holds across two loaded
// copies of the package, and not for look-alikes.
import { expect, test } from "vitest";
import { WireError } from "../src/index.js";

test("instanceof WireError holds for an error of another copy of the module", async () => {
  // A query string makes the bundler load a second, separate instance of the module.
  const path: string = "../src/errors.js?second-copy";
  const other = (await import(path)) as typeof import("../src/errors.js");
  expect(other.WireError).not.toBe(WireError);
  const e = new other.WireError("WIRE_BAD_FRAME", "x");
  expect(e).toBeInstanceOf(WireError);
  expect(new WireError("WIRE_BAD_REPLY", "y")).toBeInstanceOf(other.WireError);
  expect(e.status).toBe(3);
  const lookalike = Object.assign(new Error("z"), { code: "WIRE_BAD_FRAME", name: "WireError" });
  expect(lookalike instanceof WireError).toBe(false);
  expect((null as unknown) instanceof WireError).toBe(false);
});
