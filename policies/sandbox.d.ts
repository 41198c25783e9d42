// Editor support for policies: the globals the tier-2 sandbox adds to the standard builtins.
// Request, Response, Headers, URL, URLSearchParams, TextEncoder, TextDecoder, atob, btoa and
// console come from the usual DOM/Node typings.
declare class HttpRequestBlockedError extends Error {
  constructor(message?: string, status?: number, statusText?: string);
  readonly status: number;
  readonly statusText: string;
}
declare module "*.json" {
  const value: unknown;
  export default value;
}
