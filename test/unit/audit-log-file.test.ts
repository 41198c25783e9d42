import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { AuditLogFile } from "../../src/metrics/audit-log.js";
import { createAuditSink } from "../../src/metrics/audit-sink.js";
import { buildAuditRecord, type AuditRecord } from "../../src/metrics/audit-record.js";
import { tempDir } from "../helpers/proxy.js";

function warnings(): { list: Array<{ kind: string; msg: string; fields?: Record<string, unknown> }>; warn: (kind: string, msg: string, fields?: Record<string, unknown>) => void } {
  const list: Array<{ kind: string; msg: string; fields?: Record<string, unknown> }> = [];
  return { list, warn: (kind, msg, fields) => void list.push({ kind, msg, ...(fields !== undefined ? { fields } : {}) }) };
}

describe("AuditLogFile", () => {
  it("bounds what waits for the disk: past maxQueuedBytes records are dropped and counted, never queued", async () => {
    const file = join(tempDir(), "audit.jsonl");
    const warned = warnings();
    const log = await AuditLogFile.open({ file, warn: warned.warn, maxQueuedBytes: 1_000 });
    const line = `${"x".repeat(99)}\n`;
    // One turn: no write can complete in between, so the queue only grows.
    for (let i = 0; i < 100; i++) log.append(line);
    expect(log.dropped).toBe(90);
    await log.close();
    expect(readFileSync(file, "utf8")).toBe(line.repeat(10));
    expect(warned.list.map((w) => w.kind)).toContain("audit:queue");
    expect(warned.list.find((w) => w.kind === "audit:dropped")?.fields).toMatchObject({ dropped: 90 });
  });

  it("refuses to open what cannot be appended to", async () => {
    await expect(AuditLogFile.open({ file: tempDir(), warn: () => undefined })).rejects.toMatchObject({ code: "EISDIR" });
  });

  it("counts the records of a failed write, warns with the error code, and drops records until retryMs has passed", async () => {
    const warned = warnings();
    const log = await AuditLogFile.open({ file: "/dev/full", warn: warned.warn, retryMs: 60_000 });
    log.append("one\n");
    log.append("two\n");
    await new Promise<void>((resolve) => {
      const check = (): void => (warned.list.some((w) => w.kind === "audit:error") ? resolve() : void setImmediate(check));
      check();
    });
    expect(warned.list.find((w) => w.kind === "audit:error")?.fields).toMatchObject({ error: "ENOSPC" });
    log.append("three\n");
    await log.close();
    expect(log.dropped).toBe(3);
  });
});

describe("the audit sink", () => {
  const record = (): AuditRecord => buildAuditRecord({ started: performance.now(), guest: "default", method: "GET", target: "https://a.test/", status: 200, reason: "ok" }, undefined, (t) => t);

  it("writes the line before onDecision can change the record, and survives a throw and a rejection", async () => {
    const file = join(tempDir(), "audit.jsonl");
    const warned = warnings();
    const log = await AuditLogFile.open({ file, warn: warned.warn });
    let calls = 0;
    const sink = createAuditSink(log, (r) => {
      calls += 1;
      (r as { status: number }).status = 999;
      if (calls === 1) throw new Error("sync");
      return Promise.reject(new Error("async"));
    }, warned.warn);
    sink(record());
    sink(record());
    await new Promise((resolve) => setImmediate(resolve));
    await log.close();
    expect(readFileSync(file, "utf8").trim().split("\n").map((l) => (JSON.parse(l) as AuditRecord).status)).toEqual([200, 200]);
    expect(warned.list.filter((w) => w.kind === "audit:onDecision").map((w) => w.fields?.["error"])).toEqual(["Error: sync", "Error: async"]);
  });

  it("redacts the URL, the reasons and every source's reason", () => {
    const redact = (text: string): string => text.replaceAll("hunter2", "[REDACTED:PW]");
    const built = buildAuditRecord(
      { started: performance.now(), guest: undefined, method: "GET", target: "https://a.test/hunter2", status: 403, reason: "no hunter2", source: "hooks", detail: "hunter2" },
      { trace: [{ source: "hooks", tier: "tier3", phase: "onRequest", decision: "block", reason: "saw hunter2", detail: "hunter2", status: 403, ms: 0.1 }], rule: { tier: "tier3", rule: "x", reason: "hunter2" } },
      redact,
    );
    expect(JSON.stringify(built)).not.toContain("hunter2");
    expect(built).toMatchObject({ guest: null, url: "https://a.test/[REDACTED:PW]", sources: [{ reason: "saw [REDACTED:PW]" }] });
  });
});
