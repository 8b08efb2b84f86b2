"""TVM's own TensorIntrins (x86 and arm_cpu) as ``Rewriter.from_module`` rules.

Each desc/impl pair becomes a rule; the target runs the desc on tiles of bigger buffers
(``tirpat.testing.intrin.tile_target``). The full list is in
``benchmarks/bench_intrin_coverage.py``.
"""

import pathlib
import re

import numpy as np
import pytest
import tvm
import tvm_ffi

from tvm.script import tirx as T

import tirpat as tp
from tirpat.testing import run
from tirpat.testing.intrin import registered_intrins, tile_escapes, tile_target

# dot products whose impls read a whole tile with one vector load (B[0, Ramp(0, 1, 64)])
SAMPLE = [
    ("x86", "dot_16x4_vnni"),
    ("x86", "dot_16x4_avx512"),
    ("arm_cpu", "dot_4x4_i8i8s32_neon"),
    ("arm_cpu", "dot_4x4_i8i8s32_sdot"),
    ("arm_cpu", "dot_4x4_u8u8u32_udot"),
    ("arm_cpu", "dot_4x4_u8u8i32_hdot"),
]


@pytest.fixture(scope="module")
def intrins():
    """Imports the intrinsics (about 40 s, once per process; x86 alone pulls in all of them)."""
    listed = registered_intrins(("x86", "arm_cpu"))
    from tvm.s_tir import TensorIntrin

    return listed, {name: TensorIntrin.get(name) for _, name in SAMPLE}


def _rule(ti, name):
    return tp.Rewriter.from_module({"pattern": ti.desc, "replacement": ti.impl}, name=name)


def test_registered_intrins_lists_the_sample(intrins):
    listed, _ = intrins
    assert set(SAMPLE) <= set(listed)


@pytest.mark.parametrize("module,name", SAMPLE, ids=[n for _, n in SAMPLE])
def test_desc_on_compact_tiles_is_rewritten(intrins, module, name):
    rw = _rule(intrins[1][name], name)
    target = tile_target(intrins[1][name].desc, layout="stacked")
    new = rw(target)
    assert rw.report.counts == {name: 1}, str(tp.explain(rw, target))
    assert tile_escapes(new, "stacked") == []
    assert "for t in range(2)" in new.script()  # one site, inside the tile loop


@pytest.mark.parametrize("module,name", SAMPLE, ids=[n for _, n in SAMPLE])
def test_whole_tile_vector_load_is_refused_on_a_strided_region(intrins, module, name):
    """The impls declare no strides and load a (16, 4) tile as 64 contiguous elements:
    right on a compact region only. On a (32, 8) buffer the rule must not fire."""
    rw = _rule(intrins[1][name], name)
    target = tile_target(intrins[1][name].desc, layout="tiled")
    new = rw(target)
    assert rw.report.counts == {}
    assert new.same_as(target)
    text = str(tp.explain(rw, target))
    assert "past its shape" in text and "not compact" in text


def test_avx512_rewrite_computes_the_desc(intrins):
    """Compiled for this host's AVX-512 (skipped elsewhere): same numbers as the loops."""
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if "avx512bw" not in (cpuinfo.read_text() if cpuinfo.exists() else ""):
        pytest.skip("needs AVX-512BW")
    name = "dot_16x4_avx512"
    rw = _rule(intrins[1][name], name)
    target = tile_target(intrins[1][name].desc, layout="stacked")
    new = rw(target)
    assert rw.report.counts == {name: 1}
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (2, 4)).astype("uint8")
    b = rng.integers(-128, 128, (2, 16, 4)).astype("int8")
    c = rng.integers(-1000, 1000, (2, 16)).astype("int32")
    got = run(new, [a, b, c], target=tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"}))[2]
    want = c + np.einsum("tk,tik->ti", a.astype("int32"), b.astype("int32"))
    np.testing.assert_array_equal(got, want)


def _comparable(m, pattern) -> dict:
    """The bindings a rewrite uses: parameters by name, loops and the regions bound (buffer,
    strides, offset and base)."""
    regions = [(target, strides, offset, base) for _, target, strides, offset, base, *_ in m[pattern].params]
    return {**m.captures, "loops": m.loops, "regions": regions}


def _same(a, b) -> bool:
    """Equal bindings; the search on raw TIR may bind an expression in its raw form."""
    from tvm import tirx

    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if not isinstance(a, tvm.runtime.Object):
        return a is b or a == b
    if a.same_as(b) or tvm_ffi.structural_equal(a, b, map_free_vars=False):
        return True
    if isinstance(a, tirx.For):
        return a.loop_var.same_as(b.loop_var) and _same(a.extent, b.extent)
    if isinstance(a, tvm.ir.Expr) and not isinstance(a, tirx.Stmt) and not tirx.is_buffer_var(a):
        return tp.tir.analysis.const_int(tp.tir.analysis.simplify(a - b)) == 0
    return False


def test_matching_raw_tir_agrees_with_explains_traced_search(intrins):
    """Every registered intrinsic, both tile layouts, every loop of the target: the search
    on raw TIR (what ``rw(func)`` runs, canonicalising only when it must) and the traced
    search on canonical TIR (what ``explain`` runs) agree on whether it matches and on every
    binding. The rewritten functions are well-formed (module rules skip the per-site
    verifier)."""
    from tvm.s_tir import TensorIntrin

    from tirpat.tir import engine
    from tirpat.tir.canonical import canonicalize
    from tirpat.tir.module_rule import ModuleRule

    matched = 0
    for _, name in registered_intrins():
        ti = TensorIntrin.get(name)
        rule = ModuleRule({"pattern": ti.desc, "replacement": ti.impl}, name)
        rw = _rule(ti, name)
        for layout in ("stacked", "tiled"):
            target = tile_target(ti.desc, layout=layout)
            loops = []
            tvm_ffi.structural_walk(target.body, (tvm.tirx.For, loops.append))
            for loop in loops:
                fast = rule.match(loop)
                full = engine.first_match(engine.compiled(rule.pattern, trace=True), canonicalize(loop),
                                          trace=engine.Trace())
                assert (fast is None) == (full is None), (name, layout, loop.loop_var.name)
                if fast is not None:
                    matched += 1
                    a, b = _comparable(fast, rule.pattern), _comparable(full, rule.pattern)
                    assert a.keys() == b.keys(), (name, layout)
                    for k in a:
                        assert _same(a[k], b[k]), (name, layout, k, a[k], b[k])
            new = rw(target)
            if rw.report.counts:
                tvm.tirx.analysis.verify_well_formed(new, assert_mode=True)
                assert tile_escapes(new, layout) == [], (name, layout)
    assert matched >= 132  # each intrinsic on its stacked target at least


def test_every_intrinsic_rewrites_int64_code(intrins):
    """Relax emits int64 loops and indices; TVM's descs are int32. Every registered
    intrinsic, both layouts: the int64 target (checked to be the same program by TVM's own
    ForceNarrowIndexToInt32) is rewritten at the same sites as the int32 one, into
    well-formed code whose indices and offsets are int64 throughout."""
    from tvm import tirx
    from tvm.s_tir import TensorIntrin

    narrow = tirx.transform.ForceNarrowIndexToInt32()
    for _, name in registered_intrins():
        ti = TensorIntrin.get(name)
        rw = _rule(ti, name)
        for layout in ("stacked", "tiled"):
            t32 = tile_target(ti.desc, layout=layout)
            t64 = tile_target(ti.desc, layout=layout, index_dtype="int64")
            assert "int64" in t64.script()
            assert tvm_ffi.structural_equal(narrow(tvm.IRModule({"main": t64}))["main"].body, t32.body,
                                            map_free_vars=True), (name, layout)
            rw(t32)
            want = dict(rw.report.counts)
            new = rw(t64)
            assert rw.report.counts == want, (name, layout, str(tp.explain(rw, t64)))
            if want:
                tirx.analysis.verify_well_formed(new, assert_mode=True)
                assert index_types(new) == {"int64"}, (name, layout)


def index_types(func) -> set:
    """The types of the arithmetic computed from the tile loop's variable (not through a
    load): every index, offset and stride a rewrite derived from the site, wherever the
    replacement passes it (loads and stores, ``tvm_access_ptr``, an intrinsic's arguments)."""
    from tvm import tirx

    t = func.body.loop_var
    derived = {t.__chandle__()}
    found = {str(t.ty.dtype)}
    arith = (tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max, tirx.Cast)

    def on_expr(e):  # post-order: the operands first
        operands = [e.value] if isinstance(e, tirx.Cast) else [e.a, e.b]
        if any(o.__chandle__() in derived for o in operands):
            derived.add(e.__chandle__())
            found.add(str(e.ty.dtype))

    tvm_ffi.structural_walk(func.body.body, (arith, on_expr))
    return found


@pytest.fixture
def sum_and_copy():
    """``C[i] = s + t; D[i] = s``: the commutative + offers two bindings, and only the
    second one agrees with the store to D."""

    @T.prim_func
    def pattern(C: T.Buffer((8,), "int32"), D: T.Buffer((8,), "int32"), s: T.int32, t: T.int32):
        for i in range(8):
            C[i] = s + t
            D[i] = s

    @T.prim_func
    def replacement(C: T.Buffer((8,), "int32"), D: T.Buffer((8,), "int32"), s: T.int32, t: T.int32):
        for i in range(8):
            D[i] = s
            C[i] = D[i] + t

    return tp.Rewriter.from_module({"pattern": pattern, "replacement": replacement}, name="sum")


def test_a_skipped_choice_falls_back_to_the_full_search(sum_and_copy):
    from tvm import tirx

    C, D = tirx.decl_buffer((8,), "int32", "C"), tirx.decl_buffer((8,), "int32", "D")
    n, m = tirx.Var("n", "int32"), tirx.Var("m", "int32")
    i = tirx.Var("i", "int32")
    body = tirx.For(i, 0, 8, 0, tirx.SeqStmt([tirx.BufferStore(C, n + m, [i]), tirx.BufferStore(D, m, [i])]))
    f = tirx.PrimFunc([C, D, n, m], body).with_attr("global_symbol", "main")
    new = sum_and_copy(f)
    assert sum_and_copy.report.counts == {"sum": 1}
    assert re.search(r"D\w*\[i\] = m\n", new.script())  # s bound to m: the second operand order
    ex = tvm.compile(tvm.IRModule({"main": new}), target="llvm")
    c, d = tvm.runtime.tensor(np.zeros(8, "int32")), tvm.runtime.tensor(np.zeros(8, "int32"))
    ex["main"](c, d, 5, 7)
    np.testing.assert_array_equal(c.numpy(), np.full(8, 12))
    np.testing.assert_array_equal(d.numpy(), np.full(8, 7))


def _mma_schedule_before_tensorize():
    """TVM's own ldmatrix/mma schedule (``tvm.testing.tir.mma_schedule``, f16 x f16 -> f32),
    stopped before its tensorize calls, which are returned as ``[(loop, intrin)]``."""
    from tvm import s_tir, te
    from tvm.s_tir.tensor_intrin import cuda
    from tvm.testing.tir import mma_schedule

    n = 4096
    a = te.placeholder((n, n), "float16", name="A")
    b = te.placeholder((n, n), "float16", name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k].astype("float32") * b[k, j].astype("float32"), axis=[k]),
                   name="C")

    def layout(i, j):
        return (i // 16, j // 16, *cuda.shared_16x16_to_ldmatrix_32x8_layout(i % 16, j % 16))

    calls = []
    tensorize = s_tir.Schedule.tensorize
    s_tir.Schedule.tensorize = lambda self, loop, intrin, *args, **kwargs: calls.append((loop, intrin))
    try:
        sch = mma_schedule(te.create_prim_func([a, b, c]), 16, "float16", False, [4, 8, 2, 4, 1], [1, 64, 2, 1, 2],
                           [128, 2, 1], layout, layout, layout, cuda.LDMATRIX_f16_A_INTRIN,
                           cuda.LDMATRIX_f16_B_INTRIN, cuda.MMA_f16f16f32_INTRIN, cuda.MMA_fill_16x16_f32_INTRIN,
                           cuda.MMA_store_16x16_f32_global_INTRIN)
    finally:
        s_tir.Schedule.tensorize = tensorize
    return sch, calls


def _ldmatrix_trans_flags(func) -> list:
    return re.findall(r"ldmatrix\((T\.bool\(\w+\))", func.script())


def test_intrinsics_sharing_a_desc_are_told_apart_by_where(intrins):
    """TVM's ldmatrix A and B loads have the same desc and different impls (B's loads
    transposed): tensorize is told which goes where. Composed as they are, the first rule
    takes both sites and says the second never fires; with where= each takes its own load
    and the code has tensorize's ldmatrix flags."""
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.tensor_intrin import cuda

    sch, calls = _mma_schedule_before_tensorize()
    tensorized = sch.copy()
    for loop, intrin in calls:
        tensorized.tensorize(loop, intrin)
    want = _ldmatrix_trans_flags(tensorized.mod["main"])
    assert want == ["T.bool(False)", "T.bool(True)"]

    low = tp.lower(sch.mod)["main"]
    load_a, load_b = (TensorIntrin.get(n) for n in (cuda.LDMATRIX_f16_A_INTRIN, cuda.LDMATRIX_f16_B_INTRIN))
    assert tvm_ffi.structural_equal(load_a.desc, load_b.desc)

    def rule(ti, name, where=None):
        return tp.Rewriter.from_module({"pattern": ti.desc, "replacement": ti.impl}, name, where=where)

    with pytest.warns(UserWarning, match="rule 'load_b' never fires: rule 'load_a' comes first"):
        blind = rule(load_a, "load_a") | rule(load_b, "load_b")
    assert _ldmatrix_trans_flags(blind(low)) == ["T.bool(False)"] * 2
    assert blind.report.counts == {"load_a": 2}

    # the desc names its buffers "shared" and "warp": m["shared"] is the tile being loaded
    told = rule(load_a, "load_a", where=lambda m: m["shared"].name.startswith("A")) | rule(load_b, "load_b")
    assert _ldmatrix_trans_flags(told(low)) == want
    assert told.report.counts == {"load_a": 1, "load_b": 1}
    assert "where() predicate <lambda> is false" in str(tp.explain(rule(load_a, "a", where=lambda m: False), low))
