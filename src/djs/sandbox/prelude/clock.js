// @ts-check
// Date and Math.random: the proxy fixes the clock and seeds the generator for each call
// (DESIGN §2). A call that stops to have a body loaded runs again with the same seed and clock,
// so the rerun makes the same choices as the first run did.

const OriginalDate = Date;
/** The proxy's clock at the start of the current call (DESIGN §2). */
let clock = 0;
let randomState = 1;

/**
 * @param {number} now the proxy's clock, in milliseconds
 * @param {number} seed
 */
export function startClock(now, seed) {
  clock = now;
  randomState = seed >>> 0 || 1;
}

// --- Date: the clock is fixed for the whole call ---------------------------------------
/**
 * @param {...any} args
 * @returns {any}
 */
export function SandboxDate(...args) {
  if (new.target === undefined) return new OriginalDate(clock).toString();
  return args.length === 0 ? Reflect.construct(OriginalDate, [clock], new.target) : Reflect.construct(OriginalDate, args, new.target);
}
SandboxDate.prototype = OriginalDate.prototype;
SandboxDate.now = () => clock;
SandboxDate.parse = OriginalDate.parse;
SandboxDate.UTC = OriginalDate.UTC;

/** Makes the realm's own Date and Math.random the call's. */
export function installClock() {
  Object.defineProperty(OriginalDate.prototype, "constructor", { value: SandboxDate });
  Math.random = function random() {
    // xorshift32: enough for sampling and jitter; policies have no crypto.
    let x = randomState;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    randomState = x >>> 0;
    return randomState / 4294967296;
  };
}
