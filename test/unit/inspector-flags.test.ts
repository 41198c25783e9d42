import { describe, expect, it } from "vitest";
import { execArgvWithoutInspector, nodeOptionsWithoutInspector } from "../../src/cli/inspector-flags.js";

// A --workers primary hands its workers its execArgv and NODE_OPTIONS without the inspector's
// options: each worker would open an inspector of its own, reachable through its siblings.
describe("the inspector's options, taken out of what the workers get", () => {
  it("drops every form that opens the inspector or sets its port, with a value given apart, and keeps the rest as it was", () => {
    expect(
      execArgvWithoutInspector(["--inspect", "--max-old-space-size=100", "--inspect-port", "9229", "--inspect-brk=0", "--inspect-wait", "--debug-port=1", "--enable-source-maps", "--inspector-x"]),
    ).toEqual({
      kept: ["--max-old-space-size=100", "--enable-source-maps", "--inspector-x"],
      dropped: ["--inspect", "--inspect-port", "9229", "--inspect-brk=0", "--inspect-wait", "--debug-port=1"],
    });
    expect(execArgvWithoutInspector(["--enable-source-maps"])).toEqual({ kept: ["--enable-source-maps"], dropped: [] });
    // Node takes `_` for `-` in an option's name: `node --inspect_brk=0` opens the inspector
    // (review finding, eleventh session), and `--inspect_port 9229` takes the next argument.
    expect(execArgvWithoutInspector(["--inspect_brk=127.0.0.1:0", "--inspect_port", "9229", "--debug_port=1", "--inspect_publish_uid=stderr", "--max_old_space_size=100", "--title=a_b"])).toEqual({
      kept: ["--max_old_space_size=100", "--title=a_b"],
      dropped: ["--inspect_brk=127.0.0.1:0", "--inspect_port", "9229", "--debug_port=1", "--inspect_publish_uid=stderr"],
    });
    expect(nodeOptionsWithoutInspector("--inspect_wait=0 --inspect_port 1234 --enable_source_maps")).toEqual({ kept: "--enable_source_maps", dropped: ["--inspect_wait=0", "--inspect_port", "1234"] });
  });

  it("splits NODE_OPTIONS as Node does, at spaces outside double quotes, and keeps the other options as written", () => {
    expect(nodeOptionsWithoutInspector('--require "/a b/c.js" --inspect=127.0.0.1:0 --inspect-port 1234 --max-old-space-size=64')).toEqual({
      kept: '--require "/a b/c.js" --max-old-space-size=64',
      dropped: ["--inspect=127.0.0.1:0", "--inspect-port", "1234"],
    });
    expect(nodeOptionsWithoutInspector('"--inspect" --title="x\\"y"')).toEqual({ kept: '--title="x\\"y"', dropped: ['"--inspect"'] });
    expect(nodeOptionsWithoutInspector("--max-old-space-size=64  --trace-warnings")).toEqual({ kept: "--max-old-space-size=64  --trace-warnings", dropped: [] });
    expect(nodeOptionsWithoutInspector("")).toEqual({ kept: "", dropped: [] });
  });
});
