import { connect as netConnect, type Socket } from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";

/**
 * The fuzzer's guest connection: writes bytes as given, keeps everything that comes back, and
 * says when the socket closed. Unlike test/helpers/raw.ts it owns no test lifecycle (the fuzzer
 * also runs outside vitest): the harness destroys it.
 */
export class GuestConn {
  received = Buffer.alloc(0);
  closed = false;
  error: Error | undefined;
  private waiters: (() => void)[] = [];
  private readonly onData = (chunk: Buffer): void => {
    this.received = Buffer.concat([this.received, chunk]);
    this.wake();
  };

  constructor(readonly socket: Socket | TLSSocket) {
    socket.on("data", this.onData);
    socket.on("error", (error) => {
      this.error = error;
    });
    socket.once("close", () => {
      this.closed = true;
      this.wake();
    });
  }

  static async open(port: number): Promise<GuestConn> {
    const socket = netConnect({ host: "127.0.0.1", port });
    const conn = new GuestConn(socket);
    await new Promise<void>((resolve, reject) => {
      socket.once("connect", resolve);
      socket.once("error", reject);
    });
    return conn;
  }

  /** TLS over this connection's socket (after a CONNECT's 200): the bytes received so far stay here. */
  async startTls(servername: string, ca: string, alpn: readonly string[]): Promise<GuestConn> {
    this.socket.off("data", this.onData);
    const socket = tlsConnect({
      socket: this.socket,
      // An IP literal is no SNI (RFC 6066 §3); Node warns about one.
      ...(/^[0-9.]+$|:/.test(servername) || servername === "" ? {} : { servername }),
      ca,
      // The fuzzer judges what the proxy answers, not its certificate's names.
      checkServerIdentity: () => undefined,
      ALPNProtocols: [...alpn],
    });
    const conn = new GuestConn(socket);
    await new Promise<void>((resolve, reject) => {
      socket.once("secureConnect", resolve);
      socket.once("error", reject);
      socket.once("close", () => reject(new Error("closed during the TLS handshake")));
    });
    return conn;
  }

  write(bytes: Buffer): void {
    if (!this.socket.destroyed && this.socket.writable) this.socket.write(bytes);
  }

  /** Writes each piece in a turn of its own, so each leaves as a segment (or TLS record) of its own. */
  async writeAll(writes: readonly Buffer[]): Promise<void> {
    for (const [i, bytes] of writes.entries()) {
      if (i > 0) await new Promise((resolve) => setImmediate(resolve));
      this.write(bytes);
    }
  }

  /** Resolves true once `test` holds or the socket closed (`test` checked once more), false at `deadline` (ms since epoch). */
  async until(test: () => boolean, deadline: number): Promise<boolean> {
    for (;;) {
      if (test()) return true;
      if (this.closed) return test();
      const left = deadline - Date.now();
      if (left <= 0) return false;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Resolves whether the socket closed before `deadline`. */
  closedBy(deadline: number): Promise<boolean> {
    return this.until(() => this.closed, deadline);
  }

  end(): void {
    if (!this.socket.destroyed) this.socket.end();
  }

  destroy(): void {
    this.socket.destroy();
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}
