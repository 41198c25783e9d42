import { phaseNames, type PhaseName, type PolicyKind } from "./protocol.js";

/**
 * A name a policy's top level defined, as the sandbox's `load()` reports it (entry.js): an
 * export (for a script, a top-level binding), or a property it set on `globalThis`.
 */
export interface FoundName {
  readonly name: string;
  /** `function`, `class`, `null`, `accessor`, a `typeof`, or an object's tag (`Object`, `Set`, …). */
  readonly what: string;
  readonly from: "export" | "global";
  /** For an object default export: its own keys. */
  readonly holds?: readonly string[];
}

/** What the sandbox's `load()` answers. */
export interface LoadedNames {
  readonly phases: PhaseName[];
  readonly found: readonly FoundName[];
}

function isPhase(name: string): name is PhaseName {
  return (phaseNames as readonly string[]).includes(name);
}

/**
 * Edits from one name to another, case aside, a swap of two neighbours counting as one edit
 * (optimal string alignment): `handel` is one from `handle`, as `isRequestAlowed` is from
 * `isRequestAllowed`.
 */
function distance(a: string, b: string): number {
  const x = a.toLowerCase();
  const y = b.toLowerCase();
  const rows: number[][] = [Array.from({ length: y.length + 1 }, (_, j) => j)];
  for (let i = 1; i <= x.length; i++) {
    const row = [i];
    for (let j = 1; j <= y.length; j++) {
      let d = Math.min(rows[i - 1]![j]! + 1, row[j - 1]! + 1, rows[i - 1]![j - 1]! + (x[i - 1] === y[j - 1] ? 0 : 1));
      if (i > 1 && j > 1 && x[i - 1] === y[j - 2] && x[i - 2] === y[j - 1]) d = Math.min(d, rows[i - 2]![j - 2]! + 1);
      row.push(d);
    }
    rows.push(row);
  }
  return rows[x.length]![y.length]!;
}

/**
 * The phase a name looks like a misspelling of, if any: within 2 edits of `isRequestAllowed`
 * and 1 of the shorter names (2 would take in a helper's `isAllowed`, `bundle` or `angle`).
 */
export function nearPhase(name: string): PhaseName | undefined {
  if (isPhase(name) || name.length > 40) return undefined;
  let best: PhaseName | undefined;
  let bestDistance = Infinity;
  for (const phase of phaseNames) {
    const d = distance(name, phase);
    if (d <= (phase.length < 12 ? 1 : 2) && d < bestDistance) {
      best = phase;
      bestDistance = d;
    }
  }
  return best;
}

/** A name as the message shows it: an identifier as is, anything else quoted (a module may export `"a\nb"`). */
function shown(name: string): string {
  return /^[A-Za-z_$][\w$]{0,79}$/.test(name) ? name : JSON.stringify(name.slice(0, 80));
}

function article(what: string): string {
  if (what === "null" || what === "undefined") return what;
  if (what === "accessor") return "a getter";
  const word = what === "Object" || what === "Array" ? what.toLowerCase() : what;
  return `${/^[aeiouAEIOU]/.test(word) ? "an" : "a"} ${word}`;
}

function definition(kind: PolicyKind, phase: PhaseName): string {
  return kind === "script" ? `function ${phase}(…) { … }` : `export function ${phase}(…) { … }`;
}

/**
 * Why a policy that loaded must still be refused, or undefined when it may serve. A policy that
 * defines no phase would decide nothing and let through whatever the other tiers allow, so a
 * misspelt hook, a truncated file or a hook in the wrong place would fail open without a word.
 * As config files refuse misspelt keys and tier 3 refuses keys that would never run, so is
 * anything here that looks meant as a phase but would never be called: a phase name bound to a
 * non-function (or a class), a near-miss of a phase name, phases held by a default export, and
 * phases set on `globalThis`.
 */
export function phaseProblem(filename: string, kind: PolicyKind, loaded: LoadedNames, empty: boolean): string | undefined {
  const none = loaded.phases.length === 0;
  const exportWord = kind === "script" ? "declares" : "exports";
  const problems: string[] = [];
  const others: string[] = [];
  for (const found of loaded.found) {
    const near = nearPhase(found.name);
    const phase = isPhase(found.name) ? found.name : near;
    if (found.from === "global") {
      if (phase !== undefined) {
        problems.push(`${shown(found.name)} is set on globalThis, where no call ever looks for it; define it as ${definition(kind, phase)}`);
      }
      continue;
    }
    if (isPhase(found.name)) {
      if (found.what !== "function") problems.push(`${found.name} is ${article(found.what)}, not a function`);
      continue;
    }
    if (found.name === "default") {
      const held = (found.holds ?? []).filter((key) => isPhase(key) || nearPhase(key) !== undefined);
      if (held.length > 0) {
        problems.push(`its default export holds ${held.map(shown).join(", ")}, which no call ever reads; ${kind === "script" ? "declare" : "export"} each phase by name: ${definition(kind, isPhase(held[0]!) ? held[0] : nearPhase(held[0]!)!)}`);
      } else if (none) {
        problems.push(`its default export is ${article(found.what)}; a phase is a named export: ${definition(kind, "onRequest")}`);
      }
      continue;
    }
    // Alongside real phases, only a function near a phase name is refused: a helper exported
    // as `onRequests` is a hook that would never run; a constant of that name is not.
    if (near !== undefined && (none || found.what === "function")) {
      problems.push(`${shown(found.name)} is not a phase and would never be called; did you mean "${near}"?`);
      continue;
    }
    others.push(shown(found.name));
  }
  if (!none) return problems.length === 0 ? undefined : `${filename}: ${problems.join("; ")}`;
  const head = `${filename}: the policy defines no phase (${phaseNames.join(", ")}), so it would decide nothing`;
  if (problems.length > 0) return `${head}: ${problems.join("; ")}`;
  if (empty) return `${head}: the file is empty (a save caught half-way?)`;
  if (others.length > 0) return `${head}: it ${exportWord} only ${others.slice(0, 10).join(", ")}${others.length > 10 ? ", …" : ""}`;
  if (kind === "typescript") return `${head}: it exports nothing that exists when it runs (types and \`declare\`s are erased)`;
  if (kind === "module") return `${head}: it exports nothing`;
  return `${head}: a script defines a phase as a top-level function`;
}
