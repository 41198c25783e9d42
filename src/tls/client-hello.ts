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
 * Reads the ClientHello at the start of `bytes`, which may arrive in pieces and may span several
 * handshake records. "more" until it is complete; "invalid" for anything that is not one.
 */
export function readClientHello(bytes: Buffer): ClientHello {
  // Handshake messages may be fragmented over records: gather the fragments first.
  const fragments: Buffer[] = [];
  let gathered = 0;
  let needed = -1;
  for (let at = 0; ; ) {
    if (bytes.length < at + 5) return { kind: "more" };
    if (bytes[at] !== recordHandshake) return { kind: "invalid", reason: "expected a TLS handshake record" };
    if (bytes[at + 1] !== 0x03) return { kind: "invalid", reason: "unknown TLS record version" };
    const length = bytes.readUInt16BE(at + 3);
    if (length === 0 || length > 16_384 + 2_048) return { kind: "invalid", reason: "bad TLS record length" };
    if (bytes.length < at + 5 + length) return { kind: "more" };
    fragments.push(bytes.subarray(at + 5, at + 5 + length));
    gathered += length;
    at += 5 + length;
    if (needed < 0 && gathered >= 4) {
      const head = Buffer.concat(fragments).subarray(0, 4);
      if (head[0] !== handshakeClientHello) return { kind: "invalid", reason: "the first handshake message is not a ClientHello" };
      needed = 4 + head.readUIntBE(1, 3);
      if (needed > maxClientHelloBytes) return { kind: "invalid", reason: "ClientHello too large" };
    }
    if (needed >= 0 && gathered >= needed) return parseHello(Buffer.concat(fragments).subarray(4, needed));
    if (at > maxClientHelloBytes + 5 * 8) return { kind: "invalid", reason: "ClientHello too large" };
  }
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
