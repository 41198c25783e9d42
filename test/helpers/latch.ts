/** A promise and the function that settles it: a test's deterministic trigger ("the hook has the request", "release it"). */
export function latch<T = void>(): [Promise<T>, (value: T) => void] {
  let open!: (value: T) => void;
  const promise = new Promise<T>((resolve) => (open = resolve));
  return [promise, open];
}
