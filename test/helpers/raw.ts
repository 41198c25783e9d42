import { connect as netConnect, type Socket } from "node:net";
import { checkServerIdentity, connect as tlsConnect, type ConnectionOptions, type TLSSocket } from "node:tls";
import { onTestFinished } from "vitest";

/** One HTTP/1.1 response as it came off the wire. */
export interface RawResponse {
  readonly status: number;
  /** The reason phrase of the status line. */
  readonly statusText: string;
  /** Header names lowercased; repeated headers joined with ", ". */
  readonly headers: Record<string, string>;
  readonly body: string;
}

export interface ReadOptions {
  /** The answer to a CONNECT: a 2xx has no body, whatever its headers say (RFC 9110 §9.3.6). */
  readonly forConnect?: boolean;
  /** The answer to a HEAD: no body, whatever its headers say (RFC 9110 §9.3.2). */
  readonly forHead?: boolean;
  readonly timeoutMs?: number;
}

const defaultWaitMs = 10_000;

/**
 * A client socket that speaks bytes, not HTTP: it writes exactly what the test gives it, so
 * malformed input reaches the proxy's parser unchanged, and it parses responses itself.
 * The socket is destroyed when the test finishes.
 */
export class RawClient {
  private buffer = Buffer.alloc(0);
  private wake: (() => void) | undefined;
  private closedFlag = false;
  private readonly onData = (chunk: Buffer): void => {
    this.buffer = Buffer.concat([this.buffer, chunk]);
    this.notify();
  };
  /** The last socket error (ECONNRESET after the proxy closed, say); never thrown. */
  error: Error | undefined;
  /** Settles when the socket closes, from either end. */
  readonly closed: Promise<void>;

  constructor(readonly socket: Socket | TLSSocket) {
    onTestFinished(() => {
      socket.destroy();
    });
    socket.on("data", this.onData);
    socket.on("error", (error) => {
      this.error = error;
    });
    this.closed = new Promise((resolve) => {
      socket.once("close", () => {
        this.closedFlag = true;
        this.notify();
        resolve();
      });
    });
  }

  get isClosed(): boolean {
    return this.closedFlag;
  }

  /** Everything received and not yet consumed by {@link readResponse}, as latin1. */
  pending(): string {
    return this.buffer.toString("latin1");
  }

  write(data: string | Buffer): void {
    this.socket.write(typeof data === "string" ? Buffer.from(data, "latin1") : data);
  }

  /** Waits for one complete response and consumes its bytes. */
  async readResponse(options: ReadOptions = {}): Promise<RawResponse> {
    const timeoutMs = options.timeoutMs ?? defaultWaitMs;
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const parsed = parseResponse(this.buffer, options.forConnect === true, this.closedFlag, options.forHead === true);
      if (parsed !== undefined) {
        this.buffer = this.buffer.subarray(parsed.consumed);
        return parsed.response;
      }
      if (this.closedFlag) {
        throw new Error(`connection closed before a complete response; received ${JSON.stringify(this.pending().slice(0, 500))}`);
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0 || !(await this.waitForActivity(remaining))) {
        throw new Error(`no complete response within ${timeoutMs} ms; received ${JSON.stringify(this.pending().slice(0, 500))}`);
      }
    }
  }

  /** Resolves true once the socket has closed, false if it is still open after `timeoutMs`. */
  async closesWithin(timeoutMs: number): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<false>((resolve) => {
      timer = setTimeout(() => resolve(false), timeoutMs);
    });
    const result = await Promise.race([this.closed.then(() => true as const), timedOut]);
    clearTimeout(timer);
    return result;
  }

  /** Stops reading, so the socket can be handed to `tls.connect`. */
  detach(): Socket | TLSSocket {
    this.socket.off("data", this.onData);
    return this.socket;
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  private waitForActivity(ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.wake = undefined;
        resolve(false);
      }, ms);
      this.wake = () => {
        clearTimeout(timer);
        resolve(true);
      };
    });
  }
}

/** A plain TCP connection to 127.0.0.1:`port` (the proxy), from `localAddress` (127.0.0.x) when given. */
export async function openRaw(port: number, options: { readonly localAddress?: string } = {}): Promise<RawClient> {
  const socket = netConnect({ host: "127.0.0.1", port, ...options });
  const client = new RawClient(socket);
  await new Promise<void>((resolve, reject) => {
    socket.once("connect", resolve);
    socket.once("error", reject);
  });
  return client;
}

/** Sends `CONNECT target` (from `localAddress` when given) and expects `200`; the returned client is inside the tunnel. */
export async function openTunnel(port: number, target: string, options: { readonly localAddress?: string } = {}): Promise<RawClient> {
  const client = await openRaw(port, options);
  client.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
  const res = await client.readResponse({ forConnect: true });
  if (res.status !== 200) throw new Error(`CONNECT ${target} answered ${res.status}: ${res.body}`);
  return client;
}

export interface TlsTunnelOptions {
  /** The proxy's CA, which the guest trusts. */
  readonly ca: string;
  /** SNI; defaults to the CONNECT target's host. */
  readonly servername?: string;
  /** The name the leaf certificate must carry; defaults to `servername`. */
  readonly verifyName?: string;
  /** The ALPN list offered; defaults to `http/1.1` alone. */
  readonly ALPNProtocols?: readonly string[];
}

/** CONNECT, then a TLS handshake with the proxy over the tunnel. */
export async function openTlsTunnel(port: number, target: string, options: TlsTunnelOptions): Promise<RawClient> {
  const plain = await openTunnel(port, target);
  const servername = options.servername ?? target.slice(0, target.lastIndexOf(":"));
  const verifyName = options.verifyName ?? servername;
  const tlsOptions: ConnectionOptions = {
    socket: plain.detach(),
    servername,
    ca: options.ca,
    ALPNProtocols: [...(options.ALPNProtocols ?? ["http/1.1"])],
  };
  if (verifyName !== servername) {
    tlsOptions.checkServerIdentity = (_host, cert) => checkServerIdentity(verifyName, cert);
  }
  const socket = tlsConnect(tlsOptions);
  const client = new RawClient(socket);
  await new Promise<void>((resolve, reject) => {
    socket.once("secureConnect", resolve);
    socket.once("error", reject);
  });
  return client;
}

/** Parses one response from the front of `buf`; undefined while it is incomplete. */
export function parseResponse(
  buf: Buffer,
  forConnect: boolean,
  closed: boolean,
  forHead = false,
): { response: RawResponse; consumed: number } | undefined {
  const headEnd = buf.indexOf("\r\n\r\n");
  if (headEnd < 0) return undefined;
  const lines = buf.subarray(0, headEnd).toString("latin1").split("\r\n");
  const statusLine = /^HTTP\/1\.[01] (\d{3})(?: (.*))?$/.exec(lines[0] ?? "");
  if (statusLine === null) throw new Error(`not an HTTP response: ${JSON.stringify(lines[0])}`);
  const status = Number(statusLine[1]);
  const headers: Record<string, string> = {};
  for (const line of lines.slice(1)) {
    const colon = line.indexOf(":");
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
  }
  const bodyStart = headEnd + 4;
  const done = (body: Buffer, consumed: number): { response: RawResponse; consumed: number } => ({
    response: { status, statusText: statusLine[2] ?? "", headers, body: body.toString("utf8") },
    consumed,
  });
  if ((forConnect && status >= 200 && status < 300) || forHead || status < 200 || status === 204 || status === 304) {
    return done(Buffer.alloc(0), bodyStart);
  }
  if (/\bchunked\b/i.test(headers["transfer-encoding"] ?? "")) {
    const parts: Buffer[] = [];
    let at = bodyStart;
    for (;;) {
      const lineEnd = buf.indexOf("\r\n", at);
      if (lineEnd < 0) return undefined;
      const size = Number.parseInt(buf.subarray(at, lineEnd).toString("latin1").split(";")[0]!, 16);
      if (Number.isNaN(size)) throw new Error("bad chunk size in response");
      const dataStart = lineEnd + 2;
      if (size === 0) {
        // No trailers from the proxy; the terminating CRLF follows the zero chunk.
        if (buf.length < dataStart + 2) return undefined;
        return done(Buffer.concat(parts), dataStart + 2);
      }
      if (buf.length < dataStart + size + 2) return undefined;
      parts.push(buf.subarray(dataStart, dataStart + size));
      at = dataStart + size + 2;
    }
  }
  const length = headers["content-length"];
  if (length !== undefined) {
    const end = bodyStart + Number(length);
    return buf.length < end ? undefined : done(buf.subarray(bodyStart, end), end);
  }
  return closed ? done(buf.subarray(bodyStart), buf.length) : undefined;
}
