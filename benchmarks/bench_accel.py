"""accel.build on int8 dense, 64..1024: roofline share, compile time and run time.

For each size the same run measures, with medians over repeats:
- cycles of the cycle model vs ``roofline_cycles`` (target >= 90% at 512^3);
- ``accel.build`` time vs ``tvm.compile`` of the same workload left on the CPU (target <= 3x);
- wall time of the simulated run vs numpy's int32 matmul (target <= 1.5x at 512^3).

    python benchmarks/bench_accel.py [--sizes 64 128 256 512 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm import te, topi

import accel
from timing import median_time


def dense(n):
    A = te.placeholder((n, n), "int8", name="A")
    W = te.placeholder((n, n), "int8", name="W")
    return te.create_prim_func([A, W, topi.nn.dense(A, W, out_dtype="int32")])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"{'n^3':>6} | {'cycles':>9} {'roofline':>9} {'share':>6} | {'build s':>8} {'tvm.compile s':>13} {'ratio':>6} "
          f"| {'run ms':>8} {'numpy ms':>9} {'ratio':>6}")
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

        run_s = median_time(run, args.repeats)
        a32, w32 = a.astype(np.int32), w.astype(np.int32)
        np_s = median_time(lambda: a32 @ w32.T, args.repeats)
        assert np.array_equal(tc.numpy(), a32 @ w32.T)
        check = accel.Session(record=False)
        with check:
            ex(ta, tw, tc)
        st = check.stats
        share = st.roofline_cycles / st.cycles
        print(f"{n:6d} | {st.cycles:9d} {st.roofline_cycles:9d} {share:6.1%} | {build_s:8.3f} {cpu_s:13.3f} "
              f"{build_s / cpu_s:6.2f} | {run_s * 1e3:8.1f} {np_s * 1e3:9.1f} {run_s / np_s:6.2f}")


if __name__ == "__main__":
    main()
