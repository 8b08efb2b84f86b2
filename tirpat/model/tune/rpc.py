"""Measuring on other machines through TVM's RPC tracker.

A measuring machine runs :func:`serve` (``tirpat rpc-server --tracker HOST:PORT --key KEY``):
a TVM RPC server that registers with the tracker under ``KEY`` and has the global function
:data:`MEASURE`, which measures an uploaded artifact (:func:`tirpat.model.tune.artifact.measure`)
with the backends installed on that machine. The tuning machine measures through
meta_schedule's own ``RPCRunner`` (:func:`rpc_runner`): each candidate's artifact is uploaded
to a free server the tracker picks and measured there (the server deletes it with the
session's directory).

Every step has a time limit, where TVM's client would wait for ever on a server that
accepts connections and never answers (stopped, wedged, overloaded): reaching the tracker
and a server's handshake take at most ``connect_timeout`` seconds, every request of a
measurement (the upload, the measurement) at most ``timeout + connect_timeout`` (the server
itself ends a session after ``timeout``). A server that misses a limit is dropped with a
warning and its candidate is measured on another; when no registered server is left, the
tune fails with a ``ConnectionError`` naming each server and what it did not answer. Waiting
at the tracker for a free server has no limit of its own: the servers' sessions are
bounded, and the tuning process asks the tracker every ``connect_timeout`` seconds whether
any server is left.

A TVM RPC server runs any code it is sent (here: any artifact's compiled library), so
:func:`serve` binds to 127.0.0.1 unless told otherwise: expose it only to machines you trust.

>>> RPC.parse("127.0.0.1:9190:accel")
RPC(host='127.0.0.1', port=9190, key='accel')
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import struct
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import tvm
from tvm import rpc as tvm_rpc
from tvm.ir.utils import derived_object
from tvm.rpc import base
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RPCConfig, RPCRunner, RunnerResult
from tvm.support.popen_pool import PopenPoolExecutor, kill_child_processes

from ..backend import backends
from .artifact import measure

__all__ = ["MEASURE", "CONNECT_TIMEOUT", "RPC", "Unresponsive", "serve", "register_measure", "rpc_runner"]

#: The global function a tirpat RPC server measures an artifact with.
MEASURE = "tirpat.tune.measure"

#: Seconds to reach the tracker, or a server to answer the handshake, by default.
CONNECT_TIMEOUT = 10.0


class Unresponsive(ConnectionError):
    """An RPC server did not answer within its time limit (raised on the measuring worker;
    the message names the server, ``HOST:PORT``, and what it did not answer)."""


def _tracker(host: str, port: int, limit: float) -> socket.socket:
    """A connection to the tracker, its magic exchanged, every operation within ``limit``
    seconds (TVM's ``connect_tracker`` retries a refused connection for a minute, then
    waits for ever for each answer)."""
    sock = socket.create_connection((host, port), timeout=limit)
    try:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
            raise ConnectionError(f"{host}:{port} is not a TVM RPC tracker")
    except BaseException:
        sock.close()
        raise
    return sock


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
        if not 0 < int(parts[1]) < 65536:       # else the socket's own error reads as a refused connection
            raise ValueError(f"an RPC address's PORT is 1 to 65535, got {text!r}")
        return cls(parts[0], int(parts[1]), parts[2])

    def registered(self, limit: float = CONNECT_TIMEOUT) -> set:
        """The servers (``"HOST:PORT"``) registered with the tracker under :attr:`key`, busy
        or free, as the tracker answers within ``limit`` seconds; ``ConnectionError`` when it
        does not."""
        try:
            with _tracker(self.host, self.port, limit) as sock:
                base.sendjson(sock, [base.TrackerCode.SUMMARY])
                code, summary = base.recvjson(sock)
            if code != base.TrackerCode.SUCCESS:
                raise ConnectionError(f"the tracker answered {code!r}")
        except (OSError, ValueError) as err:    # refused, timed out, reset, not JSON
            raise ConnectionError(f"cannot reach the RPC tracker at {self.host}:{self.port}: "
                                  f"{err or type(err).__name__}") from None
        return {f"{s['addr'][0]}:{s['addr'][1]}" for s in summary.get("server_info", [])
                if s.get("key", "").split(":")[-1] == self.key}

    def servers(self, limit: float = CONNECT_TIMEOUT) -> int:
        """How many servers are registered with the tracker under :attr:`key`."""
        return len(self.registered(limit))


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


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[-1] if lines else type(err).__name__


def _survive_failed_sessions() -> None:
    """Keep this process's TVM server serving when a session fails. TVM's stops listening
    for good (while it stays registered) when a session's process exits with an error: the
    client went away mid-measurement (a tune stopped by Ctrl-C, a worker killed at a time
    limit) or the code it ran crashed; and it prints a traceback for each. Here a session
    that ends so is one line in the server's output, and its directory is removed as TVM
    removes it after any session."""
    from tvm.rpc import server as tvm_server

    serve_loop, serving = tvm_server._serve_loop, tvm_server._serving

    def serve_loop_quietly(sock, load_library, work_path) -> None:       # in the session's process
        try:
            serve_loop(sock, load_library, work_path)
        except Exception as err:  # noqa: BLE001 - the connection broke: nobody to tell but the log
            print(f"tirpat rpc-server: a session ended early: {_first_line(err)}", file=sys.stderr, flush=True)

    def serving_on(sock, addr, opts, load_library) -> None:
        cwd = os.getcwd()
        try:
            serving(sock, addr, opts, load_library)
        except RuntimeError as err:     # TVM's check of the session process's exit code
            work = os.getcwd()          # TVM's serving raised in the session's directory
            os.chdir(cwd)
            if work != cwd:
                shutil.rmtree(work, ignore_errors=True)
            sock.close()
            print(f"tirpat rpc-server: a session from {addr[0]} failed: {_first_line(err)}", file=sys.stderr,
                  flush=True)

    tvm_server._serve_loop, tvm_server._serving = serve_loop_quietly, serving_on


def _init_server() -> None:
    """A tirpat server's initialisation, in the server's process."""
    register_measure()
    _survive_failed_sessions()


def serve(tracker: tuple, key: str, host: str = "127.0.0.1", port: int = 9091,
          port_end: int = 9199) -> tvm_rpc.Server:
    """Start a TVM RPC server on ``host`` (first free port in ``[port, port_end)``) that
    registers with ``tracker`` (``(host, port)``) under ``key`` and measures artifacts.

    The server runs in a child process; ``server.terminate()`` stops it. It executes the
    code it is sent: keep ``host`` on 127.0.0.1 or an address only trusted machines reach.

    >>> server = serve(("127.0.0.1", 9190), "accel")     # doctest: +SKIP
    """
    return tvm_rpc.Server(host=host, port=port, port_end=port_end, tracker_addr=tuple(tracker), key=key,
                          silent=True, server_init_callback=_init_server)


# ----------------------------------------------------------------- on the measuring worker
# RPCRunner runs these steps in its worker processes, one measurement at a time each.

def _within(limit: float, server: str, what: str, request: Callable, *args):
    """``request(*args)``, or :class:`Unresponsive` when it takes more than ``limit`` seconds.
    TVM's RPC client has no time limit of its own, so the request runs in a daemon thread
    (TVM releases the GIL while it waits); one that misses the limit stays blocked on the
    silent server until the worker process ends."""
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["value"] = request(*args)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = err

    thread = threading.Thread(target=call, name=f"tirpat rpc {what}", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        raise Unresponsive(f"the RPC server {server} did not answer {what} within {limit:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class _Session(tvm_rpc.RPCSession):
    """An RPC session that knows its ``server`` (``HOST:PORT``) and gives every request at
    most ``limit`` seconds."""

    def __init__(self, session: tvm_rpc.RPCSession, server: str, limit: float) -> None:
        super().__init__(session._sess)
        self.server, self.limit = server, limit

    def within(self, what: str, request: Callable, *args):
        return _within(self.limit, self.server, what, request, *args)


def _connect(config: RPCConfig, connect_timeout: float, request_timeout: float) -> _Session:
    """RPCRunner's session step: a free server from the tracker (TVM's ``request``, with the
    server's address kept and time limits on reaching the tracker and on the handshake)."""
    with _tracker(config.tracker_host, config.tracker_port, connect_timeout) as tracker:
        # waiting for a free server has no limit here: the servers' sessions have one, and
        # the tuning process stops waiting when no server is left (_Measurement.result)
        tracker.settimeout(None)
        base.sendjson(tracker, [base.TrackerCode.REQUEST, config.tracker_key, "", config.session_priority])
        answer = base.recvjson(tracker)
    if answer[0] != base.TrackerCode.SUCCESS:
        raise ConnectionError(f"the RPC tracker answered a request for {config.tracker_key!r} with {answer!r}")
    host, port, matchkey = answer[1]
    server = f"{host}:{port}"
    session = _within(connect_timeout, server, "the handshake", tvm_rpc.connect, host, port, matchkey,
                      config.session_timeout_sec)
    return _Session(session, server, request_timeout)


def _upload(session: _Session, local_path: str, remote_path: str) -> str:
    """RPCRunner's upload step: the artifact is the whole candidate; returns its path there."""
    session.within("the upload", session.upload, local_path, remote_path)
    return session.within("the upload", lambda: session.get_function("tvm.rpc.server.workpath")(remote_path))


def _no_arguments(session, device, args_info, alloc_repeat) -> list:
    """RPCRunner's allocation step: nothing to allocate, the artifact holds the arguments."""
    return [[]]


def _measure_there(session: _Session, remote_path: str, device, evaluator_config, repeated_args) -> list:
    """RPCRunner's evaluation step: the server measures the uploaded artifact."""
    return [float(session.within("the measurement", lambda: session.get_function(MEASURE)(remote_path)))]


def _no_cleanup(session, remote_path) -> None:
    """RPCRunner's clean-up step: nothing to do, the server deletes a session's directory
    when the session ends (TVM's default step would wait on a server that stopped answering)."""


# ----------------------------------------------------------------- in the tuning process
class _Pool(PopenPoolExecutor):
    """TVM's pool of worker processes, with a shutdown that works while workers are busy:
    TVM's closes the pipe a pool thread is blocked reading (a worker waiting on a silent
    server, or at the tracker), and that waits for the read for ever. This one starts no
    new job and kills the workers until the pool threads have finished, then shuts down."""

    def shutdown(self, wait: bool = True) -> None:
        threads = list(self._threadpool._threads)
        self._threadpool.shutdown(wait=False, cancel_futures=True)
        while any(t.is_alive() for t in threads):
            with self._lock:        # a worker a thread started meanwhile is killed next round
                running = [w._proc for w in self._worker_map.values() if w._proc is not None]
            for proc in running:
                kill_child_processes(proc.pid)
                proc.kill()
            for t in threads:
                t.join(0.1)
        super().shutdown(wait=wait)


_UNRESPONSIVE = re.compile(r"Unresponsive: the RPC server (\S+) (did not answer .*)$", re.M)


@derived_object
class _Measurement(PyRunnerFuture):
    """One candidate's measurement through RPCRunner; measured again on another server when
    its server turns out unresponsive (which drops that server)."""

    def __init__(self, runner: "_Runner", runner_input) -> None:
        super().__init__()
        self.runner, self.input, self.final = runner, runner_input, None
        self.attempt = runner.rpc.run([runner_input])[0]
        runner.measurements.add(self)

    def poll(self) -> bool:
        """Whether the final result is in (a result from an unresponsive server is not)."""
        if self.final is not None:
            return True
        if not self.attempt.done():
            return False
        result = self.attempt.result()
        found = _UNRESPONSIVE.search(result.error_msg or "")
        if found is None:
            self.final = result
            return True
        self.runner.drop(found.group(1), found.group(2))
        self.attempt = self.runner.rpc.run([self.input])[0]
        return False

    def done(self) -> bool:
        return self.poll()

    def result(self) -> RunnerResult:
        while not self.poll():
            self.runner.check()
            time.sleep(0.05)
        self.runner.measurements.discard(self)
        return self.final


@derived_object
class _Runner(PyRunner):
    """meta_schedule's ``RPCRunner`` with the steps above, dropping servers that stop
    answering; :attr:`failure` is the ``ConnectionError`` it stopped the tune with, if any
    (meta_schedule hands the caller a bare ``RuntimeError``); ``stop()`` is called while
    waiting for a result (it raises to stop the tune)."""

    def __init__(self, where: RPC, timeout: float, connect_timeout: float, workers: int,
                 stop: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.where, self.connect_timeout, self.stop = where, connect_timeout, stop
        config = RPCConfig(tracker_host=where.host, tracker_port=where.port, tracker_key=where.key,
                           session_timeout_sec=int(max(1, round(timeout))))
        self.rpc = RPCRunner(config, f_create_session=functools.partial(_connect, connect_timeout=connect_timeout,
                                                                        request_timeout=timeout + connect_timeout),
                             f_upload_module=_upload, f_alloc_argument=_no_arguments, f_run_evaluator=_measure_there,
                             f_cleanup=_no_cleanup, max_workers=workers)
        self.rpc.pool.shutdown()            # RPCRunner's own, idle: replaced by one that can stop busy
        self.rpc.pool = _Pool(max_workers=workers)
        self.dropped: dict = {}          # server -> what it did not answer
        self.measurements: set = set()    # those whose result meta_schedule has not taken yet
        self.failure: ConnectionError | None = None
        self._asked = time.monotonic()

    def run(self, runner_inputs) -> list:
        return [_Measurement(self, ri) for ri in runner_inputs]

    def _check_left(self) -> None:
        """Fail when the tracker knows no server under the key but the dropped ones."""
        try:
            left = self.where.registered(self.connect_timeout) - set(self.dropped)
        except ConnectionError as err:
            left, lost = None, str(err)
        if left:
            return
        where = f"the tracker {self.where.host}:{self.where.port}"
        if left is None:
            message = lost
        elif self.dropped:
            message = f"no RPC server under the key {self.where.key!r} at {where} answers: " + \
                "; ".join(f"{s} {w}" for s, w in self.dropped.items())
        else:
            message = f"no RPC server is registered with {where} under the key {self.where.key!r} any more"
        self.failure = ConnectionError(message)
        raise self.failure

    def drop(self, server: str, why: str) -> None:
        """Measure no more on ``server``; warn, or fail when no server is left."""
        self.dropped[server] = why
        self._check_left()
        warnings.warn(f"the RPC server {server} {why}: dropped, measuring on the other servers", stacklevel=2)

    def check(self) -> None:
        """Notice the servers that stopped answering, and (every ``connect_timeout`` seconds)
        fail when the tracker has no server left: a request would wait there for ever."""
        self.stop()
        for measurement in list(self.measurements):
            measurement.poll()
        if time.monotonic() - self._asked >= self.connect_timeout:
            self._check_left()
            self._asked = time.monotonic()

    def close(self) -> None:
        """Stop the measuring workers (those waiting on a server or the tracker too)."""
        self.rpc.pool.shutdown()


def rpc_runner(where: RPC, timeout: float = 60.0, workers: int | None = None,
               connect_timeout: float = CONNECT_TIMEOUT, check: Callable[[], None] = lambda: None) -> _Runner:
    """A meta_schedule runner measuring artifacts on the servers behind ``where`` (through
    meta_schedule's ``RPCRunner``), ``workers`` requests at a time, each within the limits
    the module docstring states; ``close()`` it when done. By default one more worker than
    there are servers: a request waits at the tracker, so that a server that finishes a
    candidate starts the next at once. ``check()`` is called every 50 ms while a result is
    awaited: it raises to stop the tune (a Ctrl-C noted, say)."""
    if workers is None:
        servers = where.servers(connect_timeout)
        if servers == 0:
            raise ConnectionError(f"no RPC server is registered with the tracker {where.host}:{where.port} "
                                  f"under the key {where.key!r} (start one: tirpat rpc-server --tracker "
                                  f"{where.host}:{where.port} --key {where.key})")
        workers = servers + 1
    return _Runner(where, timeout, connect_timeout, workers, stop=check)
