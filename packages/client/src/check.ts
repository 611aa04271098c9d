import { ClientError } from "./errors.js";

/** `CLIENT_BAD_OPTION` naming the option, what it must be and what it got. */
export function badOption(name: string, what: string, got: unknown): ClientError {
  const shown = typeof got === "string" ? JSON.stringify(got) : String(got);
  return new ClientError("CLIENT_BAD_OPTION", `${name} must be ${what}, got ${shown}`);
}

/** The one integer-in-range option check of the package: returns `value` or throws naming `name`. */
export function intInRange(name: string, value: unknown, min: number, max: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    throw badOption(name, `an integer in ${min}..${max}`, value);
  }
  return value;
}

/** A finite number `>= min` (ms and other real-valued options), or throws naming `name`. */
export function finiteAtLeast(name: string, value: unknown, min: number): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < min) {
    throw badOption(name, `a finite number >= ${min}`, value);
  }
  return value;
}
