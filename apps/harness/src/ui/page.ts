/**
 * The live view's page: one hand-written HTML document with inline SVG charts, no build step and
 * no dependency. It opens `/events` (Server-Sent Events) and redraws on every event.
 */
export const LIVE_PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tapwire harness: live view</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; background: #fafafa; color: #222; }
  h1 { font-size: 18px; margin: 0 0 8px; }
  #status { margin-bottom: 12px; }
  #status[data-final="1"] { color: #0a6; font-weight: 600; }
  .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 12px; }
  .panel { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px 12px; }
  .panel h2 { font-size: 14px; margin: 0 0 6px; }
  table { border-collapse: collapse; width: 100%; }
  td { padding: 1px 4px; } td.v { text-align: right; font-variant-numeric: tabular-nums; }
  svg text { font: 11px system-ui, sans-serif; fill: #444; }
  .ok { color: #0a6; } .bad { color: #c22; } .pending { color: #888; }
</style>
</head>
<body>
<h1>tapwire harness: live view</h1>
<div id="status" data-final="0">connecting…</div>
<div class="grid">
  <div class="panel"><h2>Acceptance per draft position</h2><svg id="acc-chart" width="340" height="150"></svg>
    <div id="acc-pos"></div></div>
  <div class="panel"><h2>Accepted length and lossless status</h2><table id="summary"></table></div>
  <div class="panel"><h2>Chosen depths (verifications at depth d)</h2><svg id="depth-chart" width="340" height="150"></svg></div>
  <div class="panel"><h2>STEP RTT histogram (ms)</h2><svg id="rtt-chart" width="340" height="150"></svg><div id="rtt-q"></div></div>
  <div class="panel"><h2>Round time breakdown</h2><svg id="round-chart" width="340" height="60"></svg><svg id="roundh-chart" width="340" height="150"></svg></div>
  <div class="panel"><h2>Workers</h2><table id="workers"></table></div>
  <div class="panel"><h2>Encoders and EC transfers</h2><table id="encoders"></table></div>
</div>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function bars(svg, labels, values, opts) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height"), pad = 22;
  const max = opts.max ?? Math.max(1e-9, ...values);
  const bw = (W - pad) / Math.max(1, values.length);
  values.forEach((v, i) => {
    const h = (H - 2 * pad) * (v / max);
    svg.appendChild(el("rect", { x: pad + i * bw + 2, y: H - pad - h, width: Math.max(1, bw - 4), height: h, fill: opts.color ?? "#4a7bd0" }));
    svg.appendChild(el("text", { x: pad + i * bw + bw / 2, y: H - 6, "text-anchor": "middle", style: bw < 34 ? "font-size:8px" : "font-size:11px" }, labels[i]));
    svg.appendChild(el("text", { x: pad + i * bw + bw / 2, y: H - pad - h - 3, "text-anchor": "middle" }, opts.fmt(v)));
  });
  svg.appendChild(el("line", { x1: pad, y1: H - pad, x2: W, y2: H - pad, stroke: "#999" }));
}
function stacked(svg, parts) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = +svg.getAttribute("width"); const total = parts.reduce((a, p) => a + p[1], 0) || 1;
  let x = 0; const colors = ["#4a7bd0", "#e0913a", "#8a8a8a"];
  parts.forEach((p, i) => {
    const w = (W - 2) * p[1] / total;
    svg.appendChild(el("rect", { x, y: 4, width: Math.max(0, w), height: 24, fill: colors[i % 3] }));
    svg.appendChild(el("rect", { x: 4 + i * 112, y: 36, width: 9, height: 9, fill: colors[i % 3] }));
    svg.appendChild(el("text", { x: 16 + i * 112, y: 45 }, p[0] + " " + Math.round(100 * p[1] / total) + "%"));
    x += w;
  });
}
function rows(table, list) {
  table.innerHTML = "";
  for (const [k, v, cls] of list) {
    const tr = document.createElement("tr");
    const a = document.createElement("td"); a.textContent = k;
    const b = document.createElement("td"); b.className = "v" + (cls ? " " + cls : ""); b.textContent = v;
    tr.append(a, b); table.appendChild(tr);
  }
}
const pct = (x) => (100 * x).toFixed(1) + "%";
const ms = (x) => x.toFixed(2);
let events = 0;
function render(s) {
  document.body.dataset.events = String(++events);
  const st = document.getElementById("status");
  st.dataset.final = s.final ? "1" : "0";
  st.textContent = (s.final ? "final: " : "live: ") + s.phase + (s.requests ? " — " + s.requests.completed + "/" + s.requests.total + " requests, " + s.tokens + " tokens, " + s.rounds + " rounds" : "");
  if (!s.acceptance) return;
  const acc = s.acceptance.byPosition;
  bars(document.getElementById("acc-chart"), acc.map((_, j) => "pos " + j), acc, { max: 1, fmt: pct });
  const box = document.getElementById("acc-pos"); box.innerHTML = "";
  acc.forEach((v, j) => {
    const sp = document.createElement("span");
    sp.className = "acc"; sp.dataset.position = String(j); sp.dataset.value = String(v);
    sp.textContent = "pos " + j + ": " + pct(v) + "  ";
    box.appendChild(sp);
  });
  const l = s.lossless;
  rows(document.getElementById("summary"), [
    ["mean accepted length (1 + accepted / drafts)", s.acceptance.length.toFixed(3)],
    ["acceptance rate (accepted / draft tokens)", pct(s.acceptance.rate)],
    ["verifications with drafts", String(s.acceptance.numDrafts)],
    ["lossless", l.status + (l.checked !== undefined ? " (" + l.checked + " checked, " + l.mismatched + " mismatched)" : ""), l.status === "ok" ? "ok" : l.status === "failed" ? "bad" : "pending"],
  ]);
  document.getElementById("summary").dataset.lossless = l.status;
  bars(document.getElementById("depth-chart"), s.depths.map((_, d) => String(d)), s.depths, { fmt: (v) => String(v), color: "#6a5acd" });
  const hl = (h) => h.counts.map((_, i) => i === h.counts.length - 1 ? ">" + h.edges[i] : "<" + h.edges[i + 1]);
  bars(document.getElementById("rtt-chart"), hl(s.stepRtt), s.stepRtt.counts, { fmt: (v) => v ? String(v) : "", color: "#3a9d5d" });
  document.getElementById("rtt-q").textContent = "p50 " + ms(s.stepRtt.p50Ms) + " · p90 " + ms(s.stepRtt.p90Ms) + " · p99 " + ms(s.stepRtt.p99Ms) + " · max " + ms(s.stepRtt.maxMs) + " ms (" + s.stepRtt.count + " STEPs)";
  stacked(document.getElementById("round-chart"), [["draft link", s.roundTime.linkMs], ["verify", s.roundTime.verifyMs], ["other", s.roundTime.otherMs]]);
  bars(document.getElementById("roundh-chart"), hl(s.round), s.round.counts, { fmt: (v) => v ? String(v) : "", color: "#e0913a" });
  const w = s.workers[0];
  rows(document.getElementById("workers"), [["worker", w.name], ["ready / epoch", (w.ready ? "ready" : "not ready") + " / " + w.epoch, w.ready ? "ok" : "bad"], ["STEPs (ok)", w.steps + " (" + w.ok + ")"], ["RTT p50", ms(w.rttP50Ms) + " ms"], ["sent / received", (w.bytesSent / 1048576).toFixed(1) + " / " + (w.bytesReceived / 1048576).toFixed(2) + " MiB"], ["last error", w.lastError || "none"]]);
  const e = s.encoders[0];
  rows(document.getElementById("encoders"), [["encoder", e.name], ["EC transfers", e.transfers + " (" + (e.bytes / 1048576).toFixed(1) + " MiB)"], ["lookups / cache hits / joined", e.lookups + " / " + e.cacheHits + " / " + e.joined], ["fallbacks / retries", e.fallbacks + " / " + e.retries], ["media wait p50", ms(e.waitP50Ms) + " ms"]]);
}
const src = new EventSource("/events");
src.onmessage = (ev) => render(JSON.parse(ev.data));
src.addEventListener("final", (ev) => { render(JSON.parse(ev.data)); src.close(); });
src.onerror = () => { const st = document.getElementById("status"); if (st.dataset.final !== "1") st.textContent = "disconnected (the run has ended?)"; };
</script>
</body>
</html>
`;
