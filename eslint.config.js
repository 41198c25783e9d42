import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  { ignores: ["dist/", "node_modules/", "bench/results/", "coverage/", "scratch/"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: {
        process: "readonly",
        console: "readonly",
        Buffer: "readonly",
        URL: "readonly",
        setTimeout: "readonly",
        clearTimeout: "readonly",
        setImmediate: "readonly",
        AbortController: "readonly",
        TextEncoder: "readonly",
        TextDecoder: "readonly",
      },
    },
    rules: {
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/consistent-type-imports": "error",
    },
  },
  {
    // On Node 20, `{ ...base, key }` makes a new hidden class per object once optimised
    // (src/objects.ts): refused in the code that runs per connection or request. The CLI's and
    // the config file's code runs once at start.
    files: ["src/**/*.ts"],
    ignores: ["src/cli/**", "src/config/**"],
    rules: {
      "no-restricted-syntax": [
        "error",
        {
          selector: "ObjectExpression > SpreadElement:first-child ~ :matches(Property, SpreadElement)",
          message: "A spread first and more after it gives every object its own hidden class on Node 20: use withFields(base, { ... }) from src/objects.ts, or name the fields.",
        },
      ],
    },
  },
  {
    // Tier-2 policies and the sandbox prelude run inside QuickJS, with its globals; a script
    // policy's functions are used by the proxy, not by the file.
    files: ["policies/**/*.{js,mjs,ts}", "src/djs/sandbox/**/*.js", "test/fixtures/*.mjs"],
    languageOptions: {
      globals: { HttpRequestBlockedError: "readonly", Request: "readonly", Response: "readonly", Headers: "readonly" },
    },
  },
  {
    files: ["policies/**/*.js"],
    languageOptions: { sourceType: "script" },
    rules: { "@typescript-eslint/no-unused-vars": ["error", { varsIgnorePattern: "^(isRequestAllowed|isIpAllowed|onRequest|onResponse)$", argsIgnorePattern: "^_" }] },
  },
  {
    // The prelude is one function expression, which the worker evaluates for its value.
    files: ["src/djs/sandbox/prelude.js"],
    languageOptions: { sourceType: "script" },
    rules: { "@typescript-eslint/no-unused-expressions": "off" },
  },
);
