import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { bundlePrelude, preludeFile } from "../../src/djs/build-prelude.js";
import { callPhase, loadPolicy } from "../helpers/djs.js";

describe("the sandbox's prelude is built from its modules", () => {
  it("prelude.js is the bundle of src/djs/sandbox/prelude/ as it is now (npm run build:prelude rewrites it)", async () => {
    expect(readFileSync(preludeFile, "utf8")).toBe(await bundlePrelude());
  });

  it("every module of the prelude is type-checked", () => {
    const dir = path.join(path.dirname(preludeFile), "prelude");
    const modules = readdirSync(dir).filter((file) => file.endsWith(".js"));
    expect(modules.length).toBeGreaterThan(5);
    for (const file of modules) expect(readFileSync(path.join(dir, file), "utf8"), file).toMatch(/^\/\/ @ts-check\n/);
  });

  it("the sandbox's classes keep their own names through the bundle", async () => {
    const policy = loadPolicy(`
      export function onRequest(request) {
        const names = [Headers, URL, URLSearchParams, Request, Response, TextEncoder, TextDecoder, DOMException, HttpRequestBlockedError, atob, btoa]
          .map((f) => f.name)
          .concat(request.constructor.name, Object.getPrototypeOf(Request).name, new Headers().constructor.name);
        return new Response(names.join(","));
      }`);
    const outcome = await callPhase(policy, "onRequest");
    expect(outcome.t).toBe("response");
    expect(Buffer.from(outcome.bytes!).toString("utf8")).toBe(
      "Headers,URL,URLSearchParams,Request,Response,TextEncoder,TextDecoder,DOMException,HttpRequestBlockedError,atob,btoa,Request,BodyMixin,Headers",
    );
  });
});
