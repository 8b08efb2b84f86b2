"""accel.build on int8 dense, 64..1024: roofline share, compile time and run time.

For each size the same run measures, with medians over repeats:
- cycles of the cycle model vs ``roofline_cycles`` (target >= 90% at 512^3);
- ``accel.build`` time vs ``tvm.compile`` of the same workload left on the CPU (target <= 3x);
- wall time of the simulated run (the session replays the stream it built on the first
  call) vs numpy's int32 matmul (target <= 1 at 512^3) and vs float64 BLAS, exact for int8
  data of these sizes and so the practical limit (moonshot: <= 2).

BLAS runs single-threaded on both sides (set before numpy loads; override with
OPENBLAS_NUM_THREADS): a multi-threaded OpenBLAS slows down by an order of magnitude when
another process competes for the cores, which made every ratio depend on unrelated load.

    python benchmarks/bench_accel.py [--sizes 64 128 256 512 1024] [--repeats 5]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import te, topi  # noqa: E402

import accel  # noqa: E402
from timing import median_time, median_times  # noqa: E402


def dense(n):
    A = te.placeholder((n, n), "int8", name="A")
    W = te.placeholder((n, n), "int8", name="W")
    return te.create_prim_func([A, W, topi.nn.dense(A, W, out_dtype="int32")])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"dense, medians of {args.repeats}, BLAS threads {os.environ['OPENBLAS_NUM_THREADS']}")
    print(f"{'n^3':>6} | {'cycles':>9} {'roofline':>9} {'share':>6} | {'build s':>8} {'tvm.compile s':>13} {'ratio':>6} "
          f"| {'run ms':>8} {'numpy ms':>9} {'BLAS ms':>8} | {'/numpy':>6} {'/BLAS':>6}")
    for n in args.sizes:
        func = dense(n)
        build_s = median_time(lambda: accel.build(func), args.repeats)
        cpu_s = median_time(lambda: tvm.compile(tvm.IRModule({"main": func}), target="llvm"), args.repeats)
        ex = accel.build(func)
        rng = np.random.default_rng(n)
        a = rng.integers(-128, 128, (n, n), dtype=np.int8)
        w = rng.integers(-128, 128, (n, n), dtype=np.int8)
        ta, tw = tvm.runtime.tensor(a), tvm.runtime.tensor(w)
        tc = tvm.runtime.tensor(np.zeros((n, n), np.int32))
        session = accel.Session(record=False)

        def run():
            with session:
                ex(ta, tw, tc)

        run()  # the first call builds the stream; the timed ones replay it
        a32, w32 = a.astype(np.int32), w.astype(np.int32)
        run_s, np_s, blas_s = median_times(
            [run, lambda: a32 @ w32.T,
             lambda: (a.astype(np.float64) @ w.astype(np.float64).T).astype(np.int32)], args.repeats)
        assert np.array_equal(tc.numpy(), a32 @ w32.T)
        check = accel.Session(record=False)
        with check:
            ex(ta, tw, tc)
        st = check.stats
        share = st.roofline_cycles / st.cycles
        print(f"{n:6d} | {st.cycles:9d} {st.roofline_cycles:9d} {share:6.1%} | {build_s:8.3f} {cpu_s:13.3f} "
              f"{build_s / cpu_s:6.2f} | {run_s * 1e3:8.1f} {np_s * 1e3:9.1f} {blas_s * 1e3:8.1f} | "
              f"{run_s / np_s:6.2f} {run_s / blas_s:6.2f}")


if __name__ == "__main__":
    main()
