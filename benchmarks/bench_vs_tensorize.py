"""tirpat's from_module rewrite vs TVM's ``Schedule.tensorize``, same desc/impl pair.

The workload is an L-layer int8 MLP (L = 1, 4, 16) built from topi: each layer is
``nn.dense`` (int8 x int8 -> int32) whose output is cast to int8 for the next layer, all in
one PrimFunc. Every dense is tiled 16x16x16 (split, reorder, decompose_reduction at the
k-tile loop), so each layer has one 16x16x16 GEMM tile nest: L tile sites in all.

What is timed, per repeat (medians of several repeats, both in this process):

- tensorize: ``sch.tensorize(ii, intrin)`` on each of the L tile loops of the already
  scheduled (split/reorder/decompose) ``s_tir.Schedule`` (a fresh ``copy()`` per repeat,
  not timed), with the desc/impl pair registered through ``s_tir.TensorIntrin.register``;
- tirpat: ``rw(func)`` on the already lowered function (``tp.lower``, not timed; shown in
  its own column, since a tensorize flow pays it later in ``tvm.compile`` too), with
  ``rw = tp.Rewriter.from_module({"pattern": desc, "replacement": impl})``. The rewrite
  includes the scan of the whole function, matching (canonicalising a candidate only if it
  does not match as it is), every ``match_buffer`` precondition, the views, and the new
  PrimFunc. A module rule's replacement is checked once, when the rule is built (a
  well-formed function that uses only its parameters), and per site by the binding checks,
  so ``verify_well_formed`` is not run per call (the tests run it on every rewrite).

"per tile" is per tile site (one tensorize call, one rewritten nest). Before timing, both
results are compiled and run once and checked against numpy (they call the same packed
function). The target of the design is tirpat >= 10x faster per tile, flat in L.

    python benchmarks/bench_vs_tensorize.py [--repeats N] [--stages]

``--stages`` also prints where tirpat's time goes per tile (it wraps tirpat internals: the
search, the match_buffer checks that run inside it, the replacement callback, the rest).
"""

from __future__ import annotations

import argparse
import ctypes
import time

import numpy as np
import tvm
from tvm import s_tir, te, topi
from tvm.script import tirx as T

import tirpat as tp
from tirpat.testing import tile_gemm
from timing import median_time

INTRIN = "tirpat_bench.gemm16"


@T.prim_func(s_tir=True)
def gemm16_desc(a: T.handle, b: T.handle, c: T.handle):
    A = T.match_buffer(a, (16, 16), "int8", offset_factor=1)
    B = T.match_buffer(b, (16, 16), "int8", offset_factor=1)
    C = T.match_buffer(c, (16, 16), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
        T.writes(C[0:16, 0:16])
        for i, j, k in T.grid(16, 16, 16):
            with T.sblock("update"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", B[vj, vk])


@T.prim_func(s_tir=True)
def gemm16_impl(a: T.handle, b: T.handle, c: T.handle):
    sa = T.int32()
    sb = T.int32()
    sc = T.int32()
    A = T.match_buffer(a, (16, 16), "int8", offset_factor=1, strides=[sa, 1])
    B = T.match_buffer(b, (16, 16), "int8", offset_factor=1, strides=[sb, 1])
    C = T.match_buffer(c, (16, 16), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
        T.writes(C[0:16, 0:16])
        T.evaluate(T.call_packed("tirpat_bench.gemm16", A, B, C, sa, sb, sc))


def _view(t, shape, strides):
    dt = np.dtype(str(t.dtype))
    span = 1 + sum((e - 1) * s for e, s in zip(shape, strides))
    flat = np.frombuffer((ctypes.c_char * (span * dt.itemsize)).from_address(t.data_ptr()), dtype=dt)
    return np.lib.stride_tricks.as_strided(flat, shape, [s * dt.itemsize for s in strides], writeable=True)


@tvm.register_global_func("tirpat_bench.gemm16", override=True)
def _gemm16(a, b, c, sa, sb, sc):
    av = _view(a, (16, 16), (sa, 1)).astype("int32")
    bv = _view(b, (16, 16), (sb, 1)).astype("int32")
    _view(c, (16, 16), (sc, 1))[...] += av @ bv.T


def mlp_schedule(layers: int, batch: int = 64, width: int = 64):
    """The scheduled L-layer MLP and the tile loop of each layer."""
    X = te.placeholder((batch, width), "int8", name="X")
    args, h = [X], X
    for n in range(layers):
        W = te.placeholder((width, width), "int8", name=f"W{n}")
        args.append(W)
        d = topi.nn.dense(h, W, out_dtype="int32")
        h = topi.cast(d, "int8") if n < layers - 1 else d
    args.append(h)
    sch = s_tir.Schedule(te.create_prim_func(args))
    tiles = []
    for n in range(layers):
        blk = sch.get_sblock("T_matmul_NT" + (f"_{n}" if n else ""))
        io, jo, ko, ii, ji, ki = tile_gemm(sch, blk)
        sch.decompose_reduction(blk, ko)
        tiles.append(ii)
    return sch, tiles


def reference(x, ws):
    h = x
    for n, w in enumerate(ws):
        d = h.astype("int32") @ w.astype("int32").T
        h = d.astype("int8") if n < len(ws) - 1 else d
    return h


def check(layers, sch, tiles, rw):
    """Both routes compile, call the same packed function, and agree with numpy."""
    rng = np.random.default_rng(layers)
    x = rng.integers(-128, 128, (64, 64), dtype="int8")
    ws = [rng.integers(-128, 128, (64, 64), dtype="int8") for _ in range(layers)]
    want = reference(x, ws)
    tsch = sch.copy()
    for ii in tiles:
        tsch.tensorize(ii, INTRIN)
    rewritten = rw(tp.lower(sch.mod)["main"])
    for mod in (tsch.mod, tvm.IRModule({"main": rewritten})):
        ex = tvm.compile(mod, target="llvm")
        ts = [tvm.runtime.tensor(a) for a in [x, *ws, np.zeros((64, 64), "int32")]]
        ex["main"](*ts)
        np.testing.assert_array_equal(ts[-1].numpy(), want)


def main(repeats: int = 7, layers=(1, 4, 16)):
    s_tir.TensorIntrin.register(INTRIN, gemm16_desc, gemm16_impl, override=True)
    rw = tp.Rewriter.from_module({"pattern": gemm16_desc, "replacement": gemm16_impl}, name="gemm16")
    rows = []
    for n in layers:
        sch, tiles = mlp_schedule(n)
        check(n, sch, tiles, rw)
        lower_t = median_time(lambda: tp.lower(sch.mod), repeats)
        low = tp.lower(sch.mod)["main"]
        rw(low)  # warm up
        assert rw.report.counts == {"gemm16": n}, rw.report.counts
        tp_t = median_time(lambda: rw(low), repeats)

        def tensorize_all(s):
            for ii in tiles:
                s.tensorize(ii, INTRIN)

        tz_t = median_time(tensorize_all, repeats, setup=sch.copy)
        rows.append((n, lower_t, tp_t, tz_t))

    print("tirpat rw(func) on lowered TIR vs Schedule.tensorize on the scheduled (split/reorder/decompose)")
    print(f"schedule; same desc/impl; medians of {repeats} repeats; ms per tile site (L sites per function)")
    print(f"{'L':>3} {'tp.lower ms':>12} {'tirpat ms/tile':>15} {'tensorize ms/tile':>18} {'speedup':>8} "
          f"{'tirpat vs L=1':>14} {'tensorize vs L=1':>17}")
    tp0, tz0 = rows[0][2] / rows[0][0], rows[0][3] / rows[0][0]
    for n, lower_t, tp_t, tz_t in rows:
        a, b = tp_t / n, tz_t / n
        print(f"{n:3d} {lower_t * 1e3:12.2f} {a * 1e3:15.3f} {b * 1e3:18.3f} {b / a:7.1f}x "
              f"{a / tp0:14.2f} {b / tz0:17.2f}")


def stages(repeats: int = 7, layers=(1, 16)):
    """Per-tile time of each stage of ``rw(func)`` (wraps internals; for profiling only)."""
    import collections

    spent = collections.Counter()

    def timed(owner, attr, label):
        fn = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - t

        setattr(owner, attr, wrapper)
        return lambda: setattr(owner, attr, fn)

    rw = tp.Rewriter.from_module({"pattern": gemm16_desc, "replacement": gemm16_impl}, name="gemm16")
    rule = rw.rules[0].matcher.__self__  # the ModuleRule behind the Rule
    undo = [timed(rw.rules[0], "matcher", "matching"), timed(rule, "bind_params", "match_buffer checks"),
            timed(rw.rules[0], "callback", "replacement")]
    try:
        print("\ntirpat per tile, by stage (us):")
        for n in layers:
            low = tp.lower(mlp_schedule(n)[0].mod)["main"]
            rw(low)
            spent.clear()
            t0 = time.perf_counter()
            for _ in range(repeats):
                rw(low)
            total = time.perf_counter() - t0
            parts = dict(spent)
            parts["matching"] -= parts["match_buffer checks"]  # the checks run inside the search
            parts["rest (scan, new PrimFunc)"] = total - sum(parts.values())
            print(f"  L={n}: " + ", ".join(f"{k} {v / repeats / n * 1e6:.0f}" for k, v in parts.items()))
    finally:
        for u in undo:
            u()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--stages", action="store_true", help="also print tirpat's time per stage")
    args = parser.parse_args()
    main(args.repeats)
    if args.stages:
        stages(args.repeats)
