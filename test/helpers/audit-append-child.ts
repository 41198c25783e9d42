// Run by audit-log-file.test.ts under `ulimit -f` (RLIMIT_FSIZE): appends each line of argv[3]
// (JSON, a list of strings) to the audit log at argv[2], closes it, and prints what it counted.
import { AuditLogFile } from "../../src/metrics/audit-log.js";

const [file, lines] = process.argv.slice(2) as [string, string];
const warned: string[] = [];
const log = await AuditLogFile.open({ file, warn: (kind) => void warned.push(kind), retryMs: 60_000 });
for (const line of JSON.parse(lines) as string[]) log.append(line);
await log.close();
process.stdout.write(JSON.stringify({ dropped: log.dropped, warned }));
