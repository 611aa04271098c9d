// watchParent (issue 19): the --exit-with-parent rule of every bin. End of input, an error on it
// or its close call onGone exactly once; data written by the parent is dropped; stop() detaches.
// The real-process proof (SIGKILL of a supervisor) is in packages/worker/test/parent-exit.test.ts.
import { spawn } from "node:child_process";
import { PassThrough } from "node:stream";
import { describe, expect, test } from "vitest";
import { StatsError, watchParent } from "../src/index.js";

describe("watchParent", () => {
  test("the end of input calls onGone once, after data that is dropped", async () => {
    const input = new PassThrough();
    const calls: string[] = [];
    watchParent((why) => calls.push(why), { input });
    input.write("anything the parent writes");
    expect(calls).toEqual([]);
    input.end();
    await new Promise((r) => setImmediate(r));
    input.destroy();
    await new Promise((r) => setImmediate(r));
    expect(calls).toEqual(["stdin closed: parent exited"]);
  });

  test("an error on input counts as the parent gone", async () => {
    const input = new PassThrough();
    const calls: string[] = [];
    watchParent((why) => calls.push(why), { input });
    input.destroy(new Error("EPIPE"));
    await new Promise((r) => setImmediate(r));
    expect(calls).toEqual(["stdin error: EPIPE"]);
  });

  test("stop() detaches: a later end calls nothing", async () => {
    const input = new PassThrough();
    const calls: string[] = [];
    watchParent((why) => calls.push(why), { input }).stop();
    input.end();
    await new Promise((r) => setImmediate(r));
    expect(calls).toEqual([]);
  });

  test("options are validated naming the bad one", () => {
    expect(() => watchParent(null as never)).toThrow(StatsError);
    expect(() => watchParent(() => {}, { input: 3 as never })).toThrow(/option input/);
  });

  test("a real child watching its stdin exits when the parent's end of the pipe closes", async () => {
    const code = `import(${JSON.stringify(new URL("../dist/index.js", import.meta.url).href)}).then((m) =>
      m.watchParent((why) => { console.log(why); process.exit(0); }));
      setInterval(() => {}, 1000);`;
    const child = spawn(process.execPath, ["-e", code], { stdio: ["pipe", "pipe", "inherit"] });
    let out = "";
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
    });
    await new Promise((r) => setTimeout(r, 300));
    expect(child.exitCode).toBeNull();
    child.stdin!.end();
    const exit = await new Promise((r) => child.on("exit", r));
    expect(exit).toBe(0);
    expect(out.trim()).toBe("stdin closed: parent exited");
  });
});
