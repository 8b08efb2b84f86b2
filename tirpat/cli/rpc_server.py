"""``tirpat rpc-server --tracker HOST:PORT --key KEY``: measure tuning candidates for ``tirpat tune --rpc``."""

from __future__ import annotations

import argparse

from .command import Command, CommandError

_DESCRIPTION = """\
Starts a TVM RPC server that registers with the tracker at HOST:PORT under KEY and
measures the candidates 'tirpat tune --rpc HOST:PORT:KEY' sends: each is a compiled
library with its test inputs, run on the backend's device of this machine (for accel: the
simulator) and checked against the reference. Runs until interrupted (Ctrl-C or SIGTERM).
A tracker that is not up yet is waited for (--wait seconds, 60 by default, as TVM's own
server does).

WARNING: a TVM RPC server runs any code it is sent. It binds to 127.0.0.1 unless --host
says otherwise; give --host an address only machines you trust can reach.

The tracker is TVM's own: python -m tvm.exec.rpc_tracker --host 127.0.0.1 --port 9190"""


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracker", required=True, metavar="HOST:PORT", type=_address,
                        help="the TVM RPC tracker to register with")
    parser.add_argument("--key", required=True, help="the key 'tirpat tune --rpc HOST:PORT:KEY' asks the tracker for")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; the server runs "
                             "any code it is sent)")
    parser.add_argument("--port", type=int, default=9091, help="first port to try (default 9091)")
    parser.add_argument("--port-end", type=int, default=None, metavar="PORT",
                        help="try ports up to this one, exclusive (default: PORT + 100)")
    parser.add_argument("--wait", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the tracker to come up (default 60)")


def _address(text: str) -> tuple:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (PORT 1 to 65535), got {text!r}")
    return host, int(port)


def _wait_for_tracker(where, seconds: float) -> None:
    """Return once the tracker answers (saying once that it is waited for), or fail after
    ``seconds``: a server started with its tracker may come up a moment before it."""
    import time

    deadline = time.monotonic() + seconds
    said = False
    while True:
        try:
            where.servers(limit=max(1.0, min(10.0, seconds)))
            return
        except ConnectionError as err:
            if time.monotonic() >= deadline:
                raise CommandError(f"{err} (waited {seconds:g} s)") from None
            if not said:
                print(f"waiting for the RPC tracker at {where.host}:{where.port} (up to {seconds:g} s)", flush=True)
                said = True
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _run(args: argparse.Namespace) -> int:
    import signal
    import threading

    from tirpat.model.tune import RPC, serve

    host, port = args.tracker
    port_end = args.port_end if args.port_end is not None else args.port + 100
    if port_end <= args.port:
        raise CommandError(f"--port-end {port_end} must be greater than --port {args.port}")
    _wait_for_tracker(RPC(host, port, args.key), args.wait)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = serve((host, port), args.key, host=args.host, port=args.port, port_end=port_end)
    except Exception as err:  # noqa: BLE001 - e.g. no free port in the range
        raise CommandError(f"cannot start the RPC server on {args.host} ports [{args.port}, {port_end}): {err}") from None
    try:
        print(f"serving on {args.host}:{server.port}, registered with the tracker {host}:{port} as "
              f"{args.key!r}; Ctrl-C stops", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        server.terminate()
    return 0


COMMAND = Command(
    name="rpc-server",
    help="serve tuning measurements to 'tirpat tune --rpc' through a TVM RPC tracker (runs any code it is sent)",
    example="tirpat rpc-server --tracker 127.0.0.1:9190 --key accel",
    arguments=_arguments,
    run=_run,
    description=_DESCRIPTION,
)
