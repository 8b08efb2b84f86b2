"""tp.build on a ResNet-style int8 CNN: compile time against tvm.compile(mod, "llvm") of the
same Relax module, and the simulated run (cycles, roofline share, wall time).

Both compile the same module for the same host target (llvm), interleaved in one run after
one untimed build each; tp.build also partitions, schedules and rewrites for accel and
re-lays out the constant weights. Target: tp.build compiles in at most 2x the time of
tvm.compile for llvm alone (wall time; process CPU time is printed too, as the machines
running this are shared and noisy).

    python benchmarks/bench_model.py [--repeats 5] [--size 16] [--channels 32] [--blocks 2]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import warnings

import numpy as np
import tvm
from tvm import relax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from timing import median_time, median_times  # noqa: E402

import tirpat as tp  # noqa: E402
from accel.demo import resnet_model  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=2)
    args = ap.parse_args(argv)

    mod = resnet_model(args.size, args.channels, args.blocks)
    compilers = [lambda: tp.build(mod, "accel, llvm"), lambda: tvm.compile(mod, "llvm")]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tp.OffloadWarning)     # the benchmark is of a fully offloaded model
        for compile_ in compilers:                             # warm-up: imports, first-use caches
            compile_()
        ours, ref = median_times(compilers, args.repeats)
        ours_cpu, ref_cpu = median_times(compilers, args.repeats, clock=time.process_time)
    model = tp.build(mod, "accel, llvm")
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    x = np.random.default_rng(0).integers(-128, 128, [int(d) for d in mod["main"].params[0].ty.shape.values],
                                          dtype=np.int8)
    out = model(x)
    assert np.array_equal(out, vm["main"](tvm.runtime.tensor(x)).numpy()), "not bit-exact"
    stats = model.stats["accel"]
    run_sim = median_time(lambda: model(x), args.repeats)
    run_llvm = median_time(lambda: vm["main"](tvm.runtime.tensor(x)), args.repeats)
    macs = model.report.total_macs

    print(f"ResNet-style int8 CNN: {args.size}x{args.size} NHWC, stem + {args.blocks} residual blocks of "
          f"{args.channels} channels, dense head; {macs:,} MACs, {100 * model.report.macs['accel'] / macs:.0f}% on accel")
    print(f"medians of {args.repeats} runs; columns: tp.build(mod, \"accel, llvm\") | tvm.compile(mod, \"llvm\") of "
          "the same module | ratio\n")
    print(f"{'measure':<40} {'tp.build':>12} {'tvm.compile llvm':>18} {'ratio':>8}")
    print(f"{'compile, wall time (s)':<40} {ours:>12.3f} {ref:>18.3f} {ours / ref:>7.2f}x   (target <= 2x)")
    print(f"{'compile, process CPU time (s)':<40} {ours_cpu:>12.3f} {ref_cpu:>18.3f} {ours_cpu / ref_cpu:>7.2f}x")
    print(f"{'run, wall time (ms; accel simulated)':<40} {run_sim * 1e3:>12.1f} {run_llvm * 1e3:>18.2f} "
          f"{run_sim / run_llvm:>7.1f}x")
    print(f"\naccel: {stats.cycles:,} cycles, roofline {stats.roofline_cycles:,} "
          f"({100 * stats.roofline_cycles / stats.cycles:.0f}%), "
          + ", ".join(f"{u} {100 * v:.0f}%" for u, v in stats.utilization.items()))
    for layer in model.layers:
        print(f"  {layer.cycles:8,d} cycles  {layer.what}")
    return 0 if ours <= 2 * ref else 1


if __name__ == "__main__":
    sys.exit(main())
