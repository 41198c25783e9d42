/** A promise and the function that settles it: a test's deterministic trigger ("the hook has the request", "release it"). */
export function latch<T = void>(): [Promise<T>, (value: T) => void] {
  let open!: (value: T) => void;
  const promise = new Promise<T>((resolve) => (open = resolve));
  return [promise, open];
}

/**
 * An onRequest hook that reads a clone of `/upload`'s body, as the README suggests: `inHook`
 * settles when it starts, `read` with what the read gave ("read N bytes" or "failed").
 */
export function cloneReader(): { onRequest: (request: Request) => Promise<void>; inHook: Promise<void>; read: Promise<string> } {
  const [inHook, hookHas] = latch();
  const [read, outcome] = latch<string>();
  return {
    inHook,
    read,
    onRequest: async (request) => {
      if (new URL(request.url).pathname !== "/upload") return;
      hookHas();
      await request
        .clone()
        .text()
        .then(
          (text) => outcome(`read ${text.length} bytes`),
          () => outcome("failed"),
        );
    },
  };
}
