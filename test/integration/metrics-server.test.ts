import { describe, expect, it, onTestFinished } from "vitest";
import { startMetricsServer } from "../../src/metrics/metrics-server.js";
import { createLogger } from "../../src/log.js";
import { plainGet as get } from "../helpers/upstream.js";


describe("the metrics listener's thread", () => {
  it("a scrape whose head Node refuses ends that connection only; a scrape that throws answers 500; the thread keeps serving", async () => {
    const lines: string[] = [];
    let mode: "bad-type" | "throws" | "fine" = "bad-type";
    const server = await startMetricsServer({
      host: "127.0.0.1",
      port: 0,
      scrape: () => {
        if (mode === "throws") throw new Error("registry broke");
        return Promise.resolve({ text: "x 1\n", contentType: mode === "bad-type" ? "text/plain\r\nx-injected: 1" : "text/plain" });
      },
      ready: () => true,
      log: createLogger("warn", (line) => lines.push(line)),
    });
    onTestFinished(() => server.close());
    await expect(get(`${server.url}/metrics`)).rejects.toThrow();
    mode = "throws";
    expect(await get(`${server.url}/metrics`)).toEqual({ status: 500, text: "metrics scrape failed\n" });
    expect(lines.some((line) => line.includes("metrics scrape failed"))).toBe(true);
    mode = "fine";
    expect(await get(`${server.url}/metrics`)).toEqual({ status: 200, text: "x 1\n" });
    expect(await get(`${server.url}/healthz`)).toEqual({ status: 200, text: "ok\n" });
    // The thread never died: nothing was logged about restarting it.
    expect(lines.some((line) => line.includes("starting it again"))).toBe(false);
  });

  it("refuses an address it cannot listen on with the listen error's code, and close() twice ends the thread once", async () => {
    const first = await startMetricsServer({ host: "127.0.0.1", port: 0, scrape: () => Promise.resolve({ text: "", contentType: "text/plain" }), ready: () => true, log: createLogger("error", () => undefined) });
    await expect(
      startMetricsServer({ host: "127.0.0.1", port: first.port, scrape: () => Promise.resolve({ text: "", contentType: "text/plain" }), ready: () => true, log: createLogger("error", () => undefined) }),
    ).rejects.toMatchObject({ code: "EADDRINUSE" });
    await Promise.all([first.close(), first.close()]);
    await expect(get(`${first.url}/healthz`)).rejects.toThrow();
  });
});
