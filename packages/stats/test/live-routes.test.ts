// serveMetrics routes, sseRoute and pageRoute (issue 24): the live pages' server, over real HTTP.
import { request } from "node:http";
import { expect, test } from "vitest";
import { pageRoute, Registry, registryPage, serveMetrics, sseRoute } from "../src/index.js";

function open(
  port: number,
  path: string,
): Promise<{ status: number; chunks: string[]; end: Promise<void>; abort: () => void }> {
  return new Promise((resolve, reject) => {
    const chunks: string[] = [];
    const req = request({ host: "127.0.0.1", port, path }, (res) => {
      res.setEncoding("utf8");
      const end = new Promise<void>((done) => {
        res.on("end", () => done());
        res.on("close", () => done());
      });
      res.on("data", (c: string) => chunks.push(c));
      resolve({ status: res.statusCode ?? 0, chunks, end, abort: () => req.destroy() });
    });
    req.on("error", reject);
    req.end();
  });
}

test("events every interval, a named event to all, a cap on streams (503), close() ends them", async () => {
  let n = 0;
  const events = sseRoute(() => ({ n: ++n }), { intervalMs: 50, maxClients: 2 });
  const srv = await serveMetrics([new Registry()], 0, "127.0.0.1", {
    routes: { "/": pageRoute(registryPage("t<x>")), "/events": events },
  });
  try {
    const page = await fetch(`http://127.0.0.1:${srv.port}/`);
    expect(page.headers.get("content-type")).toContain("text/html");
    const html = await page.text();
    expect(html).toContain("t&#60;x&#62;: live view");
    expect(html).toContain('new EventSource("/events")');
    const a = await open(srv.port, "/events");
    const b = await open(srv.port, "/events");
    expect(a.status).toBe(200);
    const c = await open(srv.port, "/events");
    expect(c.status).toBe(503); // the flood cap
    const t0 = Date.now();
    while (a.chunks.join("").split("data: ").length < 4 && Date.now() - t0 < 10_000)
      await new Promise((r) => setTimeout(r, 20));
    expect(a.chunks.join("")).toMatch(/retry: 50\n\ndata: \{"n":\d+\}\n\n/);
    expect(events.clients).toBe(2);
    events.send("final", { done: true });
    b.abort(); // a viewer leaving frees its place
    const t1 = Date.now();
    while (events.clients !== 1 && Date.now() - t1 < 10_000) await new Promise((r) => setTimeout(r, 20));
    expect(events.clients).toBe(1);
    events.close();
    await a.end;
    expect(a.chunks.join("")).toContain('event: final\ndata: {"done":true}\n\n');
    // the built-in paths stay
    expect((await fetch(`http://127.0.0.1:${srv.port}/healthz`)).status).toBe(200);
    expect((await fetch(`http://127.0.0.1:${srv.port}/events`, { method: "POST" })).status).toBe(405);
  } finally {
    events.close();
    await srv.close();
  }
});

test("a throwing state sends an error event; routes may not replace /metrics; options are checked", async () => {
  const events = sseRoute(() => {
    throw new Error("boom");
  });
  const srv = await serveMetrics([new Registry()], 0, "127.0.0.1", { routes: { "/events": events } });
  try {
    const a = await open(srv.port, "/events");
    const t0 = Date.now();
    while (!a.chunks.join("").includes("boom") && Date.now() - t0 < 10_000)
      await new Promise((r) => setTimeout(r, 20));
    expect(a.chunks.join("")).toContain('event: error\ndata: "boom"');
  } finally {
    events.close();
    await srv.close();
  }
  await expect(
    serveMetrics([new Registry()], 0, "127.0.0.1", { routes: { "/metrics": () => {} } }),
  ).rejects.toThrow(/option routes/);
  expect(() => sseRoute(() => 1, { intervalMs: 1 })).toThrow(/option intervalMs/);
  expect(() => sseRoute(() => 1, { maxClients: 0 })).toThrow(/option maxClients/);
});
