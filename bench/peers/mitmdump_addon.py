"""mitmdump addon for the bench (bench/run.ts passes it with -s).

- Every upstream connection goes to 127.0.0.1: a `bench.test` name (or a subdomain of it) keeps
  its port and its SNI (mitmproxy takes the SNI from the client's ClientHello) but is dialled on
  loopback, and any other destination is refused. mitmproxy resolves names itself, through the
  system resolver, so this is what keeps it on the machine without touching /etc/hosts or DNS.
- mitmdump has no IPC channel: a thread reads stdin, and when the bench closes it (or dies), it
  asks mitmdump to shut down, so it cannot outlive the bench.
"""
import os
import signal
import sys
import threading


def _exit_with_parent() -> None:
    # os.read on the raw descriptor, not sys.stdin: a daemon thread blocked inside a buffered
    # reader makes the interpreter abort at shutdown.
    fd = sys.stdin.fileno()
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=_exit_with_parent, name="bench-exit-with-parent", daemon=True).start()


def running() -> None:
    # bench/targets.ts waits for this line, then for the port to accept connections.
    print("bench addon running", flush=True)


def _is_bench_host(host: str) -> bool:
    name = host.lower().rstrip(".")
    return name == "bench.test" or name.endswith(".bench.test")


def server_connect(data) -> None:
    host, port = data.server.address
    if _is_bench_host(str(host)):
        data.server.address = ("127.0.0.1", port)
    else:
        data.server.error = f"bench: {host} is not a bench.test host; only loopback is dialled"
