// WorkerError is branded with Symbol.for (the undici pattern): instanceof holds across two loaded
// copies of the package, and not for look-alikes. Option checks name the option.
import { expect, test } from "vitest";
import { NullDrafter, WorkerError } from "../src/index.js";

test("instanceof WorkerError holds for an error of another copy of the module", async () => {
  // A query string makes the bundler load a second, separate instance of the module.
  const path: string = "../src/errors.js?second-copy";
  const other = (await import(path)) as typeof import("../src/errors.js");
  expect(other.WorkerError).not.toBe(WorkerError);
  expect(new other.WorkerError("WORKER_BAD_OPTION", "x")).toBeInstanceOf(WorkerError);
  expect(new WorkerError("WORKER_BAD_DRAFTER", "y")).toBeInstanceOf(other.WorkerError);
  const lookalike = Object.assign(new Error("z"), { code: "WORKER_BAD_OPTION", name: "WorkerError" });
  expect(lookalike instanceof WorkerError).toBe(false);
});

test("the one integer option check names the option and its range", () => {
  let err: unknown;
  try {
    new NullDrafter({ numSpec: 33 });
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(WorkerError);
  expect((err as WorkerError).code).toBe("WORKER_BAD_OPTION");
  expect((err as WorkerError).message).toBe("option numSpec 33 is not an integer in 1..32");
});
