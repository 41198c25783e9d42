import path from "node:path";
import { breaksFieldValue, controlInFieldValue } from "../headers.js";
import { maxSecretValueBytes, secretTooLongReason, secretValueTooLong } from "../policy/secrets.js";
import { FileReadError, readFailure, readRegularFileSync } from "../regular-file.js";
import { homePath } from "../home-path.js";
import type { CustomNode } from "./validate.js";

/**
 * Where a secret's value comes from. A config file names a source (`env:GH_TOKEN`,
 * `file:/run/secrets/gh`), never the value: files are read, copied, diffed and committed by
 * people and tools that must not hold secrets. Only a CLI flag (`--host-secret NAME@HOST=VALUE`)
 * may carry a value inline, as it always could.
 */

/** A value given inline on the command line. YAML and JSON can never produce one. */
export class InlineSecret {
  /** `from`: how a message names where it came from (`inline`, or `env:NAME` for --host-secret's $NAME). */
  constructor(
    readonly value: string,
    readonly from = "inline",
  ) {}

  /** Never the value, whatever prints this. */
  toJSON(): string {
    return "[inline value]";
  }
}

const envName = /^[A-Za-z_][A-Za-z0-9_]*$/;
const conventionalEnvName = /^[A-Z_][A-Z0-9_]{0,63}$/;

const notInline =
  'must be "env:VAR" or "file:PATH", never the value itself: a config file is read, copied and committed by people and tools that must not hold secrets';

/** A secret's `value` in the schema. Its messages never quote the value. */
export const secretValueNode: CustomNode = {
  kind: "custom",
  expect: '"env:VAR" or "file:PATH"',
  doc: 'Where the value comes from: "env:VAR" (an environment variable of the proxy) or "file:PATH" (one trailing newline is dropped).',
  required: true,
  check(value, report, context) {
    if (value instanceof InlineSecret) {
      if (context.inlineSecrets !== true) report(notInline);
      return;
    }
    if (typeof value !== "string") return report(notInline);
    if (value.startsWith("env:")) {
      // Not quoted: what follows "env:" may be the value itself, pasted in place of a name.
      if (!envName.test(value.slice(4))) report('names no environment variable: "env:" must be followed by a variable name ([A-Za-z_][A-Za-z0-9_]*), and what follows is not one (not shown: it may be the value itself)');
      return;
    }
    if (value.startsWith("file:")) {
      if (value.length === 5) report('names no file: "file:" must be followed by a path');
      return;
    }
    report(notInline);
  },
};

/** A source read: its description (safe to print) and the value, or why it could not be read. */
export type ReadSecret = { readonly from: string; readonly value: string } | { readonly from: string; readonly reason: string };

/**
 * A `file:` value's bytes as text. Fatal: a byte that is not UTF-8 is an error, not U+FFFD. A
 * byte order mark is kept, to be refused.
 */
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Reads a validated source. `file:` paths are taken relative to `baseDir` (the config file's folder), `~/` from $HOME. */
export function readSecret(source: string | InlineSecret, baseDir: string, env: NodeJS.ProcessEnv): ReadSecret {
  if (source instanceof InlineSecret) return decoded(source.from, source.value) ?? checked(source.from, source.value);
  if (source.startsWith("env:")) {
    const name = source.slice(4);
    // Own variables only: `env:toString` found a function on the prototype.
    const value = Object.hasOwn(env, name) ? env[name] : undefined;
    if (value === undefined) {
      // A token pasted after "env:" (env:ghp_…) is a valid name too: only a name written as
      // variables are (capitals, digits, "_") is quoted back.
      if (!conventionalEnvName.test(name)) return { from: "env:(not shown)", reason: "names an environment variable that is not set (its name is not shown: one in lowercase may be a token pasted in place of a name)" };
      return { from: source, reason: `names $${name}, which is not set` };
    }
    return decoded(source, value) ?? checked(source, value);
  }
  const home = homePath(source.slice(5), env, (reason): ReadSecret => ({ from: source, reason }));
  if (typeof home !== "string") return home;
  const file = path.resolve(baseDir, home);
  const from = `file:${file}`;
  let bytes: Buffer;
  try {
    // The longest value, and the line break an editor ends it with; a longer file is not read to its end.
    bytes = readRegularFileSync(file, maxSecretValueBytes + 2);
  } catch (error) {
    if (error instanceof FileReadError && error.limit !== undefined) return { from, reason: `${secretTooLongReason} (from ${from})` };
    return { from, reason: `cannot read ${file}: ${readFailure(error)}` };
  }
  let text: string;
  try {
    text = utf8.decode(bytes);
  } catch {
    // Read as UTF-8 with replacement, each such byte became U+FFFD, sent as EF BF BD: a value
    // that was not the file's, and an upstream's 401 with nothing said of why.
    return { from, reason: `holds bytes that are not UTF-8 (from ${from}); a value is sent as its UTF-8 bytes, and these would be changed` };
  }
  // An editor's mark (Notepad's UTF-8), no part of a token: it went out as three bytes before the value.
  if (text.startsWith("\uFEFF")) return { from, reason: `starts with a byte order mark, U+FEFF (from ${from}), which editors add and no credential holds; save the file without one` };
  // Editors and `echo` end a file with a newline that is no part of the token. A U+FFFD the file
  // holds as such (EF BF BD, valid UTF-8) is what an earlier decoding left of other bytes.
  return decoded(from, text) ?? checked(from, text.replace(/\r?\n$/, ""));
}

/**
 * Why a value Node decoded for the proxy (an environment variable, or an argument) is not the
 * one that was set, as a `file:` value that is not UTF-8 or starts with a BOM is refused: Node
 * decodes a variable's bytes as UTF-8, each byte that is not UTF-8 becoming U+FFFD, sent as
 * EF BF BD; and a BOM comes with a value read from a file an editor saved (`TOKEN=$(cat
 * token.txt)`). Both went out as they were, and an upstream's 401 said nothing of why. A
 * variable is named, never its value.
 */
function decoded(from: string, value: string): ReadSecret | undefined {
  if (value.includes("\uFFFD")) {
    return { from, reason: `holds bytes that are not UTF-8, or U+FFFD, the character Node puts in their place (from ${from}); a value is sent as its UTF-8 bytes, and these would be changed` };
  }
  if (value.startsWith("\uFEFF")) return { from, reason: `starts with a byte order mark, U+FEFF (from ${from}), which editors add and no credential holds; set it without one` };
  return undefined;
}

function checked(from: string, value: string): ReadSecret {
  if (value === "") return { from, reason: `is empty (from ${from})` };
  // Never the value, nor a part of it.
  if (secretValueTooLong(value)) return { from, reason: `${secretTooLongReason} (from ${from})` };
  // A value goes into header fields: CR, LF and NUL would split or truncate them.
  if (breaksFieldValue.test(value)) return { from, reason: `holds a line break or NUL (from ${from}); a value must fit in one header field` };
  if (controlInFieldValue.test(value)) return { from, reason: `holds a control character other than tab (ESC, DEL, U+0001 to U+001F) (from ${from}); a header field cannot carry one` };
  return { from, value };
}
