/**
 * Cases, verdicts and the run loop shared by every mode (worker, client, ec-producer,
 * ec-consumer). A case is numbered by its contract section (`6.2.3`), cites the sentence it
 * checks, and ends with one verdict.
 */

/** Verdicts of a case (as h2spec and the Autobahn testsuite report them). */
export const Verdict = {
  OK: "OK",
  NON_STRICT: "NON-STRICT",
  INFORMATIONAL: "INFORMATIONAL",
  UNIMPLEMENTED: "UNIMPLEMENTED",
  FAILED: "FAILED",
} as const;
/** One of the {@link Verdict} values. */
export type Verdict = (typeof Verdict)[keyof typeof Verdict];

/** A numbered case. */
export interface CaseDef<C> {
  /** Number, e.g. `6.2.3`: the contract section, then the case. */
  id: string;
  /** One line: what is sent and what must happen. */
  title: string;
  /** The sentence of the contract it checks (quoted or closely paraphrased), with its section. */
  cite: string;
  /**
   * `MUST`: a miss is FAILED. `SHOULD`: a miss is NON-STRICT. `INFO`: a miss is INFORMATIONAL
   * (behaviour the contract leaves open, reported for the implementer).
   */
  level?: "MUST" | "SHOULD" | "INFO";
  /** Runs the case; it ends by returning (OK) or through `t` (any other verdict). */
  run(ctx: C, t: CaseCheck): Promise<void>;
}

/** Result of one case. */
export interface CaseResult {
  /** The case number (`6.2.3`). */
  id: string;
  /** What was sent and what had to happen. */
  title: string;
  /** The contract sentence the case checks. */
  cite: string;
  /** The section the report groups it under (`6.2`, `11`). */
  section: string;
  /** The verdict. */
  verdict: Verdict;
  /** The failing expectation (FAILED / NON-STRICT / INFORMATIONAL) or why it did not apply. */
  expected?: string;
  /** What arrived instead. */
  got?: string;
  /** Free-form notes (e.g. a worker answering SKIPPED where it could draft). */
  notes: string[];
  /** Wall time of the case. */
  ms: number;
}

/** Thrown inside a case to end it with a verdict. */
export class CaseEnd extends Error {
  constructor(
    readonly verdict: Verdict,
    readonly expected: string,
    readonly got: string,
  ) {
    super(`${verdict}: expected ${expected}, got ${got}`);
  }
}

/** The assertion object a case gets. */
export class CaseCheck {
  /** Notes collected for the result. */
  readonly notes: string[] = [];
  constructor(private readonly level: "MUST" | "SHOULD" | "INFO") {}

  private missVerdict(): Verdict {
    return this.level === "MUST"
      ? Verdict.FAILED
      : this.level === "SHOULD"
        ? Verdict.NON_STRICT
        : Verdict.INFORMATIONAL;
  }

  /** Ends the case with the case's miss verdict unless `cond`. */
  expect(cond: boolean, expected: string, got: string | (() => string)): asserts cond {
    if (!cond) throw new CaseEnd(this.missVerdict(), expected, typeof got === "function" ? got() : got);
  }

  /** Ends the case FAILED (whatever its level) unless `cond`. */
  must(cond: boolean, expected: string, got: string | (() => string)): asserts cond {
    if (!cond) throw new CaseEnd(Verdict.FAILED, expected, typeof got === "function" ? got() : got);
  }

  /** Ends the case NON-STRICT unless `cond` (a SHOULD missed). */
  should(cond: boolean, expected: string, got: string | (() => string)): void {
    if (!cond) throw new CaseEnd(Verdict.NON_STRICT, expected, typeof got === "function" ? got() : got);
  }

  /** Ends the case UNIMPLEMENTED: an optional feature the peer does not offer. */
  unimplemented(why: string): never {
    throw new CaseEnd(Verdict.UNIMPLEMENTED, why, "not offered by the peer");
  }

  /** Ends the case INFORMATIONAL: not applicable here, or behaviour the contract leaves open. */
  info(expected: string, got: string): never {
    throw new CaseEnd(Verdict.INFORMATIONAL, expected, got);
  }

  /** Adds a note to the result. */
  note(s: string): void {
    if (this.notes.length < 20) this.notes.push(s);
  }
}

/** Section of a case id: `6.2.3` → `6.2`, `3.1` → `3`, `8.4` → `8`. */
export function sectionOf(id: string): string {
  const parts = id.split(".");
  return parts.length >= 3 ? `${parts[0]}.${parts[1]}` : (parts[0] ?? id);
}

/** Glob filter on case ids (`7.2.*`, `6.2.3`, comma-separated lists). */
export function caseFilter(spec: string | undefined): (id: string) => boolean {
  if (spec === undefined || spec.trim() === "") return () => true;
  const res = spec
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "")
    .map(
      (s) =>
        new RegExp(
          `^${s
            .replace(/[.+^${}()|[\]\\]/g, "\\$&")
            .replace(/\*/g, ".*")
            .replace(/\?/g, ".")}$`,
        ),
    );
  return (id) => res.some((r) => r.test(id) || r.test(`${id}.`));
}

/** Options of {@link runCases}. */
export interface RunOptions {
  /** Case filter (see {@link caseFilter}). */
  cases?: string;
  /** Bound of one case in ms (default 20000): a case past it is FAILED. */
  caseTimeoutMs?: number;
  /** Called after each case (progress output). */
  onResult?: (r: CaseResult) => void;
}

/** Runs cases in order; setup/teardown hooks run around each. */
export async function runCases<C>(
  defs: readonly CaseDef<C>[],
  ctx: C,
  opts: RunOptions & { before?: (c: CaseDef<C>) => Promise<void>; after?: () => Promise<void> } = {},
): Promise<CaseResult[]> {
  const keep = caseFilter(opts.cases);
  const out: CaseResult[] = [];
  for (const d of defs) {
    if (!keep(d.id)) continue;
    const t = new CaseCheck(d.level ?? "MUST");
    const t0 = performance.now();
    let verdict: Verdict = Verdict.OK;
    let expected: string | undefined;
    let got: string | undefined;
    let timer: NodeJS.Timeout | undefined;
    try {
      await opts.before?.(d);
      const limit = opts.caseTimeoutMs ?? 20_000;
      await Promise.race([
        d.run(ctx, t),
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () =>
              reject(
                new CaseEnd(
                  Verdict.FAILED,
                  `the case to finish within ${limit} ms`,
                  "no end (the peer stopped answering?)",
                ),
              ),
            limit,
          );
        }),
      ]);
    } catch (e) {
      if (e instanceof CaseEnd) {
        verdict = e.verdict;
        expected = e.expected;
        got = e.got;
      } else {
        verdict = Verdict.FAILED;
        expected = "the case to run";
        got = `tester error: ${e instanceof Error ? (e.stack ?? e.message) : String(e)}`;
      }
    } finally {
      clearTimeout(timer);
      try {
        await opts.after?.();
      } catch {
        // teardown problems are not the peer's
      }
    }
    const r: CaseResult = {
      id: d.id,
      title: d.title,
      cite: d.cite,
      section: sectionOf(d.id),
      verdict,
      notes: t.notes,
      ms: Math.round(performance.now() - t0),
      ...(expected !== undefined ? { expected } : {}),
      ...(got !== undefined ? { got } : {}),
    };
    out.push(r);
    opts.onResult?.(r);
  }
  return out;
}

/** Deterministic PRNG (mulberry32) for rows and fuzz input: a run can be repeated with `--seed`. */
export class Rng {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0 || 1;
  }
  /** Uniform u32. */
  u32(): number {
    this.s = (this.s + 0x6d2b79f5) >>> 0;
    let t = this.s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }
  /** Integer in [0, n). */
  int(n: number): number {
    return this.u32() % n;
  }
  /** Random bytes. */
  bytes(n: number): Uint8Array {
    const b = new Uint8Array(n);
    for (let i = 0; i < n; i++) b[i] = this.u32() & 0xff;
    return b;
  }
  /** A random non-zero u32 (session ids). */
  nonZero(): number {
    let x = 0;
    while (x === 0) x = this.u32();
    return x;
  }
}
