// What QuickJS has beyond the ECMAScript library that the prelude checks against.
// eslint-disable-next-line no-var -- only a `var` is a property of `globalThis`, which is how realm.js reads it.
declare var InternalError: ErrorConstructor | undefined;
