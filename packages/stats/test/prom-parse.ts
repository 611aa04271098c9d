/** A small Prometheus text-format (0.0.4) parser, enough to read our exposition back. */
export interface PromSample {
  name: string;
  labels: Record<string, string>;
  value: number;
}
export interface PromFamily {
  name: string;
  help: string;
  type: string;
  samples: PromSample[];
}

function unescapeHelp(s: string): string {
  return s.replace(/\\(\\|n)/g, (_m, c: string) => (c === "n" ? "\n" : "\\"));
}

function parseValue(s: string): number {
  if (s === "+Inf") return Number.POSITIVE_INFINITY;
  if (s === "-Inf") return Number.NEGATIVE_INFINITY;
  if (s === "NaN") return Number.NaN;
  const v = Number(s);
  if (s.trim() === "" || Number.isNaN(v)) throw new Error(`bad sample value ${JSON.stringify(s)}`);
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
          else throw new Error(`bad escape \\${e} in ${JSON.stringify(line)}`);
        } else v += ch;
      }
      labels[lm[1]!] = v;
      if (line[i] === ",") i++;
      else if (line[i] !== "}") throw new Error(`expected , or } at ${i} in ${JSON.stringify(line)}`);
    }
    i++;
  }
  if (line[i] !== " ") throw new Error(`expected space before value in ${JSON.stringify(line)}`);
  const rest = line.slice(i + 1).split(" ");
  if (rest.length > 2) throw new Error(`trailing fields in ${JSON.stringify(line)}`);
  return { name, labels, value: parseValue(rest[0]!) };
}

/** Parses exposition text into families keyed by family name; throws on anything malformed. */
export function parseExposition(text: string): Map<string, PromFamily> {
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
      current = family(line.slice(7, sp));
      current.help = unescapeHelp(line.slice(sp + 1));
    } else if (line.startsWith("# TYPE ")) {
      const [name, type] = line.slice(7).split(" ");
      if (!name || !type || !["counter", "gauge", "summary", "histogram", "untyped"].includes(type)) {
        throw new Error(`bad TYPE line ${JSON.stringify(line)}`);
      }
      current = family(name);
      current.type = type;
    } else if (line.startsWith("#")) {
    } else {
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
