import { connect, createServer, type ClientHttp2Session } from "node:http2";
import type { AddressInfo } from "node:net";
import { onTestFinished } from "vitest";

export interface H2cPathServer {
  readonly origin: string;
  /** The paths the server was asked for, in order. */
  readonly seen: readonly string[];
  /** A client session to it (still connecting when returned), destroyed when the test ends. */
  session(): ClientHttp2Session;
  close(): Promise<void>;
}

/** A cleartext HTTP/2 server on loopback that answers every stream 200 with `path <its :path>`. */
export async function startH2cPathServer(): Promise<H2cPathServer> {
  const seen: string[] = [];
  const server = createServer();
  server.on("stream", (stream, headers) => {
    seen.push(String(headers[":path"]));
    stream.on("error", () => undefined);
    stream.respond({ ":status": 200 });
    stream.end(`path ${String(headers[":path"])}`);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    origin,
    seen,
    session() {
      const made = connect(origin);
      made.on("error", () => undefined);
      onTestFinished(() => void made.destroy());
      return made;
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
