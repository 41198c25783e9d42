/**
 * Per-request logging cost: the decision line ("request", eleven fields) written by egressgate's
 * own logger and by pino, to /dev/null, N times each, in alternating rounds.
 *
 *   npm install --no-save --prefix .scratch/pino pino@10.4.0   # pino is not a dependency
 *   PINO_DIR=.scratch/pino node --import tsx bench/logger.ts [lines]
 */
import { openSync, writeSync, closeSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";
import { createLogger } from "../src/log.js";
import { GuestRedactor } from "../src/proxy/redactor.js";

const lines = Number(process.argv[2] ?? 200_000);
const pinoDir = resolve(process.env["PINO_DIR"] ?? ".scratch/pino");
const require = createRequire(`${pinoDir}/package.json`);
interface PinoLogger {
  info(fields: object, msg: string): void;
}
interface Pino {
  (options: object, destination: unknown): PinoLogger;
  readonly version: string;
  readonly stdTimeFunctions: { readonly isoTime: () => string };
  destination(options: object): NodeJS.EventEmitter & { flushSync(): void };
}
const pino = require("pino") as Pino;

const fd = openSync("/dev/null", "w");
const fields = (i: number) => ({
  guest: "default",
  id: i,
  method: "GET",
  target: "https://api.github.com/repos/octo/hello/issues",
  status: 200,
  reason: 'host "api.github.com" matches "api.github.com"',
  rule: "allowedHosts:api.github.com",
  redirects: 0,
  ms: 1.3,
});

type Round = { name: string; run: (n: number) => void; done?: () => void };
const redactor = new GuestRedactor();
const ours = createLogger("info", (line) => void writeSync(fd, line));
const oursRedacted = createLogger("info", (line) => void writeSync(fd, line), (line) => redactor.redact(line));
const pinoSync = pino({ base: null, timestamp: pino.stdTimeFunctions.isoTime }, pino.destination({ dest: fd, sync: true }));
const asyncDest = pino.destination({ dest: "/dev/null", sync: false, minLength: 4096 });
const pinoAsync = pino({ base: null, timestamp: pino.stdTimeFunctions.isoTime }, asyncDest);

// sonic-boom opens its file asynchronously: flushSync before "ready" throws.
await new Promise((resolve) => asyncDest.once("ready", resolve));

const rounds: Round[] = [
  { name: "egressgate logger (no redaction)", run: (n) => { for (let i = 0; i < n; i++) ours.info("request", fields(i)); } },
  { name: "egressgate logger (with the proxy's redactor, no secrets)", run: (n) => { for (let i = 0; i < n; i++) oursRedacted.info("request", fields(i)); } },
  { name: `pino ${pino.version} (sync destination)`, run: (n) => { for (let i = 0; i < n; i++) pinoSync.info(fields(i), "request"); } },
  { name: `pino ${pino.version} (async sonic-boom, minLength 4096)`, run: (n) => { for (let i = 0; i < n; i++) pinoAsync.info(fields(i), "request"); }, done: () => asyncDest.flushSync() },
];

const results = new Map<string, number[]>();
for (const round of rounds) round.run(5_000); // warm-up
for (let r = 0; r < 5; r++) {
  for (const round of rounds) {
    const start = process.hrtime.bigint();
    round.run(lines);
    round.done?.();
    const ns = Number(process.hrtime.bigint() - start) / lines;
    results.set(round.name, [...(results.get(round.name) ?? []), ns]);
  }
}
console.log(`${lines} lines per round, 5 rounds, median ns per line:`);
for (const [name, values] of results) {
  const sorted = [...values].sort((a, b) => a - b);
  console.log(`  ${name}: ${sorted[2]!.toFixed(0)} ns (min ${sorted[0]!.toFixed(0)}, max ${sorted[4]!.toFixed(0)})`);
}
closeSync(fd);
