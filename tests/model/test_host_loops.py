"""A partition's CPU copy loops run in the order of the memory they write, tiled against the
memory they read (tirpat.model.host_loops): the same results bit for bit, on random copy
nests (layouts, loop orders, paddings, dtypes), compiled at -O0 as the offloaded code is;
nests whose order matters keep theirs."""

import itertools

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given, strategies as st
from tvm import ir, tirx

import tirpat as tp
from tirpat.model.host_loops import TILE, host_loops, order_copy_nests


def _nest(in_shape, loop_order, out_perm, pads, dtype, widen):
    """``out[perm(i + pad)] = x[i]`` over the padded index space (zero outside ``x``), its loops
    in ``loop_order``; ``widen``: the value cast to int32 and offset, as maxpool's staging does."""
    x = tirx.decl_buffer(in_shape, dtype, "x")
    padded = [d + 2 * p for d, p in zip(in_shape, pads)]
    out_dtype = "int32" if widen else dtype
    y = tirx.decl_buffer([padded[k] for k in out_perm], out_dtype, "y")
    idx = [tirx.Var(f"i{k}", "int32") for k in range(len(in_shape))]
    load = tirx.BufferLoad(x, [i - p for i, p in zip(idx, pads)])
    value = tirx.Cast("int32", load) + 128 if widen else load
    conds = [c for i, p, d in zip(idx, pads, in_shape) if p for c in (i >= p, i < p + d)]
    if conds:
        cond = conds[0]
        for c in conds[1:]:
            cond = tirx.And(cond, c)
        value = tirx.if_then_else(cond, value, tirx.const(0, out_dtype))
    body = tirx.BufferStore(y, value, [idx[k] for k in out_perm])
    for k in reversed(loop_order):
        body = tirx.For(idx[k], 0, padded[k], tirx.ForKind.SERIAL, body)
    return tirx.PrimFunc([x, y], body).with_attr("global_symbol", "main")


def _run(func, x, out_shape, out_dtype, opt_level):
    target = tvm.target.Target({"kind": "llvm", "opt-level": opt_level})
    lib = tvm.tirx.build(ir.IRModule({"main": func}), target=target)
    y = tvm.runtime.tensor(np.full(out_shape, 77, out_dtype))     # a sentinel where nothing is written
    lib["main"](tvm.runtime.tensor(x), y)
    return y.numpy()


def _for_lines(func) -> list:
    return [line.strip() for line in func.script().splitlines() if line.strip().startswith("for")]


_DIMS = st.sampled_from([1, 2, 3, 5, 8, 12, 16, 24, 32, 40])


@st.composite
def _copies(draw):
    ndim = draw(st.integers(2, 4))
    shape = draw(st.lists(_DIMS, min_size=ndim, max_size=ndim))
    if np.prod(shape) > 40_000:
        shape[0] = 1
    loop_order = draw(st.permutations(range(ndim)))
    out_perm = draw(st.permutations(range(ndim)))
    pads = draw(st.lists(st.sampled_from([0, 0, 1, 3]), min_size=ndim, max_size=ndim))
    dtype = draw(st.sampled_from(["int8", "int32", "float32"]))
    widen = dtype == "int8" and draw(st.booleans())
    return shape, list(loop_order), list(out_perm), pads, dtype, widen


@given(_copies(), st.sampled_from([0, 3]))
def test_reordered_copies_compute_the_same(case, opt_level):
    shape, loop_order, out_perm, pads, dtype, widen = case
    func = _nest(shape, loop_order, out_perm, pads, dtype, widen)
    done = order_copy_nests(func)
    x = np.random.default_rng(0).integers(-128, 128, shape).astype(dtype)
    out_dtype = "int32" if widen else dtype
    out_shape = [shape[k] + 2 * pads[k] for k in out_perm]
    want = _run(func, x, out_shape, out_dtype, opt_level)
    assert np.array_equal(_run(done, x, out_shape, out_dtype, opt_level), want)
    # and the reference is the copy itself (the sentinel survives nowhere)
    expect = np.pad(x, [(p, p) for p in pads]).astype(out_dtype)
    if widen:
        inside = np.pad(np.ones(shape, bool), [(p, p) for p in pads])
        expect = np.where(inside, expect + 128, 0).astype(out_dtype)
    assert np.array_equal(want, expect.transpose(out_perm))


def test_a_transpose_is_reordered_tiled_and_vectorised():
    """y[h, w, c] = x[c, h, w] written with c outermost: every store lands a channel count
    apart. Reordered, the loops follow y (h, w, c); tiled, c and w move in 16 x 16 tiles (w
    reads consecutive bytes of x), the innermost tile loop a vector of consecutive stores."""
    func = _nest([32, 8, 32], [0, 1, 2], [1, 2, 0], [0, 0, 0], "int8", False)
    done = order_copy_nests(func)
    assert _for_lines(func) == ["for i0, i1, i2 in T.grid(32, 8, 32):"]
    assert _for_lines(done) == ["for i1, i2_o, i0_o, i2_t in T.grid(8, 2, 2, 16):", f"for i0_t in T.vectorized({TILE}):"]


def test_a_padding_is_reordered_and_vectorised_along_the_channels():
    """The padded NHWC staging of an NCHW input: the channels become the innermost loop, in
    vectors (the padding's condition is on h and w only, so a whole vector is in or out)."""
    func = _nest([48, 5, 5], [0, 1, 2], [1, 2, 0], [0, 1, 1], "int8", False)     # 7 x 7: no whole tile
    assert _for_lines(order_copy_nests(func)) == ["for i1, i2, i0_o in T.grid(7, 7, 3):",
                                                  "for i0_v in T.vectorized(16):"]


@pytest.mark.parametrize("opt_level", [0, 3])
def test_channels_from_planes_far_apart_are_read_along_the_rows(opt_level):
    """Staged channels-last from 64 x 64 planes (the padded input of a 3x3 convolution): a
    vector of channels would read one byte from each of 16 cache lines in the same L1 set, so
    the loop along the rows (consecutive reads) runs innermost, the channels around it; the
    same bytes. Planes 1 KB apart spread over 4 sets: not reordered so."""
    func = _nest([16, 64, 64], [0, 1, 2], [1, 2, 0], [0, 1, 1], "int8", False)
    done = order_copy_nests(func)
    assert _for_lines(done) == ["for i1, i0, i2 in T.grid(66, 16, 66):"]
    x = np.random.default_rng(1).integers(-128, 128, (16, 64, 64)).astype("int8")
    got = _run(done, x, [66, 66, 16], "int8", opt_level)
    assert np.array_equal(got, np.pad(x, [(0, 0), (1, 1), (1, 1)]).transpose(1, 2, 0))
    small = order_copy_nests(_nest([16, 32, 32], [0, 1, 2], [1, 2, 0], [0, 1, 1], "int8", False))
    assert _for_lines(small) != ["for i1, i0, i2 in T.grid(34, 16, 34):"]


@pytest.mark.parametrize("why, func", [
    # two iterations write y[i]: the last one wins, so the order is the result
    ("writes one element twice", lambda: _overwriting()),
    # reads what it writes: a running copy along a row
    ("reads its own output", lambda: _self_reading()),
    # already writes consecutive elements, has nothing to tile and too few for a vector
    ("in order", lambda: _nest([4, 6], [0, 1], [0, 1], [0, 0], "int8", False)),
    # writes 3 bytes apart at each step: within a cache line, and no vector of consecutive stores
    ("dense enough", lambda: _nest([3, 8, 8], [1, 0, 2], [1, 2, 0], [0, 0, 0], "int8", False)),
])
def test_nests_whose_order_matters_keep_it(why, func):
    f = func()
    assert order_copy_nests(f).same_as(f), why


def _overwriting():
    x, y = tirx.decl_buffer([8, 16], "int8", "x"), tirx.decl_buffer([16], "int8", "y")
    i, j = tirx.Var("i", "int32"), tirx.Var("j", "int32")
    body = tirx.For(i, 0, 8, tirx.ForKind.SERIAL, tirx.For(j, 0, 16, tirx.ForKind.SERIAL,
                                                             tirx.BufferStore(y, tirx.BufferLoad(x, [i, j]), [j])))
    return tirx.PrimFunc([x, y], body).with_attr("global_symbol", "main")


def _self_reading():
    y = tirx.decl_buffer([16, 32], "int8", "y")
    i, j = tirx.Var("i", "int32"), tirx.Var("j", "int32")
    store = tirx.BufferStore(y, tirx.BufferLoad(y, [tirx.Max(i - 1, 0), j]), [i, j])
    body = tirx.For(j, 0, 32, tirx.ForKind.SERIAL, tirx.For(i, 0, 16, tirx.ForKind.SERIAL, store))
    return tirx.PrimFunc([y], body).with_attr("global_symbol", "main")


def test_order_copy_nests_refuses_what_is_not_a_primfunc():
    with pytest.raises(TypeError, match="order_copy_nests takes a PrimFunc, got IRModule"):
        order_copy_nests(ir.IRModule({}))


def test_a_copy_in_order_becomes_vectors():
    """A row-major copy already writes consecutive bytes: its order stays, its rows of 40
    go by vectors of 8."""
    func = _nest([6, 40], [0, 1], [0, 1], [0, 0], "int8", False)
    assert _for_lines(order_copy_nests(func)) == ["for i0, i1_o in T.grid(6, 5):", "for i1_v in T.vectorized(8):"]


def test_the_pass_reorders_every_primfunc_of_a_module():
    a = _nest([32, 8, 32], [0, 1, 2], [1, 2, 0], [0, 0, 0], "int8", False)
    b = _nest([4, 6], [0, 1], [0, 1], [0, 0], "int8", False)
    scheduled = a.with_attr("tirx.is_scheduled", True)     # a schedule's order is its author's
    mod = host_loops()(ir.IRModule({"a": a, "b": b, "s": scheduled}))
    assert not mod["a"].same_as(a) and _for_lines(mod["a"])[-1].startswith("for i0_t in T.vectorized")
    assert tvm_ffi.structural_equal(mod["b"], b)
    assert tvm_ffi.structural_equal(mod["s"], scheduled)
