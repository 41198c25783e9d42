/**
 * SIGUSR1 is Node's signal to open its inspector (127.0.0.1:9229 by default), which runs any code
 * sent to it inside the proxy: secret values, the CA's key. Any local user may send it, and the
 * README's logrotate postrotate (`systemctl kill -s USR1`) did, to a proxy without --audit-log,
 * whose guest, allowed loopback, then drove the inspector through the proxy (black-box finding).
 * A listener is what turns Node's own handling off, so the CLI takes the signal from its first
 * module on, in every process it runs (one proxy, a --workers primary and its workers, an offline
 * command), for the process's whole life: startProxy's audit-log listener comes and goes with
 * its proxy. What the signal does once the proxy serves (reopen the audit log, or say there is
 * none) is main.ts's and startProxy's.
 */
process.on("SIGUSR1", () => undefined);
