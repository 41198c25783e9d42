#!/usr/bin/env node
// The CLI's entry. Its modules take a few hundred milliseconds to load, and a SIGHUP meanwhile
// (a `systemctl reload` just after a start) ended the process with the signal's default action:
// the handler comes first, then the rest (main.ts). So does SIGUSR1's, which would open Node's
// inspector (sigusr1.ts).
import "./sigusr1.js";
import "./early-hup.js";

await import("./main.js");
