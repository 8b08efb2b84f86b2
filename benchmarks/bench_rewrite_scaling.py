"""Rewrite time vs function size: it must grow linearly.

A tiled int8 matmul body (copies into scratch buffers + a GEMM tile nest) is repeated
1x..64x in one PrimFunc; the reference copy rule and a GEMM rule are applied. The table
shows the median time, the time per copy of the body, and the ratio to the 1x figure
(flat per-copy cost means linear scaling).

    python benchmarks/bench_rewrite_scaling.py
"""

from __future__ import annotations

import statistics
import time

from tvm import tirx

import tirpat as tp
from tirpat.testing import reference_copy_rule, tiled_matmul


def body():
    return tiled_matmul(64, 64, 64, scopes=("local.accel_inp", "local.accel_wgt", "local.accel_acc"))


def repeated(func, n):
    """n copies of the body, each with its own loop variables and scratch buffers."""
    from tirpat.tir.analysis import defined_vars, fresh_var, key, rename_defs

    if n == 1:
        return func
    copies = [rename_defs(func.body, {key(v): fresh_var(v) for v in defined_vars(func.body)}) for _ in range(n)]
    return func.with_body(tirx.SeqStmt(copies))


def gemm_rule():
    i, j, k = tp.is_var("i"), tp.is_var("j"), tp.is_var("k")
    A, B, C = tp.is_buffer("A"), tp.is_buffer("B"), tp.is_buffer("C")
    upd = tp.is_store(C, [i, j], C[i, j] + A[i, k].astype("int32") * B[j, k].astype("int32"))
    tile = tp.is_nest([i, j, k], tp.is_seq(tp.is_if(tp.wildcard(), tp.wildcard()), upd))
    return tp.Rewriter.from_pattern(
        tile, lambda m: tirx.Evaluate(tirx.call_packed("gemm", m.region("C").offset)), name="gemm")


def main(repeats: int = 5):
    base = body()
    rw = reference_copy_rule() | gemm_rule()
    rows = []
    for n in (1, 2, 4, 8, 16, 32, 64):
        f = repeated(base, n)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            rw(f)
            times.append(time.perf_counter() - t)
        rows.append((n, statistics.median(times), sum(rw.report.counts.values())))
    per0 = rows[0][1] / rows[0][0]
    print(f"{'copies':>7} {'rewrites':>9} {'median ms':>10} {'ms/copy':>9} {'ratio to 1x':>12}")
    for n, t, count in rows:
        print(f"{n:7d} {count:9d} {t * 1e3:10.2f} {t * 1e3 / n:9.3f} {t / n / per0:12.2f}")


if __name__ == "__main__":
    main()
