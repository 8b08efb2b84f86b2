"""Tuning through TVM's RPC tracker, and the `tirpat tune` / `tirpat rpc-server` commands:
a tracker and two `tirpat rpc-server`s on loopback (module scope; the first server started
before its tracker), bounded in time and stopped by their process group ids; a silent
server (registered, never answering) in this process; the console script run in
subprocesses where the process is what is tested (a tune stopped by a signal, the README's
commands), :func:`tirpat.cli.main` in this process for the other cases."""

import os
import pathlib
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import psutil
import pytest
from tvm.rpc import base

import tirpat as tp
from tirpat.model.tune import RPC

ROOT = pathlib.Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "models" / "mlp_int8.py"
KEY = "tirpat-test-accel"


def env() -> dict:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [out.get("PYTHONPATH")])])
    return out


def tirpat(*args, cwd, timeout=300) -> subprocess.CompletedProcess:
    """The console script (``python -m tirpat``) in a subprocess."""
    return subprocess.run([sys.executable, "-m", "tirpat", *map(str, args)], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*command, log: pathlib.Path) -> subprocess.Popen:
    """A background process writing to ``log``, in a process group of its own (a TVM server
    forks workers)."""
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, *map(str, command)], env=env(), stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """Stop the process and everything it started, by its process group id."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=20)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_for(what: str, ready, procs=(), seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        assert all(p.poll() is None for p in procs), f"{what}: a process ended"
        time.sleep(0.2)


@dataclass
class Cluster:
    host: str
    port: int
    logs: list          # the servers' output, the first server's first


@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    """A tracker on loopback and two measuring servers registered with it under KEY; the
    first server starts before the tracker and waits for it."""
    logs = tmp_path_factory.mktemp("rpc")
    port = free_port()
    procs, server_logs = [], [logs / "server0.log", logs / "server1.log"]

    def server(log):
        server_port = free_port()
        procs.append(start("-m", "tirpat", "rpc-server", "--tracker", f"127.0.0.1:{port}", "--key", KEY,
                           "--port", server_port, "--port-end", server_port + 20, "--wait", 300, log=log))

    try:
        server(server_logs[0])
        wait_for("the first server waiting for its tracker", lambda: "waiting for" in server_logs[0].read_text(), procs)
        procs.append(start("-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", port,
                           "--port-end", port + 1, log=logs / "tracker.log"))
        server(server_logs[1])

        def registered(count):
            try:
                return RPC("127.0.0.1", port, KEY).servers() >= count
            except ConnectionError:
                return False

        wait_for("the servers registering", lambda: registered(2), procs)
        yield Cluster("127.0.0.1", port, server_logs)
    finally:
        for p in reversed(procs):
            stop(p)
    for log in server_logs:         # the servers said where they serve, and nothing went wrong
        out = log.read_text()
        assert "serving on 127.0.0.1:" in out and "Traceback" not in out, out


class Silent:
    """A server registered with the tracker under ``key`` that never answers: its listening
    socket's backlog accepts a connection, nobody reads it (what a stopped or wedged server
    is to a client). Closing it deregisters it."""

    def __init__(self, tracker_port: int, key: str) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.tracker = socket.create_connection(("127.0.0.1", tracker_port), timeout=30)
        self.tracker.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        assert struct.unpack("<i", base.recvall(self.tracker, 4))[0] == base.RPC_TRACKER_MAGIC
        for request in ([base.TrackerCode.UPDATE_INFO, {"key": f"server:{key}", "addr": [None, self.port]}],
                        [base.TrackerCode.PUT, key, [self.port, base.random_key(key)], None]):
            base.sendjson(self.tracker, request)
            assert base.recvjson(self.tracker) == base.TrackerCode.SUCCESS

    def __enter__(self) -> "Silent":
        return self

    def __exit__(self, *exc) -> None:
        self.tracker.close()
        self.sock.close()


def free_servers(cluster: Cluster) -> int:
    from tvm import rpc

    return rpc.connect_tracker(cluster.host, cluster.port).summary()["queue_info"].get(KEY, {}).get("free", 0)


def popen_workers() -> set:
    """The TVM worker processes this process started (meta_schedule's runners' among them)."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "tvm.exec.popen_worker" in " ".join(p.cmdline())}


def test_a_server_started_before_its_tracker_registers_once_the_tracker_is_up(tracker):
    first = tracker.logs[0].read_text()
    assert f"waiting for the RPC tracker at 127.0.0.1:{tracker.port}" in first and "serving on" in first, first
    assert RPC(tracker.host, tracker.port, KEY).servers() == 2


def test_tuning_measures_on_the_servers_drops_a_silent_one_and_the_records_compile(tracker, tmp_path,
                                                                                     tirpat_inline):
    """A silent server under the key is handed out (3rd of 8 requests at the latest: the
    tracker queues a server that finishes behind it), dropped with a warning, and its
    candidate measured on another: every trial measured, none failed."""
    with Silent(tracker.port, KEY) as silent:
        result = tirpat("tune", MLP, "-t", "accel, llvm", "--trials", 8, "--batch", 4, "--strategy", "replay-trace",
                        "--records", tmp_path / "records", "--rpc", f"{tracker.host}:{tracker.port}:{KEY}",
                        "--connect-timeout", 3, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"tirpat tune: warning: the RPC server 127.0.0.1:{silent.port} did not answer the handshake within 3 s: "
        f"dropped, measuring on the other servers"], result.stderr
    assert "8 trials in" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[1:2] == ["accel"]]
    assert rows and all(row[3] == "0" for row in rows), result.stdout
    compiled = tirpat_inline("compile", MLP, "-t", "accel, llvm", "--records", tmp_path / "records", "-o",
                             "mlp.tirpat", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    ran = tirpat_inline("run", "mlp.tirpat", "--profile", cwd=tmp_path)
    assert ran.returncode == 0 and "cycles" in ran.stdout, ran.stderr


def test_a_tune_whose_only_server_is_silent_fails_naming_it_and_leaves_no_worker(tracker, tmp_path):
    from models import mlp

    before = popen_workers()
    with Silent(tracker.port, "silent") as silent:
        with pytest.raises(ConnectionError) as raised:
            tp.tune(mlp(batch=16, features=64, hidden=32, classes=8), "accel, llvm", trials=2, records=tmp_path / "r",
                    strategy="replay-trace", rpc=RPC(tracker.host, tracker.port, "silent"), connect_timeout=2)
    assert str(raised.value) == (f"no RPC server under the key 'silent' at the tracker {tracker.host}:{tracker.port} "
                                 f"answers: 127.0.0.1:{silent.port} did not answer the handshake within 2 s")
    assert popen_workers() <= before


def test_ctrl_c_stops_a_tune_at_once_and_its_records_compile(tracker, tmp_path, ctrl_c):
    """SIGINT to `tirpat tune --rpc` alone (its measuring workers do not get it): one line,
    status 130, no worker left behind, and the records measured so far compile."""
    records = tmp_path / "records"
    tune = subprocess.Popen([sys.executable, "-m", "tirpat", "tune", str(MLP), "-t", "accel, llvm", "--trials", "200",
                             "--batch", "4", "--strategy", "replay-trace", "--records", str(records),
                             "--rpc", f"{tracker.host}:{tracker.port}:{KEY}"], cwd=tmp_path, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        log = records / "database_tuning_record.json"
        wait_for("a first record", lambda: log.is_file() and log.read_text().strip(), [tune])
        tune.send_signal(signal.SIGINT)
        out, err = tune.communicate(timeout=120)
    finally:
        stop(tune)
    # 130 exactly: the interrupt is raised where the tune checks, never asynchronously (which
    # unwound native code and sometimes escaped: CPython then ended by SIGINT, or aborted)
    assert tune.returncode == 130, (tune.returncode, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tirpat tune: interrupted; ") and str(records) in lines[0], err
    with pytest.raises(ProcessLookupError):
        os.killpg(tune.pid, 0)      # its measuring workers went with it
    # both servers serve on (TVM's stops listening when a client goes away mid-session)
    wait_for("both servers free again", lambda: free_servers(tracker) >= 2)
    from tirpat.cli import main

    assert main(["compile", str(MLP), "-t", "accel, llvm", "--records", str(records), "-o",
                 str(tmp_path / "mlp.tirpat")]) == 0


def test_rpc_results_equal_local_ones(tracker, tmp_path):
    """The same candidates measured here and on a server cost the same cycles."""
    host, port = tracker.host, tracker.port
    from models import mlp

    mod = mlp(batch=16, features=64, hidden=32, classes=8)
    local = tp.tune(mod, "accel, llvm", trials=3, records=tmp_path / "local", strategy="replay-trace", batch=1)
    remote = tp.tune(mod, "accel, llvm", trials=3, records=tmp_path / "remote", strategy="replay-trace", batch=1,
                     rpc=RPC(host, port, KEY))
    assert [t.heuristic for t in remote.tasks] == [t.heuristic for t in local.tasks]
    assert all(t.failures == 0 for t in remote.tasks)


def test_no_server_under_the_key_is_one_line(tracker, tmp_path, tirpat_inline):
    host, port = tracker.host, tracker.port
    result = tirpat_inline("tune", MLP, "-t", "accel, llvm", "--trials", 2, "--records", tmp_path / "r",
                           "--rpc", f"{host}:{port}:nobody", cwd=tmp_path)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "no RPC server is registered" in result.stderr and "nobody" in result.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--rpc", "localhost:9190"], "an RPC address is HOST:PORT:KEY"),
    (["--rpc", "127.0.0.1:99999:accel"], "an RPC address's PORT is 1 to 65535, got '127.0.0.1:99999:accel'"),
    (["--rpc", "127.0.0.1:{dead}:accel"], "cannot reach the RPC tracker at 127.0.0.1:"),
    (["-t", "nosuch, llvm"], "unknown target 'nosuch'"),
])
def test_bad_tune_input_is_one_line(tmp_path, args, fragment, tirpat_inline):
    args = [a.format(dead=free_port()) for a in args]
    base = ["tune", MLP, "--trials", 2, "--records", tmp_path / "r"]
    if "-t" not in args:
        base += ["-t", "accel, llvm"]
    result = tirpat_inline(*base, *args, cwd=tmp_path)
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.stderr, result.stderr


def test_usage_errors_and_help(tmp_path, tirpat_inline):
    tirpat = tirpat_inline
    bad = tirpat("tune", MLP, "-t", "accel, llvm", "--trials", 0, "--records", "r", cwd=tmp_path)
    assert bad.returncode == 2 and "expected a positive integer" in bad.stderr
    bad = tirpat("rpc-server", "--tracker", "127.0.0.1:99999", "--key", "k", cwd=tmp_path)
    assert bad.returncode == 2 and "expected HOST:PORT (PORT 1 to 65535), got '127.0.0.1:99999'" in bad.stderr
    helped = tirpat("rpc-server", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "runs any code it is sent" in helped.stdout
    assert "127.0.0.1" in helped.stdout and "example:" in helped.stdout
    unreachable = tirpat("rpc-server", "--tracker", f"127.0.0.1:{free_port()}", "--key", "k", "--wait", 1,
                         cwd=tmp_path)
    assert unreachable.returncode == 1 and "cannot reach the RPC tracker" in unreachable.stderr
    assert "(waited 1 s)" in unreachable.stderr and unreachable.stdout.startswith("waiting for the RPC tracker")
    missing = tirpat("compile", MLP, "-t", "accel, llvm", "--records", tmp_path / "none", cwd=tmp_path)
    assert missing.returncode == 1 and "no tuning records in" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr


# --------------------------------------------------------------------------- the README
README_SECTION = "## Tune a model"


def shown(line: str) -> "re.Pattern":
    """A line the README shows as a regex: any number may be another, any run of blanks another."""
    import re

    parts = re.split(r"(-?\d[\d,.]*%?|\s+)", line.strip())
    out = []
    for part in parts:
        if not part:
            continue
        out.append(r"-?\d[\d,.]*%?" if re.fullmatch(r"-?\d[\d,.]*%?", part) else
                   r"\s+" if part.isspace() else re.escape(part))
    return re.compile("".join(out))


def test_the_readme_tuning_commands_work_as_shown(tmp_path, tirpat_inline):
    import re
    import shlex
    import shutil

    section = (ROOT / "README.md").read_text().split(README_SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands = [shlex.split(line) for line in blocks[0].splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["tirpat", "tune"], ["tirpat", "compile"], ["tirpat", "run"]]
    shutil.copytree(ROOT / "examples" / "models", tmp_path / "examples" / "models")
    outputs = []
    for command in commands:
        result = tirpat(*command[1:], cwd=tmp_path)
        assert result.returncode == 0 and result.stderr == "", (command, result.stderr)
        outputs.append(result.stdout)
    texts = re.findall(r"```text\n(.*?)```", section, re.S)
    for text, output in ((texts[0], outputs[0]), (texts[1], outputs[2])):
        lines = iter(output.splitlines())
        for line in filter(str.strip, text.splitlines()):
            pattern = shown(line)
            assert any(pattern.fullmatch(candidate.strip()) for candidate in lines), (line, output)
    # the tuned model is faster than the untuned one by what the table says, about
    untuned = tirpat_inline("compile", "examples/models/cnn_int8.py", "-t", "accel, llvm", "-o", "plain.tirpat",
                            cwd=tmp_path)
    assert untuned.returncode == 0, untuned.stderr
    cycles = [int(re.search(r"^(\d+) cycles", tirpat_inline("run", name, "--profile", cwd=tmp_path).stdout,
                            re.M).group(1))
              for name in ("plain.tirpat", "cnn.tirpat")]
    assert cycles[1] < 0.8 * cycles[0]
