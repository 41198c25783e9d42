export { createHttpHooks } from "./hooks/http-hooks.js";
export type { CreatedHttpHooks, HttpHooks, HttpHooksOptions, IpInfo, SecretManager } from "./hooks/http-hooks.js";
export { HttpRequestBlockedError } from "./hooks/blocked-error.js";
export { startProxy } from "./proxy/start-proxy.js";
export type { RunningProxy } from "./proxy/start-proxy.js";
export type { ProxyOptions, TimeoutOptions } from "./proxy/options.js";
export { EgressError } from "./errors.js";
export type { EgressErrorCode } from "./errors.js";
export type { LogLevel, LogSink } from "./log.js";
