import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Two cores: integration tests start real servers and TLS handshakes, so keep parallelism modest.
    maxWorkers: 2,
  },
});
