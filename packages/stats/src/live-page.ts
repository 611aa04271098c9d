// A generic live page of a registry snapshot (issue 24, `tapwire-worker --ui`): hand-written
// HTML with inline SVG, fed by an `sseRoute` at `/events` whose events are a StatsSnapshot
// (counters, gauges, info, histograms) with any extra top-level fields shown as a status line.

/** The HTML of a live page titled `title` that renders the snapshots streamed at `/events`. */
export function registryPage(title: string): string {
  const t = title.replace(/[<>&"]/g, (c) => `&#${c.charCodeAt(0)};`);
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${t}: live view</title>
<style>
 body { font: 14px/1.4 system-ui, sans-serif; margin: 16px; background: #fafafa; color: #222; }
 .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(380px, 1fr)); gap: 12px; }
 .panel { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 10px 12px; }
 h1 { font-size: 18px; margin: 0 0 8px; } h2 { font-size: 14px; margin: 0 0 6px; }
 td { padding: 1px 4px; } td.v { text-align: right; font-variant-numeric: tabular-nums; }
 svg text { font: 11px system-ui, sans-serif; fill: #444; }
</style></head><body>
<h1>${t}: live view</h1><div id="status">connecting…</div>
<div class="grid">
 <div class="panel"><h2>Counters</h2><table id="counters"></table></div>
 <div class="panel"><h2>Gauges and values</h2><table id="gauges"></table></div>
 <div class="panel"><h2>Histograms (p50 / p90 / p99, ms or units)</h2><div id="hists"></div></div>
</div>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
let n = 0;
function table(id, obj) {
  const t = document.getElementById(id); t.innerHTML = "";
  for (const k of Object.keys(obj).sort()) {
    const tr = document.createElement("tr");
    const a = document.createElement("td"); a.textContent = k;
    const b = document.createElement("td"); b.className = "v"; b.textContent = String(obj[k]);
    tr.dataset.name = k; tr.append(a, b); t.appendChild(tr);
  }
}
function hists(h) {
  const box = document.getElementById("hists"); box.innerHTML = "";
  for (const k of Object.keys(h).sort()) {
    const s = h[k]; if (!s.count) continue;
    const f = s.unit === "seconds" ? 1000 : 1;
    const vals = [s.p50 * f, s.p90 * f, s.p99 * f]; const max = Math.max(1e-9, ...vals);
    const svg = document.createElementNS(NS, "svg"); svg.setAttribute("width", "360"); svg.setAttribute("height", "46");
    vals.forEach((v, i) => {
      const r = document.createElementNS(NS, "rect");
      r.setAttribute("x", "40"); r.setAttribute("y", String(2 + i * 14)); r.setAttribute("height", "11");
      r.setAttribute("width", String(Math.max(1, 250 * v / max))); r.setAttribute("fill", "#4a7bd0"); svg.appendChild(r);
      const l = document.createElementNS(NS, "text"); l.setAttribute("x", "0"); l.setAttribute("y", String(12 + i * 14));
      l.textContent = ["p50", "p90", "p99"][i]; svg.appendChild(l);
      const x = document.createElementNS(NS, "text"); x.setAttribute("x", String(44 + 250 * v / max)); x.setAttribute("y", String(12 + i * 14));
      x.textContent = v.toFixed(3); svg.appendChild(x);
    });
    const d = document.createElement("div"); d.textContent = k + " (" + s.count + ")"; box.append(d, svg);
  }
}
function render(s) {
  document.body.dataset.events = String(++n);
  const rest = {};
  for (const k of Object.keys(s)) if (!["counters", "gauges", "info", "histograms"].includes(k) && typeof s[k] !== "object") rest[k] = s[k];
  document.getElementById("status").textContent = Object.entries(rest).map(([k, v]) => k + " " + v).join(" · ");
  table("counters", s.counters || {});
  table("gauges", Object.assign({}, s.gauges || {}, s.info || {}));
  hists(s.histograms || {});
}
const src = new EventSource("/events");
src.onmessage = (ev) => render(JSON.parse(ev.data));
src.onerror = () => { document.getElementById("status").textContent = "disconnected"; };
</script></body></html>
`;
}
