/**
 * Just enough of a TLS ClientHello (RFC 8446 §4.1.2, RFC 6066 §3) to read its SNI before any
 * TLS work: the proxy compares the name with the CONNECT target and signs nothing for a name the
 * tunnel may not serve.
 */

export type ClientHello =
  | { readonly kind: "more" }
  | { readonly kind: "invalid"; readonly reason: string }
  /** `servername` is undefined when the client sent no SNI (as for an IP address). */
  | { readonly kind: "hello"; readonly servername: string | undefined };

const recordHandshake = 0x16;
const handshakeClientHello = 0x01;
const extensionServerName = 0x0000;
const nameTypeHostName = 0x00;
/** A ClientHello with post-quantum key shares is under 2 KiB; 64 KiB is generous and bounded. */
export const maxClientHelloBytes = 64 * 1024;
/**
 * Real clients send a ClientHello in one record, or a few when it passes 16 KiB. A hello cut
 * into many tiny records only costs the proxy work (and each record a parse step), so past
 * these it is refused.
 */
export const maxHelloRecords = 16;
export const minHelloFragmentBytes = 64;

const more: ClientHello = { kind: "more" };

/**
 * Reads a ClientHello as it arrives, chunk by chunk, possibly fragmented over several handshake
 * records. Each byte is looked at a bounded number of times however the guest cuts its writes:
 * the chunks are kept in an array (no re-concatenation per chunk) and records are parsed once,
 * as they complete.
 */
export class ClientHelloReader {
  private readonly chunks: Buffer[] = [];
  private readonly header = Buffer.alloc(5);
  private headerBytes = 0;
  /** What the current record's body still needs; -1 while its header is read. */
  private bodyLeft = -1;
  private recordParts: Buffer[] = [];
  private readonly fragments: Buffer[] = [];
  private gathered = 0;
  private needed = -1;
  private records = 0;
  private result: ClientHello = more;
  /** Bytes handled so far, copies included: tests check it stays proportional to the input. */
  work = 0;

  /** Adds the next chunk; "more" until the hello is complete. Once settled, the same answer. */
  push(chunk: Buffer): ClientHello {
    if (this.result.kind !== "more") return this.result;
    this.chunks.push(chunk);
    this.result = this.consume(chunk);
    return this.result;
  }

  /** Every byte received, in order: what the TLS socket reads again. */
  bytes(): Buffer {
    return this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks);
  }

  /** The first chunk, whose record header an alert repeats. */
  get first(): Buffer {
    return this.chunks[0] ?? Buffer.alloc(0);
  }

  private consume(chunk: Buffer): ClientHello {
    for (let at = 0; at < chunk.length; ) {
      if (this.bodyLeft < 0) {
        const take = Math.min(5 - this.headerBytes, chunk.length - at);
        chunk.copy(this.header, this.headerBytes, at, at + take);
        this.headerBytes += take;
        at += take;
        this.work += take;
        if (this.headerBytes < 5) return more;
        this.headerBytes = 0;
        if (this.header[0] !== recordHandshake) return { kind: "invalid", reason: "expected a TLS handshake record" };
        if (this.header[1] !== 0x03) return { kind: "invalid", reason: "unknown TLS record version" };
        const length = this.header.readUInt16BE(3);
        if (length === 0 || length > 16_384 + 2_048) return { kind: "invalid", reason: "bad TLS record length" };
        if (++this.records > maxHelloRecords) return { kind: "invalid", reason: `ClientHello spread over more than ${maxHelloRecords} records` };
        this.bodyLeft = length;
      }
      const take = Math.min(this.bodyLeft, chunk.length - at);
      this.recordParts.push(chunk.subarray(at, at + take));
      this.bodyLeft -= take;
      at += take;
      this.work += take;
      if (this.bodyLeft > 0) return more;
      this.bodyLeft = -1;
      const fragment = this.recordParts.length === 1 ? this.recordParts[0]! : Buffer.concat(this.recordParts);
      this.recordParts = [];
      this.work += fragment.length;
      const result = this.addFragment(fragment);
      if (result.kind !== "more") return result;
      if (fragment.length < minHelloFragmentBytes) {
        return { kind: "invalid", reason: `ClientHello fragmented into records of under ${minHelloFragmentBytes} bytes` };
      }
    }
    return more;
  }

  private addFragment(fragment: Buffer): ClientHello {
    this.fragments.push(fragment);
    this.gathered += fragment.length;
    if (this.needed < 0 && this.gathered >= 4) {
      const head = Buffer.concat(this.fragments).subarray(0, 4);
      this.work += 4;
      if (head[0] !== handshakeClientHello) return { kind: "invalid", reason: "the first handshake message is not a ClientHello" };
      this.needed = 4 + head.readUIntBE(1, 3);
      if (this.needed > maxClientHelloBytes) return { kind: "invalid", reason: "ClientHello too large" };
    }
    if (this.needed < 0 || this.gathered < this.needed) return more;
    this.work += this.gathered;
    return parseHello(Buffer.concat(this.fragments).subarray(4, this.needed));
  }
}

/**
 * Reads the ClientHello at the start of `bytes`: "more" until it is complete, "invalid" for
 * anything that is not one. See {@link ClientHelloReader} for bytes that arrive in pieces.
 */
export function readClientHello(bytes: Buffer): ClientHello {
  return new ClientHelloReader().push(bytes);
}

function parseHello(body: Buffer): ClientHello {
  const invalid: ClientHello = { kind: "invalid", reason: "malformed ClientHello" };
  // legacy_version (2), random (32)
  let at = 34;
  const skip = (lengthBytes: number): boolean => {
    if (body.length < at + lengthBytes) return false;
    const length = body.readUIntBE(at, lengthBytes);
    at += lengthBytes + length;
    return body.length >= at;
  };
  // legacy_session_id, cipher_suites, legacy_compression_methods
  if (!skip(1) || !skip(2) || !skip(1)) return invalid;
  if (at === body.length) return { kind: "hello", servername: undefined };
  if (body.length < at + 2) return invalid;
  const end = at + 2 + body.readUInt16BE(at);
  if (end !== body.length) return invalid;
  for (at += 2; at < end; ) {
    if (end < at + 4) return invalid;
    const type = body.readUInt16BE(at);
    const length = body.readUInt16BE(at + 2);
    const data = body.subarray(at + 4, at + 4 + length);
    if (data.length !== length) return invalid;
    at += 4 + length;
    if (type !== extensionServerName) continue;
    // ServerNameList: a list of (name_type, HostName) entries; the first host_name counts.
    if (data.length < 2 || data.readUInt16BE(0) !== data.length - 2) return invalid;
    for (let i = 2; i + 3 <= data.length; ) {
      const nameType = data[i]!;
      const nameLength = data.readUInt16BE(i + 1);
      const name = data.subarray(i + 3, i + 3 + nameLength);
      if (name.length !== nameLength) return invalid;
      if (nameType === nameTypeHostName) return { kind: "hello", servername: name.toString("latin1") };
      i += 3 + nameLength;
    }
    return invalid;
  }
  return { kind: "hello", servername: undefined };
}

/** TLS alert descriptions (RFC 8446 §6). */
export const alerts = { handshakeFailure: 40, decodeError: 50, internalError: 80, unrecognizedName: 112 } as const;

/**
 * A fatal alert record, sent in the clear before any ServerHello. Its record version repeats
 * the ClientHello's (0x0301 or 0x0303), which every client accepts there.
 */
export function alertRecord(description: number, clientHello: Buffer): Buffer {
  const minor = clientHello[2] !== undefined && clientHello[2] >= 1 && clientHello[2] <= 3 ? clientHello[2] : 1;
  return Buffer.from([0x15, 0x03, minor, 0x00, 0x02, 0x02, description]);
}
