import * as grpc from "@grpc/grpc-js";
import { readFileSync } from "node:fs";
import { onTestFinished } from "vitest";
import { createCaCertificate, importKeyPair, LeafSigner, parseCertificate } from "../../src/tls/x509.js";
import type { TestProxy } from "./proxy.js";

/** Messages are raw bytes: grpc-js frames them as it frames protobuf, which is all the proxy sees. */
const bytes = {
  requestSerialize: (value: Buffer): Buffer => value,
  requestDeserialize: (value: Buffer): Buffer => value,
  responseSerialize: (value: Buffer): Buffer => value,
  responseDeserialize: (value: Buffer): Buffer => value,
};

/** One method of each kind, and one that never answers. */
export const bytesService = {
  /** Answers its request, with the request's metadata as its response metadata and trailers. */
  echo: { path: "/egressgate.test.Bytes/Echo", requestStream: false, responseStream: false, ...bytes, originalName: "echo" },
  /** The request is a count, as ASCII digits: that many messages `m<i>`. */
  count: { path: "/egressgate.test.Bytes/Count", requestStream: false, responseStream: true, ...bytes, originalName: "count" },
  /** Answers the number of messages and bytes it was sent, as `messages/bytes`. */
  sum: { path: "/egressgate.test.Bytes/Sum", requestStream: true, responseStream: false, ...bytes, originalName: "sum" },
  /** Sends each message back as it comes. */
  bidi: { path: "/egressgate.test.Bytes/Bidi", requestStream: true, responseStream: true, ...bytes, originalName: "bidi" },
  /** Never answers; its calls end only by the client's deadline or cancel. */
  hang: { path: "/egressgate.test.Bytes/Hang", requestStream: false, responseStream: false, ...bytes, originalName: "hang" },
} satisfies grpc.ServiceDefinition;

export interface GrpcUpstream {
  readonly port: number;
  readonly caPem: string;
  /** Calls to `hang` that arrived. */
  readonly hung: () => number;
  /** Calls to `hang` whose cancellation (the client's deadline or cancel) reached the server. */
  readonly hangCancelled: () => number;
}

/** A grpc-js TLS server for `bytesService` on 127.0.0.1, its certificate for api.test from a CA of its own. */
export async function startBytesServer(): Promise<GrpcUpstream> {
  const { certPem, keyPem } = await createCaCertificate("egressgate gRPC interop CA");
  const signer = await LeafSigner.create({ cert: parseCertificate(certPem), key: await importKeyPair(keyPem) }, "ecdsa");
  const leaf = await signer.sign("api.test", 30);
  let hung = 0;
  let hangCancelled = 0;
  const server = new grpc.Server();
  server.addService(bytesService, {
    echo: (call: grpc.ServerUnaryCall<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
      call.sendMetadata(call.metadata.clone());
      callback(null, call.request, call.metadata.clone());
    },
    count: (call: grpc.ServerWritableStream<Buffer, Buffer>) => {
      const total = Number(call.request.toString("ascii"));
      for (let i = 0; i < total; i++) call.write(Buffer.from(`m${i}`));
      call.end();
    },
    sum: (call: grpc.ServerReadableStream<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
      let messages = 0;
      let total = 0;
      call.on("data", (message: Buffer) => {
        messages += 1;
        total += message.length;
      });
      call.on("end", () => callback(null, Buffer.from(`${messages}/${total}`)));
    },
    bidi: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => {
      call.on("data", (message: Buffer) => call.write(message));
      call.on("end", () => call.end());
    },
    hang: (call: grpc.ServerUnaryCall<Buffer, Buffer>) => {
      hung += 1;
      call.on("cancelled", () => (hangCancelled += 1));
    },
  });
  const credentials = grpc.ServerCredentials.createSsl(null, [{ private_key: Buffer.from(signer.leafKey.privateKeyPem), cert_chain: Buffer.from(leaf.certPem) }]);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0", credentials, (error, bound) => (error ? reject(error) : resolve(bound))));
  onTestFinished(() => {
    server.forceShutdown();
  });
  return { port, caPem: certPem, hung: () => hung, hangCancelled: () => hangCancelled };
}

/**
 * A grpc-js client to api.test through `proxy`, trusting the proxy's CA as guestEnv() makes a
 * guest trust it. grpc-js reads its proxy from `grpc_proxy` when the channel is made: the caller
 * sets it (and restores it) around the test. Closed when the test finishes.
 */
export function bytesClient(proxy: TestProxy, upstream: GrpcUpstream, options: grpc.ChannelOptions = {}): grpc.Client {
  const roots = readFileSync(proxy.guestEnv()["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"]!);
  const client = new grpc.Client(`api.test:${upstream.port}`, grpc.credentials.createSsl(roots), options);
  onTestFinished(() => client.close());
  return client;
}

/** A unary call: its answer, response metadata and trailers, or its error. */
export function unaryCall(
  client: grpc.Client,
  method: typeof bytesService.echo | typeof bytesService.hang,
  request: Buffer,
  options: { metadata?: grpc.Metadata; deadline?: number } = {},
): Promise<{ value: Buffer; metadata: grpc.Metadata; trailers: grpc.Metadata }> {
  return new Promise((resolve, reject) => {
    let metadata = new grpc.Metadata();
    let value: Buffer | undefined;
    let failed = false;
    const call = client.makeUnaryRequest(method.path, method.requestSerialize, method.responseDeserialize, request, options.metadata ?? new grpc.Metadata(), options.deadline === undefined ? {} : { deadline: options.deadline }, (error, answer) => {
      if (error) {
        failed = true;
        reject(error);
      } else value = answer;
    });
    call.on("metadata", (m: grpc.Metadata) => (metadata = m));
    call.on("status", (status: grpc.StatusObject) => {
      if (!failed) resolve({ value: value!, metadata, trailers: status.metadata });
    });
  });
}
