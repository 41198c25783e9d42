import { constants } from "node:buffer";
import { byteSize, FileReadError, readRegularFile } from "../regular-file.js";

/**
 * The longest text JSON.parse can be given: V8's longest string (2^29 - 24 characters, about
 * 512 MiB). A HAR larger than that failed with ERR_STRING_TOO_LONG, which said nothing of why.
 */
export const maxJsonText = constants.MAX_STRING_LENGTH;

/** How a recording's HAR ends, after its last entry (recording.ts writes it so). */
const closing = "]}}";

/**
 * A HAR file parsed: as one JSON text when it can be one, else, past {@link maxJsonText}, an
 * entry a line, as the recorder writes it (`{"log":{…,"entries":[`, each entry on a line of
 * its own followed by a comma but the last, then `]}}`), so a recording that grew past the
 * limit still checks and replays. A larger file laid out otherwise is refused with a
 * FileReadError naming the limit. `maxText` is for tests.
 */
export async function readHarJson(path: string, maxText: number = maxJsonText): Promise<unknown> {
  const bytes = await readRegularFile(path);
  // UTF-8 never takes fewer bytes than the UTF-16 units its text does: this many bytes fit.
  if (bytes.length <= maxText) return JSON.parse(bytes.toString("utf8"));
  const parsed = byLines(bytes, maxText);
  if (parsed === undefined) {
    throw new FileReadError(
      `${byteSize(bytes.length)}: more than ${maxText} bytes, the longest text Node can parse as one JSON document, and not laid out an entry a line as egressgate records it`,
    );
  }
  return parsed;
}

function byLines(bytes: Buffer, maxText: number): unknown {
  const lines: Buffer[] = [];
  for (let at = 0; at < bytes.length; ) {
    const end = bytes.indexOf(0x0a, at);
    const line = bytes.subarray(at, end < 0 ? bytes.length : end);
    if (line.length > maxText) return undefined;
    lines.push(line);
    at = end < 0 ? bytes.length : end + 1;
  }
  while (lines.length > 0 && lines.at(-1)!.toString("utf8").trim() === "") lines.pop();
  const head = lines.shift()?.toString("utf8");
  if (head === undefined || !head.endsWith('"entries":[') || lines.pop()?.toString("utf8").trim() !== closing) return undefined;
  let har: unknown;
  try {
    har = JSON.parse(`${head}${closing}`);
  } catch {
    return undefined;
  }
  const entries = (har as { log?: { entries?: unknown } } | null)?.log?.entries;
  if (!Array.isArray(entries) || entries.length > 0) return undefined;
  lines.forEach((line, i) => {
    const text = line.toString("utf8");
    const last = i === lines.length - 1;
    try {
      if (!last && !text.endsWith(",")) throw new SyntaxError("the line does not end with a comma");
      entries.push(JSON.parse(last ? text : text.slice(0, -1)));
    } catch (error) {
      throw new SyntaxError(`entry ${i}, on line ${i + 2}: ${(error as Error).message}`, { cause: error });
    }
  });
  return har;
}
