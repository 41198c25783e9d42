import { expect } from "vitest";
import { loadConfigFile } from "../../src/config/file.js";
import { ConfigFileError } from "../../src/config/option-error.js";

/** The error loading `file` throws, asserted to be a ConfigFileError; a file that loads fails the test. */
export function fileErrorOf(file: string, env: NodeJS.ProcessEnv = {}): ConfigFileError {
  try {
    loadConfigFile(file, env);
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigFileError);
    return error as ConfigFileError;
  }
  throw new Error(`${file} loaded without an error`);
}
