import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Builds dist when the sources are newer: the CLI tests run the built CLI, and the sources'
    // worker threads their built modules (src/worker-entry.ts).
    globalSetup: ["test/global-setup.ts"],
    env: { EGRESSGATE_BUILT_WORKERS: "1" },
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Two cores: integration tests start real servers and TLS handshakes, so keep parallelism modest.
    maxWorkers: 2,
  },
});
