"""Plan building (``accel.hw.fused.fuse``) of a real model's streams, two versions of
``accel/hw/fused.py`` alternated in one process, and their plans' runs compared.

``capture``: build a quantised model (``/work/prof/<name>_int8.onnx`` and its input, or any
ONNX file and ``.npy`` input given), make its first call, and pickle every stream the call
plans, with its execution order and (copies of) the host buffers it was planned on.

``compare``: fuse the captured streams with the fused.py files given (the first one named
``old``, the second ``new``; each loaded as a module of its own over this interpreter's
``accel`` package), alternating the versions ``--rounds`` times, and print each version's
thread CPU (``time.thread_time``) and wall per round and their medians. Then run every
stream's plan of each version on the same host buffers and scratchpads (seeded) and check that
the host buffers and all three scratchpads end bit-identical; the count of value numbers
(``plan.values``) and of the ALU batches' calls of a run (``plan._alu_steps``) of each is printed
too, and the thread CPU of running all the plans once (what a replayed call runs of them),
alternated.

    python benchmarks/bench_fuse_ab.py capture ppocrv5_det /tmp/det.pkl
    python benchmarks/bench_fuse_ab.py compare /tmp/det.pkl old_fused.py accel/hw/fused.py --rounds 3
"""

from __future__ import annotations

import argparse
import importlib.util
import pickle
import statistics
import sys
import time
import warnings

import numpy as np


def capture(name: str, out: str) -> None:
    import onnx

    import tirpat as tp
    from accel.hw import fused
    from tirpat.model.onnx_import import import_onnx

    path, x = f"/work/prof/{name}_int8.onnx", np.load(f"/work/prof/{name}_x.npy")
    inp = onnx.load(path, load_external_data=False).graph.input[0].name
    mod = import_onnx(path, {inp: list(x.shape)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)
        model = tp.build(mod, "accel, llvm")
    streams = []
    config = []
    real = fused.fuse

    def recording(sim, stream, order, buffers):
        config[:] = [sim.config]
        streams.append((list(stream), list(order), [None if b is None else b.copy() for b in buffers]))
        return real(sim, stream, order, buffers)
    fused.fuse = recording
    try:
        start = time.perf_counter()
        model(x)
        print(f"first call {time.perf_counter() - start:.1f} s, {len(streams)} streams planned")
    finally:
        fused.fuse = real
    with open(out, "wb") as f:
        pickle.dump((config[0], streams), f, protocol=pickle.HIGHEST_PROTOCOL)


def _module(path: str, label: str):
    spec = importlib.util.spec_from_file_location(f"fused_{label}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _fuse_all(module, config, streams) -> tuple[float, float, list]:
    from accel.hw.sim import Simulator

    sim = Simulator(config)
    cpu, wall = time.thread_time(), time.perf_counter()
    plans = [module.fuse(sim, stream, order, buffers) for stream, order, buffers in streams]
    return time.thread_time() - cpu, time.perf_counter() - wall, plans


def _runs_alike(modules, config, streams) -> list:
    """Check every stream's plans run alike; return, per module, its simulator and its plans
    with the tuple of host buffers each ran on."""
    from accel.hw.sim import Simulator

    sims = [Simulator(config) for _ in modules]
    runs: list[list] = [[] for _ in modules]
    values = [0] * len(modules)
    calls = [0] * len(modules)
    covered = 0
    for k, (stream, order, buffers) in enumerate(streams):
        ends = []
        for m, (module, sim) in enumerate(zip(modules, sims)):
            rng = np.random.default_rng(k)
            sim.acc[:] = rng.integers(-2**31, 2**31, sim.acc.size, dtype=np.int64).astype(np.int32)
            sim.inp[:] = rng.integers(-128, 128, sim.inp.size)
            sim.wgt[:] = rng.integers(-128, 128, sim.wgt.size)
            host = tuple(None if b is None else b.copy() for b in buffers)
            plan = module.fuse(sim, stream, order, host)
            if plan is None:
                ends.append(None)
                continue
            values[m] += plan.values
            assert plan.run(host, sim)
            calls[m] += len(plan._alu_steps)
            runs[m].append((plan, host))
            ends.append([sim.acc.copy(), sim.inp.copy(), sim.wgt.copy(), *(b for b in host if b is not None)])
        if ends[0] is None or ends[1] is None:
            assert ends[0] is None and ends[1] is None, f"stream {k}: planned by one version only"
            continue
        covered += 1
        for a, b in zip(*ends):
            np.testing.assert_array_equal(a, b, err_msg=f"stream {k}")
    print(f"runs bit-identical on {covered} planned streams of {len(streams)}; value numbers, ALU calls a run: "
          + ", ".join(f"{m.__name__} {v:,}, {c:,}" for m, v, c in zip(modules, values, calls)))
    for module, sim in zip(modules, sims):
        module.settle(sim)      # as a model's call ends: every plan bound to the workspace's final arrays
    return [(module, sim, mine) for module, sim, mine in zip(modules, sims, runs)]


def _time_runs(runs: list, rounds: int, repeat: int = 5) -> None:
    """Thread CPU of running every stream's plan once (as a replayed call does), ``repeat`` times
    a round, the versions alternated; medians of the rounds' per-run means."""
    times: dict[str, list[float]] = {module.__name__: [] for module, _, _ in runs}
    for r in range(rounds):
        for module, sim, plans in runs if r % 2 == 0 else runs[::-1]:
            cpu = time.thread_time()
            for _ in range(repeat):
                for plan, host in plans:
                    plan.run(host, sim)
            times[module.__name__].append((time.thread_time() - cpu) / repeat)
    print("every plan run once (a replayed call's plans), median thread CPU: "
          + ", ".join(f"{name} {1e3 * statistics.median(t):.1f} ms" for name, t in times.items()))


def compare(capture_file: str, old: str, new: str, rounds: int) -> None:
    with open(capture_file, "rb") as f:
        config, streams = pickle.load(f)
    print(f"{len(streams)} streams, {sum(len(s[0]) for s in streams):,} instructions")
    modules = [_module(old, "old"), _module(new, "new")]
    times: dict[str, list[tuple[float, float]]] = {m.__name__: [] for m in modules}
    for r in range(rounds):
        for module in modules if r % 2 == 0 else modules[::-1]:
            cpu, wall, plans = _fuse_all(module, config, streams)
            del plans
            times[module.__name__].append((cpu, wall))
            print(f"round {r}: {module.__name__} thread CPU {cpu:.2f} s, wall {wall:.2f} s", flush=True)
    for name, measured in times.items():
        print(f"{name}: median thread CPU {statistics.median(c for c, _ in measured):.2f} s, "
              f"wall {statistics.median(w for _, w in measured):.2f} s")
    _time_runs(_runs_alike(modules, config, streams), max(rounds, 5))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture")
    c.add_argument("name")
    c.add_argument("out")
    p = sub.add_parser("compare")
    p.add_argument("capture_file")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.command == "capture":
        capture(args.name, args.out)
    else:
        compare(args.capture_file, args.old, args.new, args.rounds)
