// @ts-check
// What a policy throws to refuse a request with a status of its own (DESIGN §2).
export class HttpRequestBlockedError extends Error {
  // Without a statusText, the proxy sends the status's own reason phrase (451 Unavailable For Legal Reasons).
  constructor(message = "request blocked by policy", status = 403, statusText = status === 403 ? "Forbidden" : "") {
    super(String(message));
    this.name = "HttpRequestBlockedError";
    if (!Number.isInteger(status) || status < 400 || status > 599) {
      throw new RangeError(`HttpRequestBlockedError: status must be an integer from 400 to 599, got ${status}`);
    }
    this.status = status;
    this.statusText = statusText;
  }
}

