"""End to end: TensorIntrin-style rules rewriting scheduled workloads, compiled on llvm.

Two rules, each checked bit-exact against numpy on hypothesis-drawn inputs, with the number
of calls of the replacement's packed function:

- TVM's registered ``dot_16x4_vnni`` desc (``C[16] += A[4] . B[16, 4]``, u8 x i8 -> i32) on
  topi's ``nn.dense``, scheduled with ``s_tir.Schedule`` (j split by 16, k by 4, init
  decomposed), with the replacement a packed function computing the 16x4 dot with numpy;
- a 16x16x16 int8 GEMM tile written here as TVMScript, on ``tirpat.testing.tiled_matmul``.

Each binding rule has a test that fails if it breaks: rank reduction (a (4,) desc buffer
binds a row of the 2-D data, a (16, 4) one a tile of the 4-D packed weight), region offsets
(results), strides (declared symbolic strides are bound, a wrong constant stride refuses the
site, and explain says why), and scalars (strides, offsets and a zero point passed on).
"""

import ctypes
import re

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import s_tir, te, topi
from tvm.script import tirx as T

import tirpat as tp
from tirpat import testing

CALLS = []


def strided_view(ptr, dtype, shape, strides):
    """A writable numpy view of ``shape`` elements at address ``ptr`` (element strides)."""
    dt = np.dtype(dtype)
    span = 1 + sum((e - 1) * s for e, s in zip(shape, strides))
    flat = np.frombuffer((ctypes.c_char * (span * dt.itemsize)).from_address(ptr), dtype=dt)
    return np.lib.stride_tricks.as_strided(flat, shape, [s * dt.itemsize for s in strides], writeable=True)


def tensor_view(t, shape, strides):
    """A view of a DLTensor argument (its data pointer already includes the view's offset)."""
    return strided_view(t.data_ptr(), str(t.dtype), shape, strides)


def pointer_view(p, offset, dtype, shape, strides):
    """A view of a raw ``T.handle`` argument plus an element offset."""
    return strided_view(p.value + offset * np.dtype(dtype).itemsize, dtype, shape, strides)


@pytest.fixture(scope="module")
def x86_intrins():
    """TVM's registered x86 TensorIntrins; the import parses all of them (about 40 s), once."""
    import tvm.s_tir.tensor_intrin.x86  # noqa: F401

    return s_tir.TensorIntrin


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


# --------------------------------------------------------------------------------------
# dot_16x4_vnni on topi's nn.dense
# --------------------------------------------------------------------------------------


@tvm.register_global_func("tests.intrin_e2e.dot16x4", override=True)
def _dot16x4(a, b, c, sb):
    av = tensor_view(a, (4,), (1,)).astype("int32")
    bv = tensor_view(b, (16, 4), (sb, 1)).astype("int32")
    tensor_view(c, (16,), (1,))[...] += bv @ av
    CALLS.append(sb)


def _dot16x4_impl(b_strides):
    """The replacement: one packed call per 16x4 dot; B declares ``b_strides``."""
    sb = b_strides[0]

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        A = T.match_buffer(a, (4,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (16, 4), "int8", offset_factor=1, strides=b_strides)
        C = T.match_buffer(c, (16,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            T.evaluate(T.call_packed("tests.intrin_e2e.dot16x4", A, B, C, sb))

    return impl


def _symbolic_stride_impl():
    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle):
        sb = T.int32()
        A = T.match_buffer(a, (4,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (16, 4), "int8", offset_factor=1, strides=[sb, 1])
        C = T.match_buffer(c, (16,), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:16], A[0:4], B[0:16, 0:4])
            T.writes(C[0:16])
            T.evaluate(T.call_packed("tests.intrin_e2e.dot16x4", A, B, C, sb))

    return impl


def vnni_dense(m, n, k, packed):
    """topi ``nn.dense(X_u8, W_i8, out_dtype="int32")`` scheduled for the 16x4 dot.

    ``packed``: the weight parameter is laid out ``[n/16, k/4, 16, 4]`` as in TVM's VNNI
    tests (an inlined unpacking stage feeds topi's dense), so a 16x4 tile of it is compact;
    otherwise it is topi's plain ``[n, k]`` weight and a tile has row stride ``k``.
    """
    X = te.placeholder((m, k), "uint8", name="X")
    if packed:
        PW = te.placeholder((n // 16, k // 4, 16, 4), "int8", name="PW")
        W = te.compute((n, k), lambda j, r: PW[j // 16, r // 4, j % 16, r % 4], name="W")
    else:
        PW = W = te.placeholder((n, k), "int8", name="W")
    D = topi.nn.dense(X, W, out_dtype="int32")
    sch = s_tir.Schedule(te.create_prim_func([X, PW, D]))
    if packed:
        sch.compute_inline(sch.get_sblock("W"))
    blk = sch.get_sblock("T_matmul_NT")
    i, j, r = sch.get_loops(blk)
    jo, ji = sch.split(j, [None, 16])
    ro, ri = sch.split(r, [None, 4])
    sch.reorder(i, jo, ro, ji, ri)
    sch.decompose_reduction(blk, ro)
    return sch.mod


def pack_weight(w):
    n, k = w.shape
    return np.ascontiguousarray(w.reshape(n // 16, 16, k // 4, 4).transpose(0, 2, 1, 3))


_RULES: dict = {}
_EXECS: dict = {}


def _vnni_rule(x86, impl_name):
    if impl_name not in _RULES:
        desc = x86.get("dot_16x4_vnni").desc
        impl = _symbolic_stride_impl() if impl_name == "symbolic" else _dot16x4_impl([4, 1])
        rw = tp.Rewriter.from_module({"pattern": desc, "replacement": impl}, name="dot16x4")
        tp.register_pipeline(f"tests.intrin_e2e.{impl_name}", rw)
        _RULES[impl_name] = rw
    return _RULES[impl_name]


def _vnni_exec(x86, m, n, k, packed):
    """Compiled through the registered tirpat pipeline (cached per shape)."""
    ck = ("vnni", m, n, k, packed)
    if ck not in _EXECS:
        _vnni_rule(x86, "symbolic")
        _EXECS[ck] = tvm.compile(vnni_dense(m, n, k, packed), target="llvm", tir_pipeline="tests.intrin_e2e.symbolic")
    return _EXECS[ck]


def _run(ex, arrays):
    tensors = [tvm.runtime.tensor(np.array(a, copy=True)) for a in arrays]
    CALLS.clear()
    ex["main"](*tensors)
    return [t.numpy() for t in tensors]


def _u8i8(data, m, n, k, x_max=255):
    x = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(x)
    style = data.draw(st.sampled_from(["random", "extreme"]), label="values")
    if style == "extreme":  # the largest products, all of one sign
        return np.full((m, k), x_max, "uint8"), np.full((n, k), -128, "int8")
    return rng.integers(0, x_max + 1, (m, k), dtype="uint8"), rng.integers(-128, 128, (n, k), dtype="int8")


@given(st.integers(1, 3), st.sampled_from([16, 32]), st.sampled_from([4, 8, 16, 32]), st.booleans(), st.data())
def test_vnni_desc_on_topi_dense(x86_intrins, m, n, k, packed, data):
    """The registered desc fits topi's dense: one site, m*(n/16)*(k/4) calls, exact results."""
    rw = _vnni_rule(x86_intrins, "symbolic")
    low = tp.lower(vnni_dense(m, n, k, packed))["main"]
    rw(low)
    assert rw.report.counts == {"dot16x4": 1}
    x, w = _u8i8(data, m, n, k)
    ex = _vnni_exec(x86_intrins, m, n, k, packed)
    out = _run(ex, [x, pack_weight(w) if packed else w, np.zeros((m, n), "int32")])[2]
    np.testing.assert_array_equal(out, x.astype("int32") @ w.astype("int32").T)
    assert len(CALLS) == m * (n // 16) * (k // 4)
    # The symbolic stride of B is bound per site: 4 in the packed layout, the row length k otherwise.
    assert set(CALLS) == {4 if packed else k}


def test_vnni_rank_reduction_binds_rows_and_packed_tiles(x86_intrins):
    """A (4,) buffer binds a row piece of 2-D X; the (16, 4) one a tile of 4-D PW."""
    rw = _vnni_rule(x86_intrins, "symbolic")
    low = tp.lower(vnni_dense(2, 32, 16, True))["main"]
    text = rw(low).script()
    # each parameter's DLTensor is made from the bound buffer's data at the region's offset
    assert re.search(r'T\.tvm_stack_make_array\(X\.data, T\.tvm_stack_make_shape\(4\), 0, 1, T\.uint8\(0\), '
                     r'i0 \* 16 \+ k_0 \* 4\)', text), text
    assert re.search(r'T\.tvm_stack_make_array\(PW\.data, T\.tvm_stack_make_shape\(16, 4\), T\.tvm_stack_make_shape\(4, 1\), '
                     r'2, T\.int8\(0\), i1_0 \* 256 \+ k_0 \* 64\)', text), text
    assert re.search(r'"tests\.intrin_e2e\.dot16x4", .*, 4\)$', text, re.M), text  # sb bound to 4


def test_vnni_wrong_constant_stride_is_refused(x86_intrins):
    """An impl that declares the packed layout's stride 4 fits the packed weight only."""
    rw = _vnni_rule(x86_intrins, "const4")
    plain = tp.lower(vnni_dense(2, 32, 16, False))["main"]
    new = rw(plain)
    assert rw.report.counts == {}
    assert new.same_as(plain)
    assert ("replacement parameter B declares stride 4 in dimension 0, but the region of W has stride 16"
            in str(tp.explain(rw, plain)))

    packed = tp.lower(vnni_dense(2, 32, 16, True))["main"]
    new = rw(packed)
    assert rw.report.counts == {"dot16x4": 1}
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, (2, 16), dtype="uint8")
    w = rng.integers(-128, 128, (32, 16), dtype="int8")
    CALLS.clear()
    out = testing.run(new, [x, pack_weight(w), np.zeros((2, 32), "int32")])[2]
    np.testing.assert_array_equal(out, x.astype("int32") @ w.astype("int32").T)
    assert CALLS == [4] * (2 * 2 * 4)


@pytest.mark.skipif("avx512bw" not in _cpu_flags(), reason="needs AVX-512BW")
def test_tvm_avx512_impl_end_to_end(x86_intrins):
    """TVM's own registered pair (desc + the AVX-512 impl with vector loads), no tensorize.

    The impl reads B with one 64-lane load, right only on a compact tile: the packed
    weight is rewritten and exact; the plain weight (row stride k) is refused.
    (``dot_16x4_vnni``'s impl does not pass LLVM's verifier in this TVM build, so the
    AVX-512 one, same desc, is used; it saturates int16 pairs, hence x < 128.)
    """
    intrin = x86_intrins.get("dot_16x4_avx512")
    rw = tp.Rewriter.from_module({"pattern": intrin.desc, "replacement": intrin.impl}, name="avx512")
    m, n, k = 3, 32, 16
    rng = np.random.default_rng(3)
    x = rng.integers(0, 128, (m, k), dtype="uint8")
    w = rng.integers(-128, 128, (n, k), dtype="int8")
    new = rw(tp.lower(vnni_dense(m, n, k, True))["main"])
    assert rw.report.counts == {"avx512": 1}
    ex = tvm.compile(tvm.IRModule({"main": new}), target={"kind": "llvm", "mcpu": "skylake-avx512"})
    out = _run(ex, [x, pack_weight(w), np.zeros((m, n), "int32")])[2]
    np.testing.assert_array_equal(out, x.astype("int32") @ w.astype("int32").T)

    plain = tp.lower(vnni_dense(m, n, k, False))["main"]
    assert rw(plain).same_as(plain) and rw.report.counts == {}
    assert "region of W is not compact" in str(tp.explain(rw, plain))


# --------------------------------------------------------------------------------------
# a 16x16x16 int8 GEMM tile on tiled_matmul
# --------------------------------------------------------------------------------------


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
    """Raw pointers, element offsets and row strides: every one a scalar bound per site."""
    sa = T.int32()
    sb = T.int32()
    sc = T.int32()
    oa = T.int32()
    ob = T.int32()
    oc = T.int32()
    A = T.match_buffer(a, (16, 16), "int8", offset_factor=1, strides=[sa, 1], elem_offset=oa)
    B = T.match_buffer(b, (16, 16), "int8", offset_factor=1, strides=[sb, 1], elem_offset=ob)
    C = T.match_buffer(c, (16, 16), "int32", offset_factor=1, strides=[sc, 1], elem_offset=oc)
    with T.sblock("root"):
        T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
        T.writes(C[0:16, 0:16])
        T.evaluate(T.call_packed("tests.intrin_e2e.gemm16", A.data, oa, sa, B.data, ob, sb, C.data, oc, sc))


@T.prim_func(s_tir=True)
def gemm16_impl_const_stride(a: T.handle, b: T.handle, c: T.handle):
    """Assumes A is a tile of a 16-wide matrix (row stride 16)."""
    sb = T.int32()
    sc = T.int32()
    A = T.match_buffer(a, (16, 16), "int8", offset_factor=1, strides=[16, 1])
    B = T.match_buffer(b, (16, 16), "int8", offset_factor=1, strides=[sb, 1])
    C = T.match_buffer(c, (16, 16), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
        T.writes(C[0:16, 0:16])
        T.evaluate(T.call_packed("tests.intrin_e2e.gemm16_dl", A, B, C, 16, sb, sc, 0))


@tvm.register_global_func("tests.intrin_e2e.gemm16", override=True)
def _gemm16(pa, oa, sa, pb, ob, sb, pc, oc, sc):
    a = pointer_view(pa, oa, "int8", (16, 16), (sa, 1)).astype("int32")
    b = pointer_view(pb, ob, "int8", (16, 16), (sb, 1)).astype("int32")
    pointer_view(pc, oc, "int32", (16, 16), (sc, 1))[...] += a @ b.T
    CALLS.append((oa, ob, oc))


@tvm.register_global_func("tests.intrin_e2e.gemm16_dl", override=True)
def _gemm16_dl(a, b, c, sa, sb, sc, zp):
    av = tensor_view(a, (16, 16), (sa, 1)).astype("int32") - zp
    bv = tensor_view(b, (16, 16), (sb, 1)).astype("int32")
    tensor_view(c, (16, 16), (sc, 1))[...] += av @ bv.T
    CALLS.append(zp)


def _gemm_exec(m, n, k):
    ck = ("gemm16", m, n, k)
    if ck not in _EXECS:
        rw = tp.Rewriter.from_module({"pattern": gemm16_desc, "replacement": gemm16_impl}, name="gemm16")
        new = rw(testing.tiled_matmul(m, n, k, (16, 16, 16), decompose_init=True))
        assert rw.report.counts == {"gemm16": 1}
        _EXECS[ck] = tvm.compile(tvm.IRModule({"main": new}), target="llvm")
    return _EXECS[ck]


def _i8(data, *shape):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    return rng.integers(-128, 128, shape, dtype="int8")


@given(st.sampled_from([16, 32, 48]), st.sampled_from([16, 32]), st.sampled_from([16, 32, 48]), st.data())
def test_gemm16_tile_rule_on_tiled_matmul(m, n, k, data):
    ex = _gemm_exec(m, n, k)
    a, b = _i8(data, m, k), _i8(data, n, k)
    out = _run(ex, [a, b, np.zeros((m, n), "int32")])[2]
    np.testing.assert_array_equal(out, a.astype("int32") @ b.astype("int32").T)
    tiles = (m // 16) * (n // 16) * (k // 16)
    assert len(CALLS) == tiles
    # each tile's element offsets were bound to its own region: every tile exactly once
    expected = {(io * 16 * k + ko * 16, jo * 16 * k + ko * 16, io * 16 * n + jo * 16)
                for io in range(m // 16) for jo in range(n // 16) for ko in range(k // 16)}
    assert set(CALLS) == expected


def test_gemm16_wrong_constant_stride_is_refused():
    rw = tp.Rewriter.from_module({"pattern": gemm16_desc, "replacement": gemm16_impl_const_stride}, name="g16c")
    f = testing.tiled_matmul(32, 16, 32, (16, 16, 16), decompose_init=True)
    assert rw(f).same_as(f) and rw.report.counts == {}
    assert ("replacement parameter A declares stride 16 in dimension 0, but the region of A has stride 32"
            in str(tp.explain(rw, f)))
    # where A is 16 wide the declared stride is right, and the rule fires
    f16 = testing.tiled_matmul(32, 32, 16, (16, 16, 16), decompose_init=True)
    new = rw(f16)
    assert rw.report.counts == {"g16c": 1}
    rng = np.random.default_rng(5)
    a, b = rng.integers(-128, 128, (32, 16), dtype="int8"), rng.integers(-128, 128, (32, 16), dtype="int8")
    CALLS.clear()
    out = testing.run(new, [a, b, np.zeros((32, 32), "int32")])[2]
    np.testing.assert_array_equal(out, a.astype("int32") @ b.astype("int32").T)
    assert len(CALLS) == 4


@T.prim_func(s_tir=True)
def gemm16_zp_desc(a: T.handle, b: T.handle, c: T.handle, zp: T.int32):
    A = T.match_buffer(a, (16, 16), "int8", offset_factor=1)
    B = T.match_buffer(b, (16, 16), "int8", offset_factor=1)
    C = T.match_buffer(c, (16, 16), "int32", offset_factor=1)
    with T.sblock("root"):
        for i, j, k in T.grid(16, 16, 16):
            with T.sblock("update"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                C[vi, vj] = C[vi, vj] + (T.Cast("int32", A[vi, vk]) - zp) * T.Cast("int32", B[vj, vk])


@T.prim_func(s_tir=True)
def gemm16_zp_impl(a: T.handle, b: T.handle, c: T.handle, zp: T.int32):
    sa = T.int32()
    sb = T.int32()
    sc = T.int32()
    A = T.match_buffer(a, (16, 16), "int8", offset_factor=1, strides=[sa, 1])
    B = T.match_buffer(b, (16, 16), "int8", offset_factor=1, strides=[sb, 1])
    C = T.match_buffer(c, (16, 16), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
        T.writes(C[0:16, 0:16])
        T.evaluate(T.call_packed("tests.intrin_e2e.gemm16_dl", A, B, C, sa, sb, sc, zp))


def zero_point_matmul(m, n, k):
    """``C = (A - zp) x B^T`` with ``zp`` a runtime parameter, tiled 16x16x16."""
    A = te.placeholder((m, k), "int8", name="A")
    B = te.placeholder((n, k), "int8", name="B")
    zp = te.var("zp", "int32")
    r = te.reduce_axis((0, k), "k")
    C = te.compute((m, n), lambda i, j: te.sum((A[i, r].astype("int32") - zp) * B[j, r].astype("int32"), axis=r),
                   name="C")
    sch = s_tir.Schedule(te.create_prim_func([A, B, C, zp]))
    blk = sch.get_sblock("C")
    sch.decompose_reduction(blk, testing.tile_gemm(sch, blk)[2])
    return tp.lower(sch.mod)["main"]


@given(st.sampled_from([(16, 16, 32), (32, 16, 16)]), st.integers(-128, 127), st.data())
def test_scalar_param_binds_the_zero_point(shape, zp, data):
    """A scalar of the pattern binds the function's runtime ``zp``; the impl receives it."""
    m, n, k = shape
    ck = ("zp", m, n, k)
    if ck not in _EXECS:
        rw = tp.Rewriter.from_module({"pattern": gemm16_zp_desc, "replacement": gemm16_zp_impl}, name="zp")
        new = rw(zero_point_matmul(m, n, k))
        assert rw.report.counts == {"zp": 1}
        # strides bound to constants, the zero point to the function's own parameter
        assert re.search(rf", {k}, {k}, {n}, zp\)$", new.script(), re.M), new.script()
        _EXECS[ck] = tvm.compile(tvm.IRModule({"main": new}), target="llvm")
    a, b = _i8(data, m, k), _i8(data, n, k)
    c = tvm.runtime.tensor(np.zeros((m, n), "int32"))
    CALLS.clear()
    _EXECS[ck]["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c, zp)
    np.testing.assert_array_equal(c.numpy(), (a.astype("int32") - zp) @ b.astype("int32").T)
    assert CALLS == [zp] * ((m // 16) * (n // 16) * (k // 16))


# --------------------------------------------------------------------------------------
# int64 code from Relax: an int32 desc on a legalized R.matmul, through relax's build
# --------------------------------------------------------------------------------------


@T.prim_func(s_tir=True)
def gemm16_kn_desc(a: T.handle, b: T.handle, c: T.handle):
    A = T.match_buffer(a, (16, 16), "int8", offset_factor=1)
    B = T.match_buffer(b, (16, 16), "int8", offset_factor=1)
    C = T.match_buffer(c, (16, 16), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
        T.writes(C[0:16, 0:16])
        for i, j, k in T.grid(16, 16, 16):
            with T.sblock("update"):
                vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                C[vi, vj] = C[vi, vj] + T.Cast("int32", A[vi, vk]) * T.Cast("int32", B[vk, vj])


@T.prim_func(s_tir=True)
def gemm16_kn_impl(a: T.handle, b: T.handle, c: T.handle):
    sa = T.int32()
    sb = T.int32()
    sc = T.int32()
    A = T.match_buffer(a, (16, 16), "int8", offset_factor=1, strides=[sa, 1])
    B = T.match_buffer(b, (16, 16), "int8", offset_factor=1, strides=[sb, 1])
    C = T.match_buffer(c, (16, 16), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads(C[0:16, 0:16], A[0:16, 0:16], B[0:16, 0:16])
        T.writes(C[0:16, 0:16])
        T.evaluate(T.call_packed("tests.intrin_e2e.gemm16_kn", A, B, C, sa, sb, sc))


@tvm.register_global_func("tests.intrin_e2e.gemm16_kn", override=True)
def _gemm16_kn(a, b, c, sa, sb, sc):
    av = tensor_view(a, (16, 16), (sa, 1)).astype("int32")
    bv = tensor_view(b, (16, 16), (sb, 1)).astype("int32")
    tensor_view(c, (16, 16), (sc, 1))[...] += av @ bv
    CALLS.append((sa, sb, sc))


def relax_matmul(m, n, k):
    """``R.matmul(x, w, out_dtype="int32")`` (x: (m, k), w: (k, n), int8) legalized by
    Relax (int64 loops and indices) and its PrimFunc tiled 16x16x16."""
    sch = s_tir.Schedule(testing.legalized_matmul(m, n, k))
    sch.work_on("matmul")
    blk = sch.get_sblock("matmul")
    sch.decompose_reduction(blk, testing.tile_gemm(sch, blk)[2])
    return sch.mod


def _relax_exec(m, n, k):
    ck = ("relax", m, n, k)
    if ck not in _EXECS:
        if "kn" not in _RULES:
            _RULES["kn"] = tp.Rewriter.from_module({"pattern": gemm16_kn_desc, "replacement": gemm16_kn_impl},
                                                   name="gemm16_kn")
            tp.register_pipeline("tests.intrin_e2e.kn", _RULES["kn"])
        _EXECS[ck] = tvm.compile(relax_matmul(m, n, k), target="llvm", tir_pipeline="tests.intrin_e2e.kn")
    return _EXECS[ck]


@given(st.sampled_from([16, 32]), st.sampled_from([16, 48]), st.sampled_from([16, 32]), st.data())
def test_int32_desc_on_relax_int64_matmul_end_to_end(m, n, k, data):
    """Relax indexes in int64, the desc in int32: the rule is converted (as tensorize
    converts an intrinsic), fires once, and the VM's result is exact, one call per tile."""
    from tvm import relax

    low = tp.lower(relax_matmul(m, n, k))["matmul"]
    assert "T.int64(16)" in low.script()
    ex = _relax_exec(m, n, k)
    assert _RULES["kn"].report.counts == {"gemm16_kn": 1}
    x, w = _i8(data, m, k), _i8(data, k, n)
    CALLS.clear()
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    np.testing.assert_array_equal(out, x.astype("int32") @ w.astype("int32"))
    assert len(CALLS) == (m // 16) * (n // 16) * (k // 16)
    assert set(CALLS) == {(k, n, n)}  # row strides of the x, w and output tiles, bound per site
