"""Measuring on other machines through TVM's RPC tracker.

A measuring machine runs :func:`serve` (``tirpat rpc-server --tracker HOST:PORT --key KEY``):
a TVM RPC server that registers with the tracker under ``KEY`` and has the global function
:data:`MEASURE`, which measures an uploaded artifact (:func:`tirpat.model.tune.artifact.measure`)
with the backends installed on that machine. The tuning machine measures through
meta_schedule's own ``RPCRunner`` (:func:`rpc_runner`): each candidate's artifact is uploaded
to a free server the tracker picks, measured there, and removed.

A TVM RPC server runs any code it is sent (here: any artifact's compiled library), so
:func:`serve` binds to 127.0.0.1 unless told otherwise: expose it only to machines you trust.

>>> RPC.parse("127.0.0.1:9190:accel")
RPC(host='127.0.0.1', port=9190, key='accel')
"""

from __future__ import annotations

import socket
import warnings
from dataclasses import dataclass

import tvm
from tvm import rpc as tvm_rpc
from tvm.s_tir.meta_schedule.runner import RPCConfig, RPCRunner

from ..backend import backends
from .artifact import measure

__all__ = ["MEASURE", "RPC", "serve", "register_measure", "rpc_runner"]

#: The global function a tirpat RPC server measures an artifact with.
MEASURE = "tirpat.tune.measure"


@dataclass(frozen=True)
class RPC:
    """A TVM RPC tracker (``host``, ``port``) and the ``key`` of the measuring servers."""

    host: str
    port: int
    key: str

    @classmethod
    def parse(cls, text: str) -> "RPC":
        """``HOST:PORT:KEY`` (what ``tirpat tune --rpc`` takes).

        >>> RPC.parse("localhost:9190")
        Traceback (most recent call last):
        ...
        ValueError: an RPC address is HOST:PORT:KEY (e.g. 127.0.0.1:9190:accel), got 'localhost:9190'
        """
        parts = text.rsplit(":", 2)
        if len(parts) != 3 or not all(parts) or not parts[1].isdigit():
            raise ValueError(f"an RPC address is HOST:PORT:KEY (e.g. 127.0.0.1:9190:accel), got {text!r}")
        return cls(parts[0], int(parts[1]), parts[2])

    def servers(self) -> int:
        """How many servers are registered with the tracker under :attr:`key`."""
        try:
            # a plain connection first: TVM's own retries for a minute, warning every 5 s
            socket.create_connection((self.host, self.port), timeout=10).close()
            summary = tvm_rpc.connect_tracker(self.host, self.port).summary()
        except Exception as err:  # noqa: BLE001 - any failure to reach the tracker
            raise ConnectionError(f"cannot reach the RPC tracker at {self.host}:{self.port}: {err}") from None
        return sum(1 for s in summary.get("server_info", []) if s.get("key", "").split(":")[-1] == self.key)


def _warm_up() -> None:
    """Load every registered backend's runtime (by entering its session once), so that the
    per-session processes a server forks start with it loaded."""
    for name, backend in backends().items():
        try:
            with backend.session(backend.resolve()):
                pass
        except Exception as err:  # noqa: BLE001 - one broken backend must not stop the server
            warnings.warn(f"tirpat rpc-server: backend {name!r} failed to start: {err}", stacklevel=2)


def register_measure() -> None:
    """Register :data:`MEASURE` in this process (a server's initialisation does)."""
    tvm.register_global_func(MEASURE, measure, override=True)
    _warm_up()


def serve(tracker: tuple, key: str, host: str = "127.0.0.1", port: int = 9091,
          port_end: int = 9199) -> tvm_rpc.Server:
    """Start a TVM RPC server on ``host`` (first free port in ``[port, port_end)``) that
    registers with ``tracker`` (``(host, port)``) under ``key`` and measures artifacts.

    The server runs in a child process; ``server.terminate()`` stops it. It executes the
    code it is sent: keep ``host`` on 127.0.0.1 or an address only trusted machines reach.

    >>> server = serve(("127.0.0.1", 9190), "accel")     # doctest: +SKIP
    """
    return tvm_rpc.Server(host=host, port=port, port_end=port_end, tracker_addr=tuple(tracker), key=key,
                          silent=True, server_init_callback=register_measure)


def _upload(session, local_path: str, remote_path: str) -> str:
    """RPCRunner's upload step: the artifact is the whole candidate; returns its path there."""
    session.upload(local_path, remote_path)
    return session.get_function("tvm.rpc.server.workpath")(remote_path)


def _no_arguments(session, device, args_info, alloc_repeat) -> list:
    """RPCRunner's allocation step: nothing to allocate, the artifact holds the arguments."""
    return [[]]


def _measure_there(session, remote_path: str, device, evaluator_config, repeated_args) -> list:
    """RPCRunner's evaluation step: the server measures the uploaded artifact."""
    return [float(session.get_function(MEASURE)(remote_path))]


def rpc_runner(where: RPC, timeout: float = 60.0, workers: int | None = None) -> RPCRunner:
    """meta_schedule's ``RPCRunner`` measuring artifacts on the servers behind ``where``,
    ``workers`` requests at a time, each within ``timeout`` seconds. By default one more
    than there are servers: a request waits at the tracker, so that a server that finishes
    a candidate starts the next at once."""
    if workers is None:
        servers = where.servers()
        if servers == 0:
            raise ConnectionError(f"no RPC server is registered with the tracker {where.host}:{where.port} "
                                  f"under the key {where.key!r} (start one: tirpat rpc-server --tracker "
                                  f"{where.host}:{where.port} --key {where.key})")
        workers = servers + 1
    config = RPCConfig(tracker_host=where.host, tracker_port=where.port, tracker_key=where.key,
                       session_timeout_sec=int(max(1, round(timeout))))
    return RPCRunner(config, f_upload_module=_upload, f_alloc_argument=_no_arguments,
                     f_run_evaluator=_measure_there, max_workers=workers)
