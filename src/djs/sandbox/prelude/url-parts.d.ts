// The parts `url.js` defines on URL.prototype in a loop, where the checker cannot see them.
export {};

declare module "./url.js" {
  interface URL {
    href: string;
    readonly origin: string;
    protocol: string;
    username: string;
    password: string;
    host: string;
    hostname: string;
    port: string;
    pathname: string;
    search: string;
    hash: string;
  }
}
