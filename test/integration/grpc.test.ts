import * as grpc from "@grpc/grpc-js";
import { readFileSync } from "node:fs";
import { createServer as createNetServer, type AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { echoService } from "../fixtures/grpc/echo-service.js";
import { cleanEnv, runClient } from "../helpers/clients.js";
import { grpcClient, grpcGuestClient, startGrpcServer, unaryCall, useGrpcProxy } from "../helpers/grpc-upstream.js";
import { startTestProxy, type TestProxy } from "../helpers/proxy.js";
import type { HttpHooksOptions } from "../../src/index.js";

const guestClient = fileURLToPath(new URL("../fixtures/grpc/guest-client.mjs", import.meta.url));

interface EchoUpstream {
  readonly port: number;
  readonly caPem: string;
  readonly calls: () => number;
}

/** A grpc-js TLS server for `echoService` on 127.0.0.1, its certificate for api.test from a CA of its own. */
async function startEchoServer(): Promise<EchoUpstream> {
  let calls = 0;
  const { port, caPem } = await startGrpcServer(
    echoService,
    {
      unary: (call: grpc.ServerUnaryCall<string, string>, callback: grpc.sendUnaryData<string>) => {
        calls += 1;
        const head = new grpc.Metadata();
        head.set("x-served-by", "grpc-test");
        call.sendMetadata(head);
        const trailer = new grpc.Metadata();
        trailer.set("x-checksum", "sum-1");
        callback(null, `echo: ${call.request}`, trailer);
      },
      countdown: (call: grpc.ServerWritableStream<string, string>) => {
        calls += 1;
        const from = Number(call.request);
        for (let i = from; i > 0; i--) call.write(`t-${i}`);
        call.end();
      },
      fail: (_call: grpc.ServerUnaryCall<string, string>, callback: grpc.sendUnaryData<string>) => {
        calls += 1;
        callback({ code: grpc.status.NOT_FOUND, details: "no such thing" });
      },
    },
    "egressgate gRPC test CA",
  );
  return { port, caPem, calls: () => calls };
}

async function setup(hooks: HttpHooksOptions = {}, options: { refuseInTunnel?: boolean } = {}): Promise<{ proxy: TestProxy; upstream: EchoUpstream; client: grpc.Client }> {
  const upstream = await startEchoServer();
  const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], ...hooks }, { upstreamCa: [upstream.caPem], ...options });
  useGrpcProxy(proxy);
  return { proxy, upstream, client: grpcGuestClient(proxy, upstream) };
}

/** A loopback port nothing listens on: one a server had, closed again. */
async function closedPort(): Promise<number> {
  const server = createNetServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** A unary call of `echoService` (see {@link unaryCall}). */
function unary(client: grpc.Client, method: keyof typeof echoService, request: string): Promise<{ value: string; metadata: grpc.Metadata; trailers: grpc.Metadata }> {
  return unaryCall(client, echoService[method], request);
}

describe("gRPC through the proxy", () => {
  it("a unary call succeeds, with its response metadata", async () => {
    const { client, upstream, proxy } = await setup();
    const answer = await unary(client, "unary", "hello");
    expect(answer.value).toBe("echo: hello");
    expect(answer.metadata.get("x-served-by")).toEqual(["grpc-test"]);
    // Trailing metadata travels in the HTTP/2 trailers, with grpc-status.
    expect(answer.trailers.get("x-checksum")).toEqual(["sum-1"]);
    expect(upstream.calls()).toBe(1);
    expect(proxy.logs.some((line) => line["msg"] === "request" && line["http"] === "2" && line["status"] === 200)).toBe(true);
  });

  it("a grpc-js guest configured only by guestEnv() (its proxy and GRPC_DEFAULT_SSL_ROOTS_FILE_PATH) calls through the proxy", async () => {
    const upstream = await startEchoServer();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstreamCa: [upstream.caPem] });
    const env = proxy.guestEnv();
    expect(readFileSync(env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"]!, "utf8")).toContain(proxy.caCertPem.trim());
    // A process of its own with exactly the guest's environment: grpc-js reads both variables when it loads.
    const run = await runClient(process.execPath, [guestClient, `api.test:${upstream.port}`, "from a guest"], cleanEnv(env));
    expect(JSON.parse(run.stdout.trim()), run.stderr).toEqual({ value: "echo: from a guest" });
    expect(upstream.calls()).toBe(1);
    // grpc-js with neither GRPC_DEFAULT_SSL_ROOTS_FILE_PATH nor NODE_EXTRA_CA_CERTS (it falls back
    // to Node's default roots, which take NODE_EXTRA_CA_CERTS in) does not trust the proxy: the call fails.
    const without = (names: readonly string[]): Record<string, string> => Object.fromEntries(Object.entries(env).filter(([name]) => !names.includes(name)));
    const onlyNode = await runClient(process.execPath, [guestClient, `api.test:${upstream.port}`, "node roots"], cleanEnv(without(["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"])));
    expect(JSON.parse(onlyNode.stdout.trim()), onlyNode.stderr).toEqual({ value: "echo: node roots" });
    const refused = await runClient(process.execPath, [guestClient, `api.test:${upstream.port}`, "again"], cleanEnv(without(["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", "NODE_EXTRA_CA_CERTS"])));
    expect((JSON.parse(refused.stdout.trim()) as { code: number }).code, refused.stderr).toBe(grpc.status.UNAVAILABLE);
    expect(upstream.calls()).toBe(2);
  });

  it("a server-streaming call delivers every message, then grpc-status OK", async () => {
    const { client } = await setup();
    const definition = echoService.countdown;
    const messages: string[] = [];
    const status = await new Promise<grpc.StatusObject>((resolve, reject) => {
      const call = client.makeServerStreamRequest(definition.path, definition.requestSerialize, definition.responseDeserialize, "5");
      call.on("data", (message: string) => messages.push(message));
      call.on("status", resolve);
      call.on("error", (error: grpc.ServiceError) => (error.code === grpc.status.OK ? undefined : reject(error)));
    });
    expect(messages).toEqual(["t-5", "t-4", "t-3", "t-2", "t-1"]);
    expect(status.code).toBe(grpc.status.OK);
  });

  it("the server's own error (a Trailers-Only answer) reaches the client with its status and message", async () => {
    const { client } = await setup();
    const error = (await unary(client, "fail", "x").catch((e: unknown) => e)) as grpc.ServiceError;
    expect(error.code).toBe(grpc.status.NOT_FOUND);
    expect(error.details).toBe("no such thing");
  });

  it("a call the policy refuses fails with PERMISSION_DENIED naming the reason, and never reaches the server", async () => {
    const { client, upstream } = await setup({ isRequestAllowed: (request) => !new URL(request.url).pathname.endsWith("/Fail") });
    const error = (await unary(client, "fail", "x").catch((e: unknown) => e)) as grpc.ServiceError;
    expect(error.code).toBe(grpc.status.PERMISSION_DENIED);
    expect(error.details).toContain("403 Forbidden");
    expect(upstream.calls()).toBe(0);
    // The same channel still works for calls the policy allows.
    expect((await unary(client, "unary", "after")).value).toBe("echo: after");
  });

  // Issue 20: a proxy's 5xx reaches a gRPC caller as UNAVAILABLE (14), with the reason in
  // grpc-message; until now only grpcStatusFor() itself was tested for it.
  it("a call the proxy answers 502 (a hook that throws, an upstream that refuses connections) fails UNAVAILABLE naming the reason, and the channel serves on", async () => {
    const { client, upstream, proxy } = await setup({
      onRequest: (request) => {
        if (new URL(request.url).pathname.endsWith("/Fail")) throw new Error("hook bug 42");
      },
    });
    const hooked = (await unary(client, "fail", "x").catch((e: unknown) => e)) as grpc.ServiceError;
    expect(hooked.code).toBe(grpc.status.UNAVAILABLE);
    expect(hooked.details).toMatch(/^502 Bad Gateway: /);
    // The hook's own message stays in the proxy's log, as on every other answer.
    expect(hooked.details).toContain("onRequest hook failed");
    expect(upstream.calls()).toBe(0);
    expect((await unary(client, "unary", "after")).value).toBe("echo: after");
    // A port nothing listens on: the tunnel opens (the proxy terminates TLS itself), the upstream connect fails.
    const gone = await closedPort();
    const refused = (await unary(grpcGuestClient(proxy, { port: gone }), "unary", "x").catch((e: unknown) => e)) as grpc.ServiceError;
    expect(refused.code).toBe(grpc.status.UNAVAILABLE);
    expect(refused.details).toMatch(/^502 Bad Gateway: /);
    expect(refused.details).toContain(`api.test:${gone}`);
    expect(proxy.logs.some((line) => line["method"] === "POST" && line["status"] === 502 && line["http"] === "2")).toBe(true);
  });

  // Audit of issue 20: the refusals made on the head alone (431) were plain HTTP to gRPC callers,
  // which grpc-js reports as UNKNOWN "Received HTTP status code 431", the reason lost.
  it("a call whose metadata has more fields than the proxy takes fails RESOURCE_EXHAUSTED naming the limit, never reaching the server", async () => {
    const { client, upstream, proxy } = await setup();
    const metadata = new grpc.Metadata();
    for (let i = 0; i < 300; i++) metadata.set(`x-field-${i}`, "v");
    const error = (await unaryCall(client, echoService.unary, "x", { metadata }).catch((e: unknown) => e)) as grpc.ServiceError;
    expect(error.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(error.details).toBe("431 Request Header Fields Too Large: request head has more than 256 header fields");
    expect(upstream.calls()).toBe(0);
    expect(proxy.logs.some((line) => line["status"] === 431 && line["http"] === "2")).toBe(true);
    expect((await unary(client, "unary", "after")).value).toBe("echo: after");
  });

  /** A call to other.test, off the allowlist: PERMISSION_DENIED naming the reason, and nothing reached the server. */
  async function expectOffListDenied(upstream: { readonly port: number; calls(): number }, proxy: { readonly caCertPem: string }): Promise<void> {
    const offList = grpcClient(`other.test:${upstream.port}`, Buffer.from(proxy.caCertPem));
    const error = (await unary(offList, "unary", "x").catch((e: unknown) => e)) as grpc.ServiceError;
    expect(error.code).toBe(grpc.status.PERMISSION_DENIED);
    expect(error.details).toContain('"other.test" is not in allowedHosts');
    expect(upstream.calls()).toBe(0);
  }

  it("a call to a host off the allowlist fails without reaching the server: PERMISSION_DENIED with the reason once inside a tunnel", async () => {
    // An onRequest hook keeps the CONNECT open (it could rewrite the request), so the refusal comes on the gRPC stream itself.
    const { upstream, proxy } = await setup({ allowedInternalHosts: ["api.test"], onRequest: () => undefined });
    await expectOffListDenied(upstream, proxy);
  });

  it("with refuseInTunnel and no hooks, a call to a host off the allowlist fails PERMISSION_DENIED with the reason, never reaching the server", async () => {
    const { upstream, proxy, client } = await setup({}, { refuseInTunnel: true });
    await expectOffListDenied(upstream, proxy);
    // The tunnel opened, and the refusal is the stream's own decision line, over HTTP/2.
    expect(proxy.logs.some((line) => line["msg"] === "tunnel opened" && line["target"] === `other.test:${upstream.port}`)).toBe(true);
    expect(proxy.logs.some((line) => line["method"] === "POST" && line["status"] === 403 && String(line["reason"]).includes('"other.test" is not in allowedHosts'))).toBe(true);
    // An allowed host on the same proxy is served as before.
    expect((await unary(client, "unary", "still")).value).toBe("echo: still");
  });

  it("a call to a host off the allowlist refused at CONNECT fails with UNAVAILABLE, never reaches the server, and grpc-js logs the host and the 403", async () => {
    const { upstream, proxy } = await setup();
    // grpc-js reports a refused CONNECT through its logger only (status code, no reason phrase):
    // the call's own error carries no trace of it. Captured here, as a guest's stderr would show it.
    const logged: string[] = [];
    const capture = (...args: unknown[]): void => void logged.push(args.map(String).join(" "));
    grpc.setLogger({ error: capture, info: capture, debug: capture });
    onTestFinished(() => grpc.setLogger(console));
    const offList = grpcClient(`other.test:${upstream.port}`, Buffer.from(proxy.caCertPem));
    const error = (await unary(offList, "unary", "x").catch((e: unknown) => e)) as grpc.ServiceError;
    expect(error.code).toBe(grpc.status.UNAVAILABLE);
    expect(error.details).toContain("No connection established");
    expect(logged.some((line) => line.includes(`Failed to connect to other.test:${upstream.port} through proxy`) && line.includes("with status 403"))).toBe(true);
    expect(upstream.calls()).toBe(0);
    // The proxy's decision line names the reason (the CONNECT status line's is tested in policy.test.ts).
    expect(proxy.logs.some((line) => line["method"] === "CONNECT" && line["status"] === 403 && String(line["reason"]).includes('host "other.test" is not in allowedHosts'))).toBe(true);
  });
});
