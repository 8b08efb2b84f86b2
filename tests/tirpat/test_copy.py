"""is_copy and CopyRegion on generated copy nests, checked by running the code."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
import tvm
from tvm import tirx

import tirpat as tp
from tirpat.tir.index_dtype import with_index_dtype
from tirpat.testing import copy_nests, reference_copy_rule, run

RW = reference_copy_rule()


def _kept(case):
    """Extent-1 loops are canonicalised away, so the region only has the others."""
    return [k for k, e in enumerate(case.extents) if e > 1]


@given(copy_nests(), st.sampled_from(["int32", "int64"]))
def test_region_facts_are_recovered(case, index_dtype):
    """Also with int64 loops and indices (Relax's): the same facts, in the index type."""
    func = case.func if index_dtype == "int32" else with_index_dtype(case.func, index_dtype)
    (m,) = tp.find_all(tp.is_copy(name="c"), func)
    c = m["c"]
    exprs = [c.src.offset, c.dst.offset, *(e for pair in (c.pad or ()) for e in pair)]
    assert all(str(e.ty.dtype) == index_dtype for e in exprs if not isinstance(e, int)), exprs
    keep = _kept(case)
    assert c.extents == tuple(case.extents[k] for k in keep)
    assert c.src.strides == tuple(case.src_strides[k] for k in keep)
    assert c.dst.strides == tuple(case.dst_strides[k] for k in keep)
    assert int(c.src.offset) == case.src_offset
    assert int(c.dst.offset) == case.dst_offset
    assert c.src.buffer.name == "src" and c.dst.buffer.name == "dst"
    cast = None if case.src_dtype == case.dst_dtype else case.dst_dtype
    assert c.cast == cast
    if case.pad is not None and any(b or a for b, a in case.pad):
        assert c.predicate is not None and c.pad is not None
        assert [(int(b), int(a)) for b, a in c.pad] == [case.pad[k] for k in keep]
        if case.partial:
            assert c.pad_value is None
        else:
            assert int(c.pad_value.value) == case.pad_value
    else:
        assert c.predicate is None and c.pad is None and c.pad_value is None


@given(copy_nests())
def test_rewriting_copies_into_a_numpy_dma_preserves_outputs(case):
    new = RW(case.func)
    assert RW.report.counts == {"reference_copy": 1}
    rng = np.random.default_rng(len(case.extents))
    inputs = case.inputs(rng)
    original = run(case.func, inputs)[1]
    rewritten = run(new, inputs)[1]
    np.testing.assert_array_equal(original, case.reference(*inputs))
    np.testing.assert_array_equal(rewritten, original)


@given(copy_nests(padding=False))
def test_copy_nests_match_after_flattening(case):
    import tvm

    flat = tirx.transform.FlattenBuffer()(tvm.IRModule({"main": case.func}))["main"]
    matches = tp.find_all(tp.is_copy(name="c"), flat)
    assert len(matches) == 1
    c = matches[0]["c"]
    keep = _kept(case)
    assert c.src.strides == tuple(case.src_strides[k] for k in keep)
    assert int(c.src.offset) == case.src_offset


def _single(stmt):
    return tp.is_copy(name="c").match(stmt)


def test_non_affine_index_is_not_a_copy():
    i = tirx.Var("i", "int32")
    A = tirx.decl_buffer((64,), "int8", "A")
    B = tirx.decl_buffer((8,), "int8", "B")
    nest = tirx.For(i, 0, 8, tirx.ForKind.SERIAL, tirx.BufferStore(B, tirx.BufferLoad(A, [i * i]), [i]))
    assert _single(nest) is None
    assert "not affine" in str(tp.explain(tp.is_copy(), nest))


def test_non_constant_stride_is_not_a_copy():
    i = tirx.Var("i", "int32")
    n = tirx.Var("n", "int32")
    A = tirx.decl_buffer((64,), "int8", "A")
    B = tirx.decl_buffer((8,), "int8", "B")
    nest = tirx.For(i, 0, 8, tirx.ForKind.SERIAL, tirx.BufferStore(B, tirx.BufferLoad(A, [i * n]), [i]))
    assert _single(nest) is None
    assert "non-constant stride" in str(tp.explain(tp.is_copy(), nest))


def test_in_place_update_is_not_a_copy():
    i = tirx.Var("i", "int32")
    A = tirx.decl_buffer((16,), "int8", "A")
    nest = tirx.For(i, 0, 8, tirx.ForKind.SERIAL, tirx.BufferStore(A, tirx.BufferLoad(A, [i + 8]), [i]))
    assert _single(nest) is None


def test_padding_depends_on_enclosing_loops():
    # A tile of a padded input: the guard mentions the outer loop, so pad does too.
    io = tirx.Var("io", "int32")
    i = tirx.Var("i", "int32")
    A = tirx.decl_buffer((20,), "int8", "A")
    T = tirx.decl_buffer((8,), "int8", "T")
    g = io * 8 + i
    value = tirx.if_then_else(tirx.And(tirx.IntImm("int32", 2) <= g, g < tirx.IntImm("int32", 22)),
                              tirx.BufferLoad(A, [g - 2]), tirx.IntImm("int8", 0))
    inner = tirx.For(i, 0, 8, tirx.ForKind.SERIAL, tirx.BufferStore(T, value, [i]))
    m = tp.is_copy(name="c").match(inner)
    (before, after), = m["c"].pad
    from tvm import sym

    for tile, expect in [(0, (2, 0)), (1, (0, 0)), (2, (0, 2))]:
        ana = sym.Analyzer()
        got = [int(ana.simplify(_subst(x, io, tile))) for x in (before, after)]
        assert tuple(got) == expect


@given(st.integers(2, 5), st.integers(2, 6), st.integers(0, 2), st.integers(0, 1), st.booleans())
def test_a_guard_on_enclosing_loops_excludes_the_whole_copy_where_it_fails(rows, width, top, left, partial):
    """A pooling window's row in the padding: part of the guard tests only the enclosing
    loop. The pads still describe the copy (where that part fails, every iteration is
    excluded), so a DMA driven by them alone (the reference rule) computes what the loops do."""
    r, i = tirx.Var("r", "int32"), tirx.Var("i", "int32")
    A = tirx.decl_buffer((rows, width), "int8", "A")
    T = tirx.decl_buffer((rows, width), "int8", "T")
    guard = tirx.And(tirx.IntImm("int32", top) <= r, tirx.IntImm("int32", left) <= i)
    load = tirx.BufferLoad(A, [r - top, i - left])
    store = (tirx.IfThenElse(guard, tirx.BufferStore(T, load, [r, i]), None) if partial else
             tirx.BufferStore(T, tirx.if_then_else(guard, load, tirx.IntImm("int8", -7)), [r, i]))
    touch = tirx.BufferStore(T, tirx.BufferLoad(T, [r, 0]), [r, 0])     # (an update, so the copy is the row alone)
    row = tirx.SeqStmt([tirx.For(i, 0, width, 0, store), touch])
    func = tirx.PrimFunc([A, T], tirx.For(r, 0, rows, 0, row)).with_attr("global_symbol", "main")
    (m,) = tp.find_all(tp.is_copy(name="c"), func)
    assert [l.loop_var.name for l in m.loops] == ["i"] and m["c"].pad is not None
    pads, outer = tp.split_guard(m["c"].predicate, m.loops)
    assert [(int(b), int(a)) for b, a in pads] == [(left, 0)] and "r" in str(outer)
    new = RW(func)
    assert RW.report.counts == {"reference_copy": 1}
    rng = np.random.default_rng(rows * width)
    a, t = rng.integers(-100, 100, (rows, width)).astype("int8"), np.full((rows, width), 5, "int8")
    np.testing.assert_array_equal(run(new, [a, t])[1], run(func, [a, t])[1])


@given(st.integers(2, 4), st.integers(5, 20), st.sampled_from([4, 8]), st.integers(0, 1))
def test_a_padded_copy_in_a_split_s_partial_tile_has_the_tile_s_extent(rows, width, lanes, top):
    """``for i in range(lanes): if lanes*o + i < width: T[r, lanes*o + i] = if_then_else(...)``
    (a pooling row loaded by the vectors of a split) is guarded twice: the tile's guard
    becomes the extent ``min(lanes, width - lanes*o)``, the row's padding stays the copy's,
    the offsets follow the tile."""
    r, o, i = (tirx.Var(n, "int32") for n in "roi")
    A = tirx.decl_buffer((rows, width), "int8", "A")
    T = tirx.decl_buffer((rows, width), "int8", "T")
    col = o * lanes + i
    value = tirx.if_then_else(tirx.IntImm("int32", top) <= r, tirx.BufferLoad(A, [r - top, col]), tirx.IntImm("int8", -7))
    store = tirx.IfThenElse(col < width, tirx.BufferStore(T, value, [r, col]), None)
    touch = tirx.BufferStore(T, tirx.BufferLoad(T, [r, 0]), [r, 0])     # (an update, so the copy is the tile alone)
    tile = tirx.SeqStmt([tirx.For(i, 0, lanes, 0, store), touch])
    nest = tirx.For(r, 0, rows, 0, tirx.For(o, 0, (width + lanes - 1) // lanes, 0, tile))
    func = tirx.PrimFunc([A, T], nest).with_attr("global_symbol", "main")
    (m,) = tp.find_all(tp.is_copy(name="c"), func)
    c = m["c"]
    assert [l.loop_var.name for l in m.loops] == ["i"] and c.pad is not None and c.pad_value is not None
    assert type(m.loops[0].body) is not tirx.IfThenElse      # the tile's guard is the loop's extent now
    for row in range(rows):
        for tile in range((width + lanes - 1) // lanes):
            at = [(r, row), (o, tile)]
            extent, ((before, after),) = _value(c.extents[0], at), [[_value(e, at) for e in p] for p in c.pad]
            assert extent == min(lanes, width - lanes * tile)
            assert (before, after) == ((0, 0) if row >= top else (extent, 0))
            assert _value(c.src.offset, at) == (row - top) * width + lanes * tile


def _value(expr, at) -> int:
    """``expr`` (an int or a PrimExpr) with the ``(var, int)`` pairs ``at`` substituted."""
    for var, v in at:
        expr = expr if isinstance(expr, int) else _subst(expr, var, v)
    return int(tvm.sym.Analyzer().simplify(expr)) if not isinstance(expr, int) else expr


def _subst(expr, var, value):
    from tirpat.tir.analysis import substitute

    return substitute(expr, [(var, tirx.IntImm("int32", value))])


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_cast_is_reported(dtype):
    i = tirx.Var("i", "int32")
    A = tirx.decl_buffer((8,), dtype, "A")
    B = tirx.decl_buffer((8,), "int32", "B")
    nest = tirx.For(i, 0, 8, tirx.ForKind.SERIAL, tirx.BufferStore(B, tirx.Cast("int32", tirx.BufferLoad(A, [i])), [i]))
    assert tp.is_copy(name="c").match(nest)["c"].cast == "int32"


def test_stepped_loops_are_counted_from_zero():
    i = tirx.Var("i", "int32")
    A = tirx.decl_buffer((16,), "int8", "A")
    B = tirx.decl_buffer((16,), "int8", "B")
    nest = tirx.For(i, 0, 16, tirx.ForKind.SERIAL, tirx.BufferStore(B, tirx.BufferLoad(A, [i]), [i]),
                    None, None, tirx.IntImm("int32", 2))
    c = tp.is_copy(name="c").match(nest)["c"]
    assert c.extents == (8,) and c.src.strides == (2,) and c.dst.strides == (2,)
    func = tirx.PrimFunc([A, B], nest).with_attr("global_symbol", "main")
    a, b = np.arange(16, dtype=np.int8), np.zeros(16, np.int8)
    np.testing.assert_array_equal(run(RW(func), [a, b])[1], run(func, [a, b])[1])


def test_non_rectangular_nests_and_symbolic_strides_are_not_copies():
    i, j = tirx.Var("i", "int32"), tirx.Var("j", "int32")
    A = tirx.decl_buffer((8, 8), "int8", "A")
    B = tirx.decl_buffer((8, 8), "int8", "B")
    triangle = tirx.For(i, 0, 8, 0, tirx.For(j, 0, i, 0, tirx.BufferStore(B, tirx.BufferLoad(A, [i, j]), [i, j])))
    assert tp.is_copy().match(triangle) is None
    assert "not rectangular" in str(tp.explain(tp.is_copy(), triangle))
    s = tirx.Var("s", "int32")
    S = tirx.decl_buffer((4, 4), "int8", "S", strides=[s, 1])
    single = tirx.BufferStore(B, tirx.BufferLoad(S, [1, 2]), [0, 0])
    assert tp.is_copy().match(single) is None   # its offset could not be computed


# -- views of one buffer's memory (issue 12, item 5) -------------------------------------
def _views_copy(n, first, second, reverse, shift=0):
    """``A``, 16 int32, with two views of its memory at element offsets ``first`` and
    ``second``, and the nest ``V2[j + shift] = V1[i]`` over ``i < n`` (``j`` is ``i``, or
    ``n - 1 - i`` reversed)."""
    A = tirx.decl_buffer((16,), "int32", "A")
    V1 = tirx.decl_buffer((n + shift,), "int32", "V1", data=A.data, elem_offset=first)
    V2 = tirx.decl_buffer((n + shift,), "int32", "V2", data=A.data, elem_offset=second)
    i = tirx.Var("i", "int32")
    j = (n - 1 - i) if reverse else i
    nest = tirx.For(i, 0, n, tirx.ForKind.SERIAL, tirx.BufferStore(V2, tirx.BufferLoad(V1, [i]), [j + shift]))
    body = tirx.SeqStmt([tirx.DeclBuffer(V1, data=A.data), tirx.DeclBuffer(V2, data=A.data), nest])
    return tirx.PrimFunc([A], body).with_attr("global_symbol", "main")


def test_a_loop_carried_copy_between_views_is_not_a_copy():
    """``V2[i + 1] = V1[i]``, two views of all of A: the loops spread A[0] over A[1..7], a
    DMA of the region would shift A by one instead."""
    func = _views_copy(7, 0, 0, reverse=False, shift=1)
    # the store alone is still a copy, of one element (each iteration's, in order)
    assert [m["c"].extents for m in tp.find_all(tp.is_copy(name="c"), func)] == [()]
    a = np.arange(16, dtype="int32") + 5
    want = a.copy()
    want[1:8] = a[0]
    np.testing.assert_array_equal(run(func, [a])[0], want)
    np.testing.assert_array_equal(run(RW(func), [a])[0], want)
    # reversed, not even one element is at a constant distance: explain names the overlap
    text = str(tp.explain(tp.is_copy(), _views_copy(7, 0, 1, reverse=True)))
    assert "not a plain copy: V2 and V1 are views of one buffer's memory, and the elements written overlap" in text


@given(st.integers(1, 8), st.integers(0, 8), st.integers(0, 8), st.booleans())
def test_copies_between_views_match_only_where_order_does_not_matter(n, first, second, reverse):
    """A copy between two views of one buffer is a copy when the elements written and read
    are disjoint; either way, rewriting into a DMA keeps what the program computes."""
    func = _views_copy(n, first, second, reverse)
    disjoint = first + n <= second or second + n <= first
    found = [m["c"].extents for m in tp.find_all(tp.is_copy(name="c"), func)]
    if n > 1:
        assert ((n,) in found) == disjoint, found
    new = RW(func)
    a = np.random.default_rng(n).integers(-100, 100, 16).astype("int32")
    np.testing.assert_array_equal(run(new, [a])[0], run(func, [a])[0])


# -- vector stores (issue 12, item 9) ------------------------------------------------------
def _vector_copy():
    A = tirx.decl_buffer((16,), "int8", "A")
    B = tirx.decl_buffer((16,), "int8", "B")
    i = tirx.Var("i", "int32")
    ramp = tirx.Ramp(i * 4, 1, 4)
    nest = tirx.For(i, 0, 4, tirx.ForKind.SERIAL, tirx.BufferStore(B, tirx.BufferLoad(A, [ramp]), [ramp]))
    return tirx.PrimFunc([A, B], nest).with_attr("global_symbol", "main")


def test_a_vector_store_is_not_a_copy():
    func = _vector_copy()
    assert tp.find_all(tp.is_copy(), func) == []
    assert "a vector store (4 lanes) to B" in str(tp.explain(tp.is_copy(), func))
    new = RW(func)
    assert RW.report.counts == {}
    a = np.arange(16, dtype="int8")
    np.testing.assert_array_equal(run(new, [a, np.zeros(16, "int8")])[1], a)


def test_a_vector_passed_to_a_packed_call_is_a_rewrite_error():
    """What TVM would reject deep inside tvm.compile ("Cannot pass vector type through
    packed API") is a RewriteError naming the rule and the site."""
    store = tp.is_store(tp.is_buffer("B"), None, tp.wildcard("v"))
    rw = tp.Rewriter.from_pattern(store, lambda m: tirx.Evaluate(tirx.call_packed("f", m["v"])), name="vec")
    with pytest.raises(tp.RewriteError, match=r"rule 'vec' at main: i \(BufferStore\) passes the vector"):
        rw(_vector_copy())
