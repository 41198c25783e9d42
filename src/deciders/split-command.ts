/**
 * `--hook-command "./check.sh --mode 'strict mode'"` into argv, the way a POSIX shell splits
 * words: blanks separate words, single quotes keep everything, double quotes keep everything but
 * `\"`, `\\`, `\$` and `` \` ``, and a backslash outside quotes keeps the next character. Nothing
 * is expanded (no `$VAR`, globs, `~` or substitutions): the command runs without a shell unless
 * `shell: true`, and this only saves the operator from writing a JSON list.
 */
export function splitCommand(text: string): { readonly argv: string[] } | { readonly error: string } {
  const argv: string[] = [];
  let word = "";
  let inWord = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (c === "\0") return { error: "must not contain NUL" };
    if (c === " " || c === "\t" || c === "\n") {
      if (inWord) argv.push(word);
      word = "";
      inWord = false;
      continue;
    }
    inWord = true;
    if (c === "'") {
      const end = text.indexOf("'", i + 1);
      if (end < 0) return { error: "has an unterminated single quote" };
      word += text.slice(i + 1, end);
      i = end;
    } else if (c === '"') {
      let j = i + 1;
      for (; j < text.length && text[j] !== '"'; j++) {
        if (text[j] === "\\" && j + 1 < text.length && '"\\$`'.includes(text[j + 1]!)) j++;
        word += text[j]!;
      }
      if (j >= text.length) return { error: "has an unterminated double quote" };
      i = j;
    } else if (c === "\\") {
      if (i + 1 >= text.length) return { error: "ends with a lone backslash" };
      word += text[++i]!;
    } else word += c;
  }
  if (inWord) argv.push(word);
  return { argv };
}
