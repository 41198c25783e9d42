import { EventEmitter } from "node:events";
import type { ClientHttp2Session } from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EgressError } from "../../src/errors.js";
import { H2Refused, sendOnSession, type H2ExchangeOptions } from "../../src/upstream/h2-exchange.js";
import { startH2cPathServer, type H2cPathServer } from "../helpers/h2c-server.js";

// A cleartext h2 server on loopback; the session is one the pool would share between guests.
let server: H2cPathServer;
beforeAll(async () => void (server = await startH2cPathServer()));
afterAll(() => server.close());

async function session(): Promise<ClientHttp2Session> {
  const made = server.session();
  await new Promise<void>((resolve) => made.once("connect", () => resolve()));
  return made;
}

function options(): H2ExchangeOptions & { readonly released: () => number } {
  let released = 0;
  return {
    headersTimeoutMs: 5_000,
    bodyTimeoutMs: 5_000,
    maxInformational: 10,
    signal: Object.assign(new EventEmitter(), { aborted: false }),
    done: () => void (released += 1),
    released: () => released,
  };
}

async function text(response: Awaited<ReturnType<typeof sendOnSession>>): Promise<string> {
  let out = "";
  for await (const chunk of response.body!) out += String(chunk);
  return out;
}

const request = (path: string, headers: string[]) => ({ method: "GET", url: new URL(`https://api.test${path}`), headers, body: null });

/** As the pool calls it, from an async function: a throw is a rejection. */
async function send(shared: ClientHttp2Session, path: string, headers: string[], opts = options()): Promise<Awaited<ReturnType<typeof sendOnSession>>> {
  return sendOnSession(shared, request(path, headers), false, opts);
}

describe("sendOnSession on a shared upstream session", () => {
  it("refuses a header name HTTP/2 cannot carry with 502, not retried, and the session keeps serving", async () => {
    const shared = await session();
    for (const name of ["bad name", "bad\u00e9", "x-ok\r\nx-evil"]) {
      const opts = options();
      const failure = await send(shared, "/bad", [name, "v"], opts).catch((error: unknown) => error);
      expect(failure, name).toBeInstanceOf(EgressError);
      expect(failure).not.toBeInstanceOf(H2Refused);
      expect((failure as EgressError).status).toBe(502);
      expect(opts.released(), "the session's slot is given back").toBe(1);
      expect(shared.destroyed, name).toBe(false);
    }
    expect(server.seen).not.toContain("/bad");
    const good = await send(shared, "/good", ["x-ok", "v"]);
    expect(good.status).toBe(200);
    expect(await text(good)).toBe("path /good");
  });

  it("a header value with CR, LF or NUL is a 502 for that request (Node's client would send it), and the session goes on", async () => {
    const shared = await session();
    for (const value of ["a\r\nx-evil: 1", "a\nb", "a\u0000b"]) {
      const failure = await send(shared, "/bad", ["x-value", value]).catch((error: unknown) => error);
      expect(failure, JSON.stringify(value)).toBeInstanceOf(EgressError);
      expect(failure).not.toBeInstanceOf(H2Refused);
      expect((failure as EgressError).status).toBe(502);
    }
    // Refused before anything was sent.
    expect(server.seen).not.toContain("/bad");
    const good = await send(shared, "/after", ["x-value", "fine"]);
    expect(await text(good)).toBe("path /after");
    expect(shared.destroyed).toBe(false);
  });

  it("a session that is closing is a refusal another session may take", async () => {
    const closing = await session();
    closing.close();
    const failure = await send(closing, "/late", []).catch((error: unknown) => error);
    expect(failure).toBeInstanceOf(H2Refused);
  });
});
