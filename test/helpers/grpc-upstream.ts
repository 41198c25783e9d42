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

/**
 * A grpc-js TLS server for `service` on 127.0.0.1, its certificate for api.test from a CA of its
 * own (named `caName`), shut down when the test finishes.
 */
export async function startGrpcServer<Service extends grpc.ServiceDefinition>(
  service: Service,
  implementation: grpc.UntypedServiceImplementation,
  caName: string,
): Promise<{ readonly port: number; readonly caPem: string }> {
  const { certPem, keyPem } = await createCaCertificate(caName);
  const signer = await LeafSigner.create({ cert: parseCertificate(certPem), key: await importKeyPair(keyPem) }, "ecdsa");
  const leaf = await signer.sign("api.test", 30);
  const server = new grpc.Server();
  server.addService(service, implementation);
  const credentials = grpc.ServerCredentials.createSsl(null, [{ private_key: Buffer.from(signer.leafKey.privateKeyPem), cert_chain: Buffer.from(leaf.certPem) }]);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0", credentials, (error, bound) => (error ? reject(error) : resolve(bound))));
  onTestFinished(() => {
    server.forceShutdown();
  });
  return { port, caPem: certPem };
}

/** A grpc-js TLS server for `bytesService` on 127.0.0.1 (see {@link startGrpcServer}). */
export async function startBytesServer(): Promise<GrpcUpstream> {
  let hung = 0;
  let hangCancelled = 0;
  const { port, caPem } = await startGrpcServer(
    bytesService,
    {
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
    },
    "egressgate gRPC interop CA",
  );
  return { port, caPem, hung: () => hung, hangCancelled: () => hangCancelled };
}

/**
 * grpc-js reads its proxy only from the environment (`grpc_proxy`, `https_proxy`, `http_proxy`),
 * when a channel is made: this sets `grpc_proxy` to `proxy`, as a guest's environment would have
 * it, for the channels the test makes from now on, and puts back what it was when the test finishes.
 */
export function useGrpcProxy(proxy: TestProxy): void {
  const saved = process.env["grpc_proxy"];
  process.env["grpc_proxy"] = proxy.url;
  onTestFinished(() => {
    if (saved === undefined) delete process.env["grpc_proxy"];
    else process.env["grpc_proxy"] = saved;
  });
}

/** A grpc-js client to `authority` trusting `roots` (PEM); closed when the test finishes. */
export function grpcClient(authority: string, roots: Buffer, options: grpc.ChannelOptions = {}): grpc.Client {
  const client = new grpc.Client(authority, grpc.credentials.createSsl(roots), options);
  onTestFinished(() => client.close());
  return client;
}

/**
 * A grpc-js client to api.test through `proxy` (see {@link useGrpcProxy}), trusting the proxy's
 * CA as guestEnv() makes a guest trust it (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH). Closed when the
 * test finishes.
 */
export function grpcGuestClient(proxy: TestProxy, upstream: { readonly port: number }, options: grpc.ChannelOptions = {}): grpc.Client {
  return grpcClient(`api.test:${upstream.port}`, readFileSync(proxy.guestEnv()["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"]!), options);
}

/** What a unary call needs of its method's definition: its path and how its messages are made. */
interface UnaryMethod<Request, Response> {
  readonly path: string;
  readonly requestSerialize: (value: Request) => Buffer;
  readonly responseDeserialize: (bytes: Buffer) => Response;
}

/** A unary call: its answer, response metadata and trailers, or its error. */
export function unaryCall<Request, Response>(
  client: grpc.Client,
  method: UnaryMethod<Request, Response>,
  request: Request,
  options: { metadata?: grpc.Metadata; deadline?: number } = {},
): Promise<{ value: Response; metadata: grpc.Metadata; trailers: grpc.Metadata }> {
  return new Promise((resolve, reject) => {
    let metadata = new grpc.Metadata();
    let value: Response | undefined;
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
