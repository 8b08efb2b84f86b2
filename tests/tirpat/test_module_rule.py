"""Rules written as TVMScript pattern/replacement pairs (TVM's match_buffer rules)."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given
from hypothesis import strategies as st
from tvm import s_tir, te, tirx
from tvm.script import tirx as T

import tirpat as tp
from tirpat import testing
from tirpat.testing import run

CALLS = []


def strided_view(t, shape, strides):
    """A numpy view of a DLTensor argument (its data pointer includes the view's offset)."""
    import ctypes

    dt = np.dtype(str(t.dtype))
    span = 1 + sum((e - 1) * s for e, s in zip(shape, strides))
    flat = np.frombuffer((ctypes.c_char * (span * dt.itemsize)).from_address(t.data_ptr()), dtype=dt)
    return np.lib.stride_tricks.as_strided(flat, shape, [s * dt.itemsize for s in strides], writeable=True)


@tvm.register_global_func("tests.module_rule.row_add", override=True)
def _row_add(dst, src, n):
    strided_view(dst, (n,), (1,))[...] = strided_view(src, (n,), (1,)) + 1
    CALLS.append(n)


@T.prim_func(s_tir=True)
def row_pattern(a: T.handle, b: T.handle):
    A = T.match_buffer(a, (8,), "int32", offset_factor=1)
    B = T.match_buffer(b, (8,), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(A[0:8])
        T.writes(B[0:8])
        for i in range(8):
            with T.sblock("row"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi] + 1


@T.prim_func(s_tir=True)
def row_replacement(a: T.handle, b: T.handle):
    A = T.match_buffer(a, (8,), "int32", offset_factor=1)
    B = T.match_buffer(b, (8,), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(A[0:8])
        T.writes(B[0:8])
        T.evaluate(T.call_packed("tests.module_rule.row_add", B, A, 8))


def _plus_one(shape, tile):
    A = te.placeholder(shape, "int32", name="A")
    B = te.compute(shape, lambda *idx: A[idx] + 1, name="B")
    sch = s_tir.Schedule(te.create_prim_func([A, B]))
    loops = sch.get_loops(sch.get_sblock("B"))
    sch.split(loops[-1], [None, tile])
    return tp.lower(sch.mod)["main"]


@given(st.integers(1, 3), st.integers(1, 4))
def test_rank_reduction_and_offsets(rows, tiles):
    """A (8,) pattern buffer binds a row piece of a 2-D buffer, at any offset."""
    rw = tp.Rewriter.from_module(tvm.IRModule({"pattern": row_pattern, "replacement": row_replacement}), name="row")
    f = _plus_one((rows, 8 * tiles), 8)
    new = rw(f)
    assert rw.report.counts == {"row": 1}  # one site, run rows * tiles times
    CALLS.clear()
    a = np.arange(rows * 8 * tiles, dtype="int32").reshape(rows, 8 * tiles) * 3
    out = run(new, [a, np.zeros_like(a)])[1]
    np.testing.assert_array_equal(out, a + 1)
    assert len(CALLS) == rows * tiles


@tvm.register_global_func("tests.module_rule.strided_add", override=True)
def _strided_add(dst, src, dst_stride, src_stride):
    strided_view(dst, (8,), (dst_stride,))[...] = strided_view(src, (8,), (src_stride,)) + 1
    CALLS.append(8)


@T.prim_func(s_tir=True)
def strided_row_replacement(a: T.handle, b: T.handle):
    sa = T.int32()
    sb = T.int32()
    A = T.match_buffer(a, (8,), "int32", offset_factor=1, strides=[sa])
    B = T.match_buffer(b, (8,), "int32", offset_factor=1, strides=[sb])
    with T.sblock("root"):
        T.reads(A[0:8])
        T.writes(B[0:8])
        T.evaluate(T.call_packed("tests.module_rule.strided_add", B, A, sb, sa))


@given(st.integers(0, 2), st.lists(st.integers(1, 3), max_size=2), st.booleans())
def test_fixed_dimensions_on_either_side_of_the_row_are_dropped(leading, trailing, strided):
    """A (8,) pattern buffer binds ``B[.., j, ..]`` whatever dimensions fixed in the loop
    surround ``j`` (TVM's match_buffer drops leading ones only). Trailing ones of extent 1
    leave the region compact; wider ones make it a strided column, which only a replacement
    declaring strides takes."""
    shape = (2,) * leading + (16,) + tuple(trailing)
    A = te.placeholder(shape, "int32", name="A")
    B = te.compute(shape, lambda *idx: A[idx] + 1, name="B")
    sch = s_tir.Schedule(te.create_prim_func([A, B]))
    loops = sch.get_loops(sch.get_sblock("B"))
    jo, ji = sch.split(loops[leading], [None, 8])
    sch.reorder(*loops[:leading], jo, *loops[leading + 1:], ji)
    f = tp.lower(sch.mod)["main"]
    rw = tp.Rewriter.from_module({"pattern": row_pattern,
                                  "replacement": strided_row_replacement if strided else row_replacement}, name="row")
    new = rw(f)
    compact = all(t == 1 for t in trailing)
    assert rw.report.counts == ({"row": 1} if strided or compact else {})
    if not rw.report.counts:
        assert "not compact" in str(tp.explain(rw, f))
    a = np.arange(np.prod(shape), dtype="int32").reshape(shape) * 3
    CALLS.clear()
    np.testing.assert_array_equal(run(new, [a, np.zeros_like(a)])[1], a + 1)
    assert len(CALLS) == (a.size // 8 if rw.report.counts else 0)


def test_decorator_form_and_name():
    @tp.rewriter
    class RowAdd:
        pattern = row_pattern
        replacement = row_replacement

    assert isinstance(RowAdd, tp.Rewriter) and RowAdd.rules[0].name == "RowAdd"
    RowAdd(_plus_one((2, 16), 8))
    assert RowAdd.report.counts == {"RowAdd": 1}


def test_where_sees_each_parameter_by_name():
    """``m["A"]`` is the target buffer bound to the pattern's A; the predicate picks sites."""
    seen = []

    @tp.rewriter(where=lambda m: seen.append((m["A"].name, m["B"].name)) or m["A"].name == "C")
    class RowAdd:
        pattern = row_pattern
        replacement = row_replacement

    f = _plus_one((2, 16), 8)
    assert RowAdd(f).same_as(f) and RowAdd.report.counts == {}
    assert seen[0] == ("A", "B")
    assert "where() predicate <lambda> is false" in str(tp.explain(RowAdd, f))
    with pytest.raises(TypeError, match="where expects a callable"):
        tp.Rewriter.from_module({"pattern": row_pattern, "replacement": row_replacement}, where=3)


@given(st.integers(0, 16), st.sampled_from([None, 1]))
def test_loop_start_becomes_the_view_offset(start, step):
    """``for i in range(start, start + 8)`` touches A[start:start + 8]: the view starts there."""
    rw = tp.Rewriter.from_module({"pattern": row_pattern, "replacement": row_replacement}, name="row")
    A = tirx.decl_buffer((24,), "int32", "A")
    B = tirx.decl_buffer((24,), "int32", "B")
    i = tirx.Var("i", "int32")
    store = tirx.BufferStore(B, tirx.BufferLoad(A, [i]) + 1, [i])
    loop = tirx.For(i, start, 8, 0, store, step=None if step is None else tirx.IntImm("int32", step))
    f = tirx.PrimFunc([A, B], loop).with_attr("global_symbol", "main")
    new = rw(f)
    assert rw.report.counts == {"row": 1}
    a = np.arange(24, dtype="int32") * 5
    want = np.full(24, -7, "int32")
    want[start:start + 8] = a[start:start + 8] + 1
    np.testing.assert_array_equal(run(new, [a, np.full(24, -7, "int32")])[1], want)


def test_wrong_extent_or_dtype_does_not_match():
    rw = tp.Rewriter.from_module({"pattern": row_pattern, "replacement": row_replacement})
    f = _plus_one((2, 12), 4)  # tiles of 4, not 8
    rw(f)
    assert rw.report.counts == {}
    assert "expected the constant 8, found 4" in str(tp.explain(rw, f))


@T.prim_func(s_tir=True)
def gemm_desc(a: T.handle, b: T.handle, c: T.handle):
    A = T.match_buffer(a, (4, 4), "int8", offset_factor=1)
    B = T.match_buffer(b, (4, 4), "int8", offset_factor=1)
    C = T.match_buffer(c, (4, 4), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:4, 0:4], A[0:4, 0:4], B[0:4, 0:4])
        T.writes(C[0:4, 0:4])
        for i, j, k in T.grid(4, 4, 4):
            with T.sblock("update"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", B[vj, vk])


@T.prim_func(s_tir=True)
def gemm_impl_strided(a: T.handle, b: T.handle, c: T.handle):
    sa = T.int32()
    sb = T.int32()
    sc = T.int32()
    A = T.match_buffer(a, (4, 4), "int8", offset_factor=1, strides=[sa, 1])
    B = T.match_buffer(b, (4, 4), "int8", offset_factor=1, strides=[sb, 1])
    C = T.match_buffer(c, (4, 4), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads(C[0:4, 0:4], A[0:4, 0:4], B[0:4, 0:4])
        T.writes(C[0:4, 0:4])
        T.evaluate(T.call_packed("tests.module_rule.gemm4", A, B, C, sa, sb, sc))


@T.prim_func(s_tir=True)
def gemm_impl_compact(a: T.handle, b: T.handle, c: T.handle):
    A = T.match_buffer(a, (4, 4), "int8", offset_factor=1)
    B = T.match_buffer(b, (4, 4), "int8", offset_factor=1)
    C = T.match_buffer(c, (4, 4), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:4, 0:4], A[0:4, 0:4], B[0:4, 0:4])
        T.writes(C[0:4, 0:4])
        T.evaluate(T.call_packed("tests.module_rule.gemm4", A, B, C, 4, 4, 4))


@T.prim_func(s_tir=True)
def gemm_impl_scalar(a: T.handle, b: T.handle, c: T.handle):
    A = T.match_buffer(a, (4, 4), "int8", offset_factor=1)
    B = T.match_buffer(b, (4, 4), "int8", offset_factor=1)
    C = T.match_buffer(c, (4, 4), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:4, 0:4], A[0:4, 0:4], B[0:4, 0:4])
        T.writes(C[0:4, 0:4])
        for i, j in T.grid(4, 4):
            with T.sblock("row"):
                vi, vj = T.axis.remap("SS", [i, j])
                C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, 0]) * T.Cast("int32", B[vj, 0]) + T.Cast("int32", A[vi, 1]) * T.Cast("int32", B[vj, 1]) + T.Cast("int32", A[vi, 2]) * T.Cast("int32", B[vj, 2]) + T.Cast("int32", A[vi, 3]) * T.Cast("int32", B[vj, 3])


@tvm.register_global_func("tests.module_rule.gemm4", override=True)
def _gemm4(a, b, c, sa, sb, sc):
    ta = strided_view(a, (4, 4), (sa, 1)).astype("int32")
    tb = strided_view(b, (4, 4), (sb, 1)).astype("int32")
    strided_view(c, (4, 4), (sc, 1))[...] += ta @ tb.T
    CALLS.append("gemm4")


def tiled_matmul(m, n, k, index_dtype="int32"):
    return testing.tiled_matmul(m, n, k, (4, 4, 4), decompose_init=True, index_dtype=index_dtype)


def _check(rw, f, m, n, k):
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a = rng.integers(-128, 128, (m, k), dtype="int8")
    b = rng.integers(-128, 128, (n, k), dtype="int8")
    CALLS.clear()
    out = run(rw(f), [a, b, np.zeros((m, n), "int32")])[2]
    np.testing.assert_array_equal(out, a.astype("int32") @ b.astype("int32").T)


@given(st.sampled_from([4, 8, 12]), st.sampled_from([4, 8]), st.sampled_from([4, 8, 16]),
       st.sampled_from(["int32", "int64"]))
def test_strided_replacement_binds_strides_and_offsets(m, n, k, index_dtype):
    """Also on int64 code (as Relax emits): the int32 rule is converted, as tensorize does."""
    rw = tp.Rewriter.from_module({"pattern": gemm_desc, "replacement": gemm_impl_strided}, name="g")
    f = tiled_matmul(m, n, k, index_dtype)
    _check(rw, f, m, n, k)
    assert rw.report.counts == {"g": 1}
    assert len(CALLS) == (m // 4) * (n // 4) * (k // 4)
    # the DLTensors handed to the call: the bound buffers' data at the regions' offsets, with
    # their row strides, both bound in the site's index type
    arrays = _calls(rw(f), "tirx.tvm_stack_make_array")
    assert len(arrays) == 3 and all(str(e.ty.dtype) == index_dtype for a in arrays
                                    for e in [a.args[2].args[0], a.args[5]])
    assert [a.args[0].args[0].name for a in arrays] == ["A", "B", "C"]


def _calls(func, op):
    found = []
    tvm_ffi.structural_walk(func.body, (tvm.ir.Call, lambda c: found.append(c) if c.op.name == op else None))
    return found


def test_compact_replacement_is_refused_on_a_strided_region():
    rw = tp.Rewriter.from_module({"pattern": gemm_desc, "replacement": gemm_impl_compact}, name="c")
    f = tiled_matmul(8, 8, 8)
    new = rw(f)
    assert rw.report.counts == {}
    assert new.same_as(f)
    text = str(tp.explain(rw, f))
    assert "declares no strides and is used through a pointer" in text and "not compact" in text
    # ... but accepted where the region is compact: a single tile
    _check(rw, tiled_matmul(4, 4, 4), 4, 4, 4)
    assert rw.report.counts == {"c": 1}


def test_scalar_only_replacement_binds_a_non_compact_region():
    rw = tp.Rewriter.from_module({"pattern": gemm_desc, "replacement": gemm_impl_scalar}, name="s")
    _check(rw, tiled_matmul(8, 12, 8), 8, 12, 8)
    assert rw.report.counts == {"s": 1}


@T.prim_func(s_tir=True)
def scale_pattern(a: T.handle, s: T.int32):
    A = T.match_buffer(a, (8,), "int32", offset_factor=1)
    with T.sblock("root"):
        for i in range(8):
            with T.sblock("s"):
                vi = T.axis.remap("S", [i])
                A[vi] = A[vi] * s


@T.prim_func(s_tir=True)
def scale_replacement(a: T.handle, s: T.int32):
    A = T.match_buffer(a, (8,), "int32", offset_factor=1)
    with T.sblock("root"):
        for i in range(8):
            with T.sblock("s"):
                vi = T.axis.remap("S", [i])
                A[vi] = A[vi] * s + 0 * A[vi]


def test_scalar_params_bind_expressions():
    X = tirx.decl_buffer((16,), "int32", "X")
    n = tirx.Var("n", "int32")
    io, i = tirx.Var("io", "int32"), tirx.Var("i", "int32")
    body = tirx.BufferStore(X, tirx.BufferLoad(X, [io * 8 + i]) * (n + 1), [io * 8 + i])
    f = tirx.PrimFunc([X, n], tirx.For(io, 0, 2, 0, tirx.For(i, 0, 8, 0, body))).with_attr("global_symbol", "main")
    rw = tp.Rewriter.from_module({"pattern": scale_pattern, "replacement": scale_replacement}, name="scale")
    new = rw(f)
    assert rw.report.counts == {"scale": 1}
    assert "n + 1" in new.script()
    x = np.arange(16, dtype="int32")
    ex = tvm.compile(tvm.IRModule({"main": new}), target="llvm")
    t = tvm.runtime.tensor(x)
    ex["main"](t, 3)
    np.testing.assert_array_equal(t.numpy(), x * 4)


@T.prim_func(s_tir=True)
def aligned_pattern(a: T.handle, b: T.handle):
    A = T.match_buffer(a, (8,), "int32", offset_factor=8)
    B = T.match_buffer(b, (8,), "int32", offset_factor=8)
    with T.sblock("root"):
        for i in range(8):
            with T.sblock("row"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi] + 1


def test_offset_factor_is_an_alignment_precondition():
    rw = tp.Rewriter.from_module({"pattern": aligned_pattern, "replacement": row_replacement}, name="al")
    A = tirx.decl_buffer((20,), "int32", "A")
    B = tirx.decl_buffer((20,), "int32", "B")
    i = tirx.Var("i", "int32")
    for start, ok in [(8, True), (4, False)]:
        body = tirx.For(i, 0, 8, 0, tirx.BufferStore(B, tirx.BufferLoad(A, [i + start]) + 1, [i + start]))
        rw(body)
        assert (rw.report.counts == {"al": 1}) == ok
    assert "offset_factor 8" in str(tp.explain(rw, body))


def test_bad_modules_raise_clear_errors():
    with pytest.raises(ValueError, match="no PrimFunc 'replacement'"):
        tp.Rewriter.from_module(tvm.IRModule({"pattern": row_pattern}))
    with pytest.raises(TypeError, match="IRModule"):
        tp.Rewriter.from_module(42)
    with pytest.raises(ValueError, match="pattern has 2 parameters, replacement 3"):
        tp.Rewriter.from_module({"pattern": row_pattern, "replacement": gemm_desc})
    with pytest.raises(TypeError, match="decorates a class"):
        tp.rewriter(3)


def test_decorator_on_a_class_of_tvmscript_methods():
    @tp.rewriter
    class RowAddMethods:
        @T.prim_func(s_tir=True)
        def pattern(a: T.handle, b: T.handle):
            A = T.match_buffer(a, (8,), "int32", offset_factor=1)
            B = T.match_buffer(b, (8,), "int32", offset_factor=1)
            with T.sblock("root"):
                T.reads(A[0:8])
                T.writes(B[0:8])
                for i in range(8):
                    with T.sblock("row"):
                        vi = T.axis.remap("S", [i])
                        B[vi] = A[vi] + 1

        @T.prim_func(s_tir=True)
        def replacement(a: T.handle, b: T.handle):
            A = T.match_buffer(a, (8,), "int32", offset_factor=1)
            B = T.match_buffer(b, (8,), "int32", offset_factor=1)
            with T.sblock("root"):
                T.reads(A[0:8])
                T.writes(B[0:8])
                T.evaluate(T.call_packed("tests.module_rule.row_add", B, A, 8))

    assert RowAddMethods.rules[0].name == "RowAddMethods"
    f = _plus_one((2, 16), 8)
    CALLS.clear()
    a = np.arange(32, dtype="int32").reshape(2, 16)
    out = run(RowAddMethods(f), [a, np.zeros_like(a)])[1]
    np.testing.assert_array_equal(out, a + 1)
    assert len(CALLS) == 4


def test_a_scalar_bound_to_a_matched_loop_is_refused():
    """``A[i] * i`` fits ``A[vi] * s`` with ``s = i``, but ``i`` is gone after the rewrite."""
    X = tirx.decl_buffer((16,), "int32", "X")
    io, i = tirx.Var("io", "int32"), tirx.Var("i", "int32")
    body = tirx.BufferStore(X, tirx.BufferLoad(X, [io * 8 + i]) * i, [io * 8 + i])
    f = tirx.PrimFunc([X], tirx.For(io, 0, 2, 0, tirx.For(i, 0, 8, 0, body))).with_attr("global_symbol", "main")
    rw = tp.Rewriter.from_module({"pattern": scale_pattern, "replacement": scale_replacement}, name="scale")
    assert rw(f).same_as(f) and rw.report.counts == {}
    assert "uses a loop of the match" in str(tp.explain(rw, f))


@T.prim_func(s_tir=True)
def gather_pattern(a: T.handle, b: T.handle, s: T.int32):
    A = T.match_buffer(a, (8,), "int32", offset_factor=1)
    B = T.match_buffer(b, (8,), "int32", offset_factor=1)
    with T.sblock("root"):
        for i in range(8):
            with T.sblock("g"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi] * s


@T.prim_func(s_tir=True)
def gather_replacement(a: T.handle, b: T.handle, s: T.int32):
    """Also uses ``s`` as a loop bound (an index), so on int64 code it would have to be
    int64 here and int32 (a value) in the pattern. (Matched, never run.)"""
    A = T.match_buffer(a, (8,), "int32", offset_factor=1)
    B = T.match_buffer(b, (8,), "int32", offset_factor=1)
    with T.sblock("root"):
        for i in range(8):
            with T.sblock("g"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi] * s
        for r in range(T.max(s, 0)):
            T.evaluate(T.call_extern("int32", "tirpat_test_trace", r))


def test_a_scalar_typed_differently_after_conversion_refuses_int64_code():
    rw = tp.Rewriter.from_module({"pattern": gather_pattern, "replacement": gather_replacement}, name="g")
    for dtype, fires in (("int32", True), ("int64", False)):
        A, B = (tirx.decl_buffer((tirx.IntImm(dtype, 8),), "int32", n) for n in "AB")
        s = tirx.Var("s", "int32")
        i = tirx.Var("i", dtype)
        body = tirx.For(i, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, 8), 0,
                        tirx.BufferStore(B, tirx.BufferLoad(A, [i]) * s, [i]))
        f = tirx.PrimFunc([A, B, s], body).with_attr("global_symbol", "main")
        rw(f)
        assert rw.report.counts == ({"g": 1} if fires else {}), dtype
    assert "scalar parameter s would be int32 in the pattern but int64 in the replacement" in str(tp.explain(rw, f))


def test_a_scalar_bound_to_a_loop_extent_is_widened_in_the_replacement_too():
    """A vector length: a loop extent in the pattern (an index), a call argument in the
    replacement (a value). On int64 code it is bound to an int64 extent, so the replacement
    takes it as int64 as well."""
    n, i = tirx.Var("n", "int32"), tirx.Var("i", "int32")
    a, b = (tirx.decl_buffer((16,), "int8", name) for name in "ab")
    pattern = tirx.PrimFunc([a, b, n], tirx.For(i, 0, n, 0, tirx.BufferStore(b, a[i], [i])))
    replacement = pattern.with_body(tirx.Evaluate(tirx.call_extern("int32", "copy_n", a.data, b.data, n)))
    rw = tp.Rewriter.from_module({"pattern": pattern, "replacement": replacement}, name="copy_n")
    for dtype in ("int32", "int64"):
        A, B = (tirx.decl_buffer((tirx.IntImm(dtype, 16),), "int8", name) for name in "AB")
        j, m = tirx.Var("j", dtype), tirx.Var("m", dtype)
        f = tirx.PrimFunc([A, B, m], tirx.For(j, tirx.IntImm(dtype, 0), tirx.min(m, tirx.IntImm(dtype, 16)), 0,
                                              tirx.BufferStore(B, A[j], [j]))).with_attr("global_symbol", "main")
        call = rw(f).body
        assert rw.report.counts == {"copy_n": 1}, dtype
        length = call.value.args[-1]
        assert str(length.ty.dtype) == dtype and "m" in str(length), (dtype, length)


@T.prim_func(s_tir=True)
def marked_copy_pattern(a: T.handle, b: T.handle):
    A = T.match_buffer(a, (8,), "int32", offset_factor=1)
    B = T.match_buffer(b, (8,), "int32", offset_factor=1)
    with T.sblock("root"):
        T.evaluate(T.call_extern("int32", "mark"))
        for i in range(8):
            with T.sblock("c"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi]


@T.prim_func(s_tir=True)
def marked_copy_replacement(a: T.handle, b: T.handle):
    A = T.match_buffer(a, (8,), "int32", offset_factor=1)
    B = T.match_buffer(b, (8,), "int32", offset_factor=1)
    with T.sblock("root"):
        T.evaluate(T.call_extern("int32", "mark"))
        for i in range(8):
            with T.sblock("c"):
                vi = T.axis.remap("S", [i])
                B[vi] = A[vi] + 0 * B[vi]


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_a_pattern_starting_with_an_evaluate_matches_in_either_index_type(dtype):
    """The site's index type comes from its first loop, past the leading T.evaluate."""
    rw = tp.Rewriter.from_module({"pattern": marked_copy_pattern, "replacement": marked_copy_replacement}, name="m")
    A, B = (tirx.decl_buffer((tirx.IntImm(dtype, 8),), "int32", n) for n in "AB")
    i = tirx.Var("i", dtype)
    body = tirx.SeqStmt([tirx.Evaluate(tirx.call_extern("int32", "mark")),
                         tirx.For(i, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, 8), 0,
                                  tirx.BufferStore(B, tirx.BufferLoad(A, [i]), [i]))])
    rw(tirx.PrimFunc([A, B], body).with_attr("global_symbol", "main"))
    assert rw.report.counts == {"m": 1}


def test_where_sees_the_enclosing_loops_on_every_search_path():
    """The full search (run after a skipped commutative choice) gives where() the same
    context as the first-match search: a rule for top-level sites never fires in a nest."""
    seen = []
    rw = tp.Rewriter.from_module({"pattern": gemm_desc, "replacement": gemm_impl_strided}, name="g",
                                 where=lambda m: seen.append(len(m.context)) or not m.context)
    f = tiled_matmul(8, 8, 8)
    assert rw(f).same_as(f) and rw.report.counts == {}
    assert seen and set(seen) == {3}


def test_same_pattern_with_other_replacement_declarations_is_not_called_dead():
    """gemm_impl_compact refuses strided tiles that gemm_impl_strided takes: no warning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rw = (tp.Rewriter.from_module({"pattern": gemm_desc, "replacement": gemm_impl_compact}, name="compact")
              | tp.Rewriter.from_module({"pattern": gemm_desc, "replacement": gemm_impl_strided}, name="strided"))
    rw(tiled_matmul(8, 8, 8))
    assert rw.report.counts == {"strided": 1}


def test_an_int64_rule_is_not_narrowed_for_int32_code():
    rw = tp.Rewriter.from_module({"pattern": tp.lower(te.create_prim_func(_row_add_te("int64"))),
                                  "replacement": tp.lower(te.create_prim_func(_row_add_te("int64")))}, name="r64")
    f = tp.lower(te.create_prim_func(_row_add_te("int32")))
    assert rw(f).same_as(f) and rw.report.counts == {}
    assert "indexes in int64 and is not narrowed to int32" in str(tp.explain(rw, f))


def _row_add_te(dtype):
    n = tirx.IntImm(dtype, 8)
    A = te.placeholder((n,), "int32", name="A")
    return [A, te.compute((n,), lambda i: A[i] + 1, name="B")]


# -- guards: the partial last tile of a split ----------------------------------------------
@tvm.register_global_func("tests.module_rule.add_n", override=True)
def _add_n(dst, src, n):
    """``dst[i] = src[i] + 1`` for the lanes ``i < n`` of 8 (a vector length, RISC-V V's ``vl``)."""
    n = min(max(int(n), 0), 8)
    strided_view(dst, (8,), (1,))[:n] = strided_view(src, (8,), (1,))[:n] + 1
    CALLS.append(n)


GUARDED = tvm.script.from_source("""
@I.ir_module
class Guarded:
    @T.prim_func
    def up_to_n(A: T.Buffer((8,), "int32"), B: T.Buffer((8,), "int32"), n: T.int32):
        for i in range(n):
            B[i] = A[i] + 1

    @T.prim_func
    def guarded(A: T.Buffer((8,), "int32"), B: T.Buffer((8,), "int32"), n: T.int32):
        for i in range(8):
            if i < n:
                B[i] = A[i] + 1

    @T.prim_func
    def call(A: T.Buffer((8,), "int32", offset_factor=1), B: T.Buffer((8,), "int32", offset_factor=1), n: T.int32):
        T.evaluate(T.call_packed("tests.module_rule.add_n", B, A, n))
""")


@given(st.integers(1, 40), st.sampled_from(["up_to_n", "guarded"]))
def test_a_guard_on_the_tile_binds_the_vector_length(length, form):
    """A split leaves ``for i in range(8): if 8*o + i < L: ...`` for the last, partial tile.
    Relative to the tile that guard is ``i < L - 8*o``: it matches a pattern's guard
    ``i < n`` (``n`` bound to ``L - 8*o``, the tile base moved across, as indices do) and a
    pattern loop ``for i in range(n)`` (``n`` bound to ``min(8, L - 8*o)``)."""
    rw = tp.Rewriter.from_module({"pattern": GUARDED[form], "replacement": GUARDED["call"]}, name=form)
    f = _plus_one((length,), 8)
    new = rw(f)
    # the guarded pattern is not a tile without its guard (every length a multiple of 8)
    assert rw.report.counts == ({} if form == "guarded" and length % 8 == 0 else {form: 1})
    CALLS.clear()
    a = np.arange(length, dtype="int32") * 7
    np.testing.assert_array_equal(run(new, [a, np.zeros_like(a)])[1], a + 1)
    if rw.report.counts:
        assert sorted(CALLS) == sorted([8] * (length // 8) + ([length % 8] if length % 8 else []))
    if form == "up_to_n" and length % 8 and length > 8:    # the bound vector length, never past the tile
        assert "T.min(8, " in new.script()
