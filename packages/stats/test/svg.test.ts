// The SVG writer (issue 24): deterministic documents, one bar per value, escaped text, series
// and legend; checked as XML by the real Chromium parser is the harness's job, here by structure.
import { expect, test } from "vitest";
import { barChartSvg, lineChartSvg } from "../src/index.js";

test("bar chart: one rect per value (plus the background), labels and values escaped, same bytes twice", () => {
  const o = { title: "A <b> & c", labels: ["p0", "p<1>"], values: [0.5, 0.25], max: 1, yLabel: "rate" };
  const svg = barChartSvg(o);
  expect(svg).toBe(barChartSvg(o));
  expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true);
  expect(svg.match(/<rect /g)!.length).toBe(3);
  expect(svg).toContain("A &#60;b&#62; &#38; c");
  expect(svg).toContain("p&#60;1&#62;");
  expect(svg).not.toContain("<b>");
  // the bars' heights follow the values (half and a quarter of the same plot)
  const hs = [...svg.matchAll(/<rect x="[\d.]+" y="[\d.]+" width="[\d.]+" height="([\d.]+)"/g)].map((m) =>
    Number(m[1]),
  );
  expect(hs[0]! / hs[1]!).toBeCloseTo(2, 1);
  // NaN and negative values draw as 0, never as NaN in the document
  expect(barChartSvg({ title: "t", labels: ["a"], values: [Number.NaN] })).not.toContain("NaN");
});

test("line chart: a polyline and points per series, and a legend", () => {
  const svg = lineChartSvg({
    title: "g",
    series: [
      {
        name: "one",
        points: [
          [0, 1],
          [1, 2],
          [2, 3],
        ],
      },
      {
        name: "two",
        points: [
          [0, 2],
          [2, 1],
        ],
      },
    ],
  });
  expect(svg.match(/<polyline /g)!.length).toBe(2);
  expect(svg.match(/<circle /g)!.length).toBe(5);
  expect(svg).toContain(">one</text>");
  expect(svg).toContain(">two</text>");
});
