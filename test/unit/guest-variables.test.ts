import { describe, expect, it } from "vitest";
import { proxyVariables, reservedVariableReason } from "../../src/guest-variables.js";
import { guestEnvironment } from "../../src/proxy/guest-env.js";

describe("the variables the proxy sets in a guest's environment", () => {
  const written = guestEnvironment({
    proxyUrl: "http://127.0.0.1:8080",
    credentials: { user: "ci", password: "t0ken" },
    caCertPath: "/ca.pem",
    caBundlePath: "/bundle.pem",
    extra: {},
  });

  // A variable added to guestEnvironment but not to the reserved list could be replaced by a
  // secret or an env entry of its name (a secret named HTTPS_PROXY took the guest off the proxy).
  it("are exactly the names refused for secrets and env entries", () => {
    expect(new Set(Object.keys(written))).toEqual(new Set(proxyVariables));
    for (const name of Object.keys(written)) expect(reservedVariableReason(name), name).toMatch(/is a variable the proxy sets/);
    for (const name of ["GITHUB_TOKEN", "Https_Proxy", "HTTPS_PROXY_X", "NO_PROXY"]) expect(reservedVariableReason(name), name).toBeUndefined();
  });
});
