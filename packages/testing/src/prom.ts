import { spawnSync } from "node:child_process";
import { TestingError, TestingErrorCode } from "./errors.js";

/** One sample line of a Prometheus text exposition. */
export interface PromSample {
  /** Sample name (`x_bucket`, `x_sum`, …). */
  name: string;
  /** Label values by label name. */
  labels: Record<string, string>;
  /** The value (`+Inf`, `-Inf`, `NaN` included). */
  value: number;
}

/** One metric family: its HELP, TYPE and samples. */
export interface PromFamily {
  /** Family name (the `# TYPE` name). */
  name: string;
  /** HELP text, unescaped ("" when absent). */
  help: string;
  /** TYPE (`untyped` when absent). */
  type: string;
  /** Samples in order. */
  samples: PromSample[];
}

function parseValue(s: string, line: string): number {
  if (s === "+Inf") return Number.POSITIVE_INFINITY;
  if (s === "-Inf") return Number.NEGATIVE_INFINITY;
  if (s === "NaN") return Number.NaN;
  const v = Number(s);
  if (s.trim() === "" || Number.isNaN(v)) throw new Error(`bad sample value in ${JSON.stringify(line)}`);
  return v;
}

function parseSample(line: string): PromSample {
  const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(line);
  if (!m) throw new Error(`bad sample line ${JSON.stringify(line)}`);
  const name = m[1]!;
  let i = name.length;
  const labels: Record<string, string> = {};
  if (line[i] === "{") {
    i++;
    while (line[i] !== "}") {
      const lm = /^([a-zA-Z_][a-zA-Z0-9_]*)="/.exec(line.slice(i));
      if (!lm) throw new Error(`bad label at ${i} in ${JSON.stringify(line)}`);
      i += lm[0].length;
      let v = "";
      for (;;) {
        const ch = line[i];
        if (ch === undefined) throw new Error(`unterminated label value in ${JSON.stringify(line)}`);
        i++;
        if (ch === '"') break;
        if (ch === "\\") {
          const e = line[i++];
          if (e === "n") v += "\n";
          else if (e === "\\" || e === '"') v += e;
          else throw new Error(`bad escape in ${JSON.stringify(line)}`);
        } else v += ch;
      }
      labels[lm[1]!] = v;
      if (line[i] === ",") i++;
      else if (line[i] !== "}") throw new Error(`expected , or } in ${JSON.stringify(line)}`);
    }
    i++;
  }
  if (line[i] !== " ") throw new Error(`expected a space before the value in ${JSON.stringify(line)}`);
  const rest = line.slice(i + 1).split(" ");
  if (rest.length > 2) throw new Error(`trailing fields in ${JSON.stringify(line)}`);
  return { name, labels, value: parseValue(rest[0]!, line) };
}

/**
 * Parses Prometheus text format 0.0.4 into families keyed by family name (histogram `_bucket`,
 * `_sum`, `_count` samples belong to their family). Throws on anything malformed. For reading
 * values back in tests; validity is {@link promtoolCheck}'s job.
 */
export function parsePrometheus(text: string): Map<string, PromFamily> {
  const families = new Map<string, PromFamily>();
  let current: PromFamily | undefined;
  const family = (name: string): PromFamily => {
    let f = families.get(name);
    if (!f) {
      f = { name, help: "", type: "untyped", samples: [] };
      families.set(name, f);
    }
    return f;
  };
  for (const line of text.split("\n")) {
    if (line === "") continue;
    if (line.startsWith("# HELP ")) {
      const sp = line.indexOf(" ", 7);
      current = family(sp < 0 ? line.slice(7) : line.slice(7, sp));
      current.help =
        sp < 0 ? "" : line.slice(sp + 1).replace(/\\(\\|n)/g, (_m, c: string) => (c === "n" ? "\n" : "\\"));
    } else if (line.startsWith("# TYPE ")) {
      const [name, type] = line.slice(7).split(" ");
      if (!name || !type || !["counter", "gauge", "summary", "histogram", "untyped"].includes(type)) {
        throw new Error(`bad TYPE line ${JSON.stringify(line)}`);
      }
      current = family(name);
      current.type = type;
    } else if (!line.startsWith("#")) {
      const s = parseSample(line);
      const owner =
        current && (s.name === current.name || s.name.startsWith(`${current.name}_`))
          ? current
          : family(s.name);
      owner.samples.push(s);
    }
  }
  return families;
}

/**
 * The value of the first sample named `sample` whose labels include `labels`, from exposition
 * text or parsed families; `undefined` when there is none.
 */
export function sampleValue(
  exposition: string | Map<string, PromFamily>,
  sample: string,
  labels: Record<string, string> = {},
): number | undefined {
  const fams = typeof exposition === "string" ? parsePrometheus(exposition) : exposition;
  for (const f of fams.values()) {
    for (const s of f.samples) {
      if (s.name === sample && Object.entries(labels).every(([k, v]) => s.labels[k] === v)) return s.value;
    }
  }
  return undefined;
}

/** What `promtool check metrics` said. */
export interface PromtoolResult {
  /** True when promtool exited 0 with nothing to say. */
  ok: boolean;
  /** promtool's exit status (0 clean, 3 lint problems, 1 parse error). */
  status: number;
  /** promtool's lines (lint problems, parse errors). */
  problems: string[];
}

/**
 * Runs the real `promtool check metrics` (Debian package `prometheus`) over an exposition.
 * Throws `TESTING_PROMTOOL` when promtool is missing: a metrics test must fail, not skip, without
 * it (`.ci/run` installs it).
 */
export function promtoolCheck(text: string): PromtoolResult {
  const r = spawnSync("promtool", ["check", "metrics"], { input: text, encoding: "utf8", timeout: 30_000 });
  if (r.error) {
    throw new TestingError(
      TestingErrorCode.PROMTOOL,
      `promtool did not run (${r.error.message}); install it: apt-get install -y prometheus`,
      { cause: r.error },
    );
  }
  const problems = `${r.stdout}${r.stderr}`.split("\n").filter((l) => l.trim() !== "");
  return { ok: r.status === 0 && problems.length === 0, status: r.status ?? -1, problems };
}

/** GETs `url` (e.g. `http://127.0.0.1:9464/metrics`) and returns the status and body; bounded by `timeoutMs`. */
export async function scrape(url: string, timeoutMs = 10_000): Promise<{ status: number; text: string }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  return { status: res.status, text: await res.text() };
}
