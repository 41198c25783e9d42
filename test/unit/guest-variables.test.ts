import { describe, expect, it } from "vitest";
import { proxyVariables, reservedVariableReason } from "../../src/guest-variables.js";
import { envFilePermissionProblem, guestEnvironment } from "../../src/proxy/guest-env.js";

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

describe("envFilePermissionProblem: an existing guest environment file another user owns", () => {
  it.each([
    [0o600, 1000, undefined],
    [0o644, 1000, undefined],
    [0o640, 0, undefined],
    [0o660, 0, undefined],
    [0o600, 0, undefined],
  ])("mode %o owned by uid %i, the proxy running as 1000: no problem (its own file loses what others may do; a group is the owner's choice)", (mode, owner, expected) => {
    expect(envFilePermissionProblem("/run/eg/guest.env", mode, owner, 1000)).toBe(expected);
  });

  it.each([0o644, 0o604, 0o602, 0o666])("mode %o owned by root is refused with the chmod that fixes it", (mode) => {
    const problem = envFilePermissionProblem("/run/eg/guest.env", mode, 0, 1000);
    expect(problem).toContain(`(mode ${mode.toString(8).padStart(4, "0")})`);
    expect(problem).toContain('run "chmod o-rwx /run/eg/guest.env"');
  });

  it("is never a problem where files have no owner (Windows)", () => {
    expect(envFilePermissionProblem("C:\\eg\\guest.env", 0o666, 0, undefined)).toBeUndefined();
  });
});
