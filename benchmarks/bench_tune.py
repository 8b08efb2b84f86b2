"""Tuning accel's schedules: the demo CNN before and after a fixed trial budget, and how
measurement scales over TVM RPC servers.

The demo CNN of ``accel/demo.py`` (batch 2, 32x32 NHWC, channels 3 -> 16 -> 32 -> 64, 3x3
conv2d + bias + ReLU + requantise per layer, a dense head), written as a Relax model with
the same weights and checked bit for bit against the demo's numpy reference, so that each
layer is a partition ``tp.tune`` tunes on its own:

1. per layer, the simulated cycles of accel's heuristic schedule and of the best record
   after ``--trials`` measurements (evolutionary search, XGBoost cost model); the whole
   model built by ``tp.build`` without and with the records and run: total cycles and the
   share of the roofline reached (target: >= 15% fewer cycles in total, no layer slower);
2. trials per second of ``tp.tune --rpc`` with one and with two ``tirpat rpc-server``\\ s
   (a tracker and the servers started here on 127.0.0.1, stopped by process group), the
   median of ``--repeats`` runs of ``--rpc-trials`` trials each, timed from the first to
   the last measurement (start-up: reference runs and RPC workers, shown apart) (target:
   >= 1.6x with two).

    python benchmarks/bench_tune.py [--trials 128] [--rpc-trials 96] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tvm import relax

import tirpat as tp
from accel.demo import cnn
from tirpat.model.tune import RPC

TARGET = "accel, llvm"
BATCH, SIZE, CHANNELS, CLASSES, SHIFT = 2, 32, (3, 16, 32, 64), 10, 8


def demo_model():
    """``(Relax module, weights by name, input, numpy reference output)`` of the demo CNN."""
    _, inputs, reference = cnn(BATCH, SIZE, list(CHANNELS), CLASSES)
    args, _ = inputs(np.random.default_rng(0))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((BATCH, SIZE, SIZE, CHANNELS[0]), "int8"))
    params, weights = [x], {}
    with bb.function("main"):
        with bb.dataflow():
            act, size = x, SIZE
            for n, (c, f) in enumerate(zip(CHANNELS[:-1], CHANNELS[1:])):
                w = relax.Var(f"w{n}", relax.TensorType((3, 3, c, f), "int8"))
                b = relax.Var(f"b{n}", relax.TensorType((f,), "int32"))
                params += [w, b]
                stride = 1 if n == 0 else 2
                size = (size - 1) // stride + 1
                acc = relax.op.add(relax.op.nn.conv2d(act, w, strides=stride, padding=1, data_layout="NHWC",
                                                      kernel_layout="HWIO", out_dtype="int32"), b)
                shifted = relax.op.right_shift(relax.op.add(relax.op.nn.relu(acc), relax.const(1 << (SHIFT - 1), "int32")),
                                               relax.const(SHIFT, "int32"))
                act = bb.emit(relax.op.astype(relax.op.clip(shifted, -128, 127), "int8"))
            flat = bb.emit(relax.op.reshape(act, (BATCH, size * size * CHANNELS[-1])))
            wd = relax.Var("wd", relax.TensorType((CLASSES, size * size * CHANNELS[-1]), "int8"))
            bd = relax.Var("bd", relax.TensorType((CLASSES,), "int32"))
            params += [wd, bd]
            out = bb.emit_output(relax.op.add(relax.op.matmul(flat, relax.op.permute_dims(wd), out_dtype="int32"), bd))
        bb.emit_func_output(out, params)
    weights = {p.name: a for p, a in zip(params[1:], args[1:])}
    return bb.get(), weights, args[0], reference(*args)


def run_model(mod, weights, x, want, records=None):
    """The model built (with ``records``) and run: its accel statistics and layers."""
    model = tp.build(mod, TARGET, params=weights, records=records)
    got = model(x)
    assert np.array_equal(got, want), "the model's output differs from the demo's numpy reference"
    return model.stats["accel"], model.layers, model.report.to_json()["total_macs"]


def output_shapes(mod, weights) -> dict:
    """Partition name -> the shape of what it computes (its last buffer)."""
    return {name: "x".join(str(int(d)) for d in func.params[-1].shape)
            for name, _, _, func in tp.partition_functions(relax.transform.BindParams("main", weights)(mod), TARGET)}


def tuning_table(trials: int) -> bool:
    mod, weights, x, want = demo_model()
    shapes = output_shapes(mod, weights)
    with tempfile.TemporaryDirectory() as records:
        result = tp.tune(mod, TARGET, trials=trials, records=records, params=weights)
        before, layers_before, macs = run_model(mod, weights, x, want)
        after, layers_after, _ = run_model(mod, weights, x, want, records)
    print(f"demo CNN, {result.summary}; simulated cycles of the model built by tp.build without and with the "
          "records, bit-exact")
    rows = [(f"{lb.what} -> {shapes[lb.function]}", lb.cycles, la.cycles) for lb, la in zip(layers_before, layers_after)]
    width = max(len(r[0]) for r in rows) + 2
    print(f"{'layer':<{width}} {'heuristic':>10} {'tuned':>10} {'ratio':>7}")
    for label, b, a in rows:
        print(f"{label:<{width}} {b:>10,} {a:>10,} {a / b:>7.3f}")
    slower = any(a > b for _, b, a in rows)
    peak = tp.backends()["accel"].resolve()["gemm_macs_per_cycle"]
    print(f"{'whole model':<{width}} {before.cycles:>10,} {after.cycles:>10,} {after.cycles / before.cycles:>7.3f}")
    share = lambda roof, stats: f"{100 * roof / stats.cycles:.1f}%"  # noqa: E731
    print(f"{'roofline share (device MACs)':<{width}} {share(before.roofline_cycles, before):>10} "
          f"{share(after.roofline_cycles, after):>10}   padding to whole tiles counted")
    print(f"{'roofline share (model MACs)':<{width}} {share(before.mac_bound_cycles(macs), before):>10} "
          f"{share(after.mac_bound_cycles(macs), after):>10}"
          f"   the model's {macs:,} MACs at {peak} a cycle")
    gain = 1 - after.cycles / before.cycles
    print(f"total: {100 * gain:.1f}% fewer cycles (target >= 15%); layers slower than the heuristic: "
          f"{'some' if slower else 'none'}")
    return gain >= 0.15 and not slower


# ----------------------------------------------------------------------------- RPC scaling
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(*command) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *map(str, command)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def _wait(what, condition, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up within {seconds:.0f} s")
        time.sleep(0.5)


def _reachable(where: RPC) -> bool:
    try:
        where.servers()
        return True
    except ConnectionError:
        return False


def rpc_table(trials: int, repeats: int) -> bool:
    mod, weights, _, _ = demo_model()
    port = _free_port()
    where = RPC("127.0.0.1", port, "bench-accel")
    procs = [_start("-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", port, "--port-end", port + 1)]
    rates = {}
    try:
        _wait("the tracker", lambda: _reachable(where))
        for servers in (1, 2):
            server_port = _free_port()
            procs.append(_start("-m", "tirpat", "rpc-server", "--tracker", f"127.0.0.1:{port}", "--key", where.key,
                                "--port", server_port, "--port-end", server_port + 50))
            _wait(f"{servers} server(s)", lambda: where.servers() >= servers)
            runs = []
            for repeat in range(repeats):
                stamps = []
                with tempfile.TemporaryDirectory() as records:
                    start = time.perf_counter()
                    result = tp.tune(mod, TARGET, trials=trials, records=records, params=weights, rpc=where,
                                     seed=repeat, progress=lambda p: stamps.append((time.perf_counter(), p.trials)))
                first_time, first_trials = stamps[0]
                last_time, last_trials = stamps[-1]
                runs.append(((last_trials - first_trials) / (last_time - first_time), first_time - start,
                             result.trials / result.seconds))
            rates[servers] = [statistics.median(r[k] for r in runs) for k in range(3)]
    finally:
        for proc in reversed(procs):
            _stop(proc)
    print(f"tp.tune over RPC, the demo CNN, {trials} trials, median of {repeats} runs")
    print(f"{'servers':<8} {'trials/s':>9} {'start-up s':>11} {'overall trials/s':>17}")
    for servers, (rate, startup, overall) in rates.items():
        print(f"{servers:<8} {rate:>9.2f} {startup:>11.1f} {overall:>17.2f}")
    ratio = rates[2][0] / rates[1][0]
    print(f"two servers: {ratio:.2f}x the trials per second of one (target >= 1.6x); overall "
          f"{rates[2][2] / rates[1][2]:.2f}x")
    return ratio >= 1.6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=128, help="trial budget of the tuning table (default 128)")
    ap.add_argument("--rpc-trials", type=int, default=96, help="trials per RPC run (default 96)")
    ap.add_argument("--repeats", type=int, default=3, help="RPC runs per server count (default 3)")
    args = ap.parse_args()
    ok = tuning_table(args.trials)
    print()
    ok &= rpc_table(args.rpc_trials, args.repeats)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
