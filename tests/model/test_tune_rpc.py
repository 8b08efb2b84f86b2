"""Tuning through TVM's RPC tracker, and the `tirpat tune` / `tirpat rpc-server` commands:
a tracker and two `tirpat rpc-server`s on loopback (module scope), bounded in time and
stopped by their process group ids; the console script run in subprocesses."""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

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
    return subprocess.run([sys.executable, "-m", "tirpat", *map(str, args)], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*command) -> subprocess.Popen:
    """A background process in a process group of its own (a TVM server forks workers)."""
    return subprocess.Popen([sys.executable, *map(str, command)], env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def stop(proc: subprocess.Popen) -> str:
    """Stop the process and everything it started, by its process group id; its output."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            out, _ = proc.communicate(timeout=20)
            return out
        except subprocess.TimeoutExpired:
            continue
    return proc.communicate(timeout=20)[0]


@pytest.fixture(scope="module")
def tracker():
    """A tracker and two measuring servers registered under KEY; yields (host, port)."""
    port = free_port()
    procs = [start("-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", port, "--port-end", port + 1)]
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                RPC("127.0.0.1", port, KEY).servers()
                break
            except ConnectionError:
                assert time.monotonic() < deadline, "the tracker did not start"
                time.sleep(0.5)
        for _ in range(2):
            server_port = free_port()
            procs.append(start("-m", "tirpat", "rpc-server", "--tracker", f"127.0.0.1:{port}", "--key", KEY,
                               "--port", server_port, "--port-end", server_port + 20))
        while RPC("127.0.0.1", port, KEY).servers() < 2:
            assert time.monotonic() < deadline, "the servers did not register"
            assert all(p.poll() is None for p in procs), [stop(p) for p in procs]
            time.sleep(0.5)
        yield "127.0.0.1", port
    finally:
        outputs = [stop(p) for p in reversed(procs)]
    for out in outputs[:-1]:        # the servers said where they serve, and nothing went wrong
        assert "serving on 127.0.0.1:" in out and "Traceback" not in out, out


def test_tuning_measures_on_the_servers_and_the_records_compile(tracker, tmp_path):
    host, port = tracker
    result = tirpat("tune", MLP, "-t", "accel, llvm", "--trials", 8, "--batch", 4, "--strategy", "replay-trace",
                    "--records", tmp_path / "records", "--rpc", f"{host}:{port}:{KEY}", cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "trials in" in result.stdout and "accel" in result.stdout
    compiled = tirpat("compile", MLP, "-t", "accel, llvm", "--records", tmp_path / "records", "-o", "mlp.tirpat",
                      cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    ran = tirpat("run", "mlp.tirpat", "--profile", cwd=tmp_path)
    assert ran.returncode == 0 and "cycles" in ran.stdout, ran.stderr


def test_rpc_results_equal_local_ones(tracker, tmp_path):
    """The same candidates measured here and on a server cost the same cycles."""
    host, port = tracker
    from models import mlp

    mod = mlp(batch=16, features=64, hidden=32, classes=8)
    local = tp.tune(mod, "accel, llvm", trials=3, records=tmp_path / "local", strategy="replay-trace", batch=1)
    remote = tp.tune(mod, "accel, llvm", trials=3, records=tmp_path / "remote", strategy="replay-trace", batch=1,
                     rpc=RPC(host, port, KEY))
    assert [t.heuristic for t in remote.tasks] == [t.heuristic for t in local.tasks]
    assert all(t.failures == 0 for t in remote.tasks)


def test_no_server_under_the_key_is_one_line(tracker, tmp_path):
    host, port = tracker
    result = tirpat("tune", MLP, "-t", "accel, llvm", "--trials", 2, "--records", tmp_path / "r",
                    "--rpc", f"{host}:{port}:nobody", cwd=tmp_path)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "no RPC server is registered" in result.stderr and "nobody" in result.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--rpc", "localhost:9190"], "an RPC address is HOST:PORT:KEY"),
    (["--rpc", "127.0.0.1:{dead}:accel"], "cannot reach the RPC tracker at 127.0.0.1:"),
    (["-t", "nosuch, llvm"], "unknown target 'nosuch'"),
])
def test_bad_tune_input_is_one_line(tmp_path, args, fragment):
    args = [a.format(dead=free_port()) for a in args]
    base = ["tune", MLP, "--trials", 2, "--records", tmp_path / "r"]
    if "-t" not in args:
        base += ["-t", "accel, llvm"]
    result = tirpat(*base, *args, cwd=tmp_path)
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.stderr, result.stderr


def test_usage_errors_and_help(tmp_path):
    bad = tirpat("tune", MLP, "-t", "accel, llvm", "--trials", 0, "--records", "r", cwd=tmp_path)
    assert bad.returncode == 2 and "expected a positive integer" in bad.stderr
    helped = tirpat("rpc-server", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "runs any code it is sent" in helped.stdout
    assert "127.0.0.1" in helped.stdout and "example:" in helped.stdout
    unreachable = tirpat("rpc-server", "--tracker", f"127.0.0.1:{free_port()}", "--key", "k", cwd=tmp_path,
                         timeout=60)
    assert unreachable.returncode == 1 and "cannot reach the RPC tracker" in unreachable.stderr
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


def test_the_readme_tuning_commands_work_as_shown(tmp_path):
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
    untuned = tirpat("compile", "examples/models/cnn_int8.py", "-t", "accel, llvm", "-o", "plain.tirpat", cwd=tmp_path)
    assert untuned.returncode == 0, untuned.stderr
    cycles = [int(re.search(r"^(\d+) cycles", tirpat("run", name, "--profile", cwd=tmp_path).stdout, re.M).group(1))
              for name in ("plain.tirpat", "cnn.tirpat")]
    assert cycles[1] < 0.8 * cycles[0]
