"""The matcher: captures, unification, commutativity, affine indices, nests, regions."""

import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm import tirx

import tirpat as tp
from tirpat.testing import elementwise_nests, tiled_reductions

i32 = "int32"


def var(name):
    return tirx.Var(name, i32)


def imm(v):
    return tirx.IntImm(i32, v)


def gemm_pattern(acc_dtype="int32"):
    i, j, k = tp.is_var("i"), tp.is_var("j"), tp.is_var("k")
    A, B, C = tp.is_buffer("A", dtype="int8"), tp.is_buffer("B", dtype="int8"), tp.is_buffer("C", dtype=acc_dtype)
    update = tp.is_store(C, [i, j], C[i, j] + A[i, k].astype("int32") * B[j, k].astype("int32"))
    init = tp.is_if(tp.wildcard(), tp.is_store(C, [i, j], tp.is_const(0)))
    return tp.is_nest([i, j, k], tp.is_seq(init, update))


# -- properties on generated code --------------------------------------------------------
@given(tiled_reductions(tiles=(2, 4, 8, 16)))
def test_tiled_gemm_tiles_match_with_their_bases(case):
    matches = tp.find_all(gemm_pattern(), case.func)
    assert len(matches) == 1
    m = matches[0]
    assert [int(l.extent) for l in m.loops] == list(case.tile)
    assert m["A"].name == "A" and m["C"].name == "C"
    ra = m.region("A")
    assert ra.strides == (case.k, 0, 1)
    assert len(ra.base) == 2 and all(not isinstance(b, int) for b in ra.base)
    rc = m.region("C")
    assert rc.strides == (case.n, 1, 0)


@given(elementwise_nests())
def test_elementwise_pattern_matches_and_binds(case):
    n = len(case.shape)
    vs = [tp.is_var(f"v{k}") for k in range(n)]
    a, b, out = tp.is_buffer("a"), tp.is_buffer("b"), tp.is_buffer("out")
    op = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
          "max": tp.max, "min": tp.min}[case.op]
    pat = tp.is_nest(vs, tp.is_store(out, vs, op(a[tuple(vs)], b[tuple(vs)])))
    m = pat.match(case.func.body)
    assert m is not None, tp.explain(pat, case.func)
    assert [m[f"v{k}"].name for k in range(n)] == [f"i{k}" for k in range(n)]
    assert m["out"].name == "out" and m["a"].name == "a"
    assert [int(l.extent) for l in m.loops] == list(case.shape)


@given(elementwise_nests(), st.sampled_from(["buffer", "extent", "index"]))
def test_mutated_nest_does_not_match_and_explain_names_it(case, mutation):
    n = len(case.shape)
    vs = [tp.is_var(f"v{k}") for k in range(n)]
    a, b = tp.is_buffer("a", name_hint="a"), tp.is_buffer("b", name_hint="b")
    out = tp.is_buffer("out", name_hint="out")
    op = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
          "max": tp.max, "min": tp.min}[case.op]
    loops = [tp.loop(v, extent=e) for v, e in zip(vs, case.shape)]
    pat = tp.is_nest(loops, tp.is_store(out, vs, op(a[tuple(vs)], b[tuple(vs)])))
    assert pat.match(case.func.body) is not None
    store = _innermost(case.func.body)
    if mutation == "buffer":
        other = tirx.decl_buffer(case.shape, case.dtype, "c")
        load = store.value.a
        new_value = type(store.value)(tirx.BufferLoad(other, load.indices), store.value.b)
        mutated = _replace_innermost(case.func.body, tirx.BufferStore(store.buffer, new_value, store.indices))
        expect = "name_hint 'a'"
    elif mutation == "extent":
        mutated = tirx.For(case.func.body.loop_var, case.func.body.min, imm(case.shape[0] + 1),
                           case.func.body.kind, case.func.body.body)
        expect = f"constant {case.shape[0]}"
    else:
        idx = list(store.indices)
        idx[-1] = idx[-1] * idx[-1]
        mutated = _replace_innermost(case.func.body, tirx.BufferStore(store.buffer, store.value, idx))
        expect = "index"
    assert pat.match(mutated) is None
    text = str(tp.explain(pat, mutated))
    assert expect in text, text


def _innermost(stmt):
    while isinstance(stmt, tirx.For):
        stmt = stmt.body
    return stmt


def _replace_innermost(stmt, new):
    if isinstance(stmt, tirx.For):
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, _replace_innermost(stmt.body, new))
    return new


# -- semantics --------------------------------------------------------------------------
def test_name_is_a_capture_key_and_name_hint_a_filter():
    x, y = var("x"), var("y")
    assert tp.is_var("anything").match(x)["anything"].same_as(x)
    assert tp.is_var(name_hint="x").match(x) is not None
    assert tp.is_var(name_hint="x").match(y) is None


def test_same_capture_twice_must_bind_equal_nodes():
    x, y = var("x"), var("y")
    p = tp.is_var("v") + tp.is_var("v")
    assert p.match(x + x) is not None
    assert p.match(x + y) is None
    w = tp.wildcard()
    assert (w * w).match((x + 1) * (x + 1)) is not None
    assert (w * w).match((x + 1) * (x + 2)) is None


def test_buffers_unify_by_identity():
    A = tirx.decl_buffer((4,), "int8", "A")
    A2 = tirx.decl_buffer((4,), "int8", "A")
    i = var("i")
    Bp = tp.is_buffer("B")
    p = Bp[tp.wildcard()] + Bp[tp.wildcard()]
    assert p.match(tirx.BufferLoad(A, [i]) + tirx.BufferLoad(A, [i + 1])) is not None
    assert p.match(tirx.BufferLoad(A, [i]) + tirx.BufferLoad(A2, [i])) is None


def test_add_and_mul_are_commutative():
    x, y = var("x"), var("y")
    p = tp.is_var("a") * tp.is_const(16) + tp.is_var("b")
    for e in [x * 16 + y, y + x * 16, y + 16 * x, 16 * x + y]:
        m = p.match(e)
        assert m is not None and m["a"].same_as(x) and m["b"].same_as(y)
    assert (tp.is_var("a") - tp.is_var("b")).match(x - y)["a"].same_as(x)
    assert (tp.is_var("a") - tp.is_var("b")).match(y - x)["a"].same_as(y)


def test_index_affine_normalisation():
    i, j = var("i"), var("j")
    A = tirx.decl_buffer((256,), "int8", "A")
    B = tirx.decl_buffer((256,), "int8", "B")
    iv, jv = tp.is_var("i"), tp.is_var("j")
    Ap, Bp = tp.is_buffer("A"), tp.is_buffer("B")
    pat = tp.is_nest([iv, jv], tp.is_store(Bp, [iv * 16 + jv], Ap[jv + 16 * iv]))
    for idx in [j + i * 16, (i * 4) * 4 + j, i * 16 + j * 1 + 0, (i * 8 + j) + i * 8]:
        body = tirx.BufferStore(B, tirx.BufferLoad(A, [idx]), [i * 16 + j])
        nest = tirx.For(i, 0, 16, 0, tirx.For(j, 0, 16, 0, body))
        assert pat.match(nest) is not None, idx


def test_tile_base_is_allowed_only_when_free_of_nest_loops():
    io, i = var("io"), var("i")
    A = tirx.decl_buffer((64,), "int8", "A")
    B = tirx.decl_buffer((16,), "int8", "B")
    iv = tp.is_var("i")
    pat = tp.is_nest([iv], tp.is_store(tp.is_buffer("B"), [iv], tp.is_buffer("A")[iv]))
    inner = tirx.For(i, 0, 16, 0, tirx.BufferStore(B, tirx.BufferLoad(A, [io * 16 + i]), [i]))
    m = pat.match(inner)
    assert m is not None
    assert str(m.region("A").base[0]) == "io * 16"
    bad = tirx.For(i, 0, 16, 0, tirx.BufferStore(B, tirx.BufferLoad(A, [i * 2]), [i]))
    assert pat.match(bad) is None


def test_two_accesses_of_one_buffer_must_share_the_base():
    i, io = var("i"), var("io")
    C = tirx.decl_buffer((64,), "int32", "C")
    iv, Cp = tp.is_var("i"), tp.is_buffer("C")
    pat = tp.is_nest([iv], tp.is_store(Cp, [iv], Cp[iv] + 1))
    same = tirx.For(i, 0, 16, 0, tirx.BufferStore(C, tirx.BufferLoad(C, [io + i]) + 1, [io + i]))
    shifted = tirx.For(i, 0, 16, 0, tirx.BufferStore(C, tirx.BufferLoad(C, [io + i + 1]) + 1, [io + i]))
    assert pat.match(same) is not None
    assert pat.match(shifted) is None
    assert "two different offsets" in str(tp.explain(pat, shifted))


def test_is_nest_counts_from_the_matched_loop():
    a, b, c = var("a"), var("b"), var("c")
    X = tirx.decl_buffer((8, 8, 8), "int32", "X")
    body = tirx.BufferStore(X, imm(0), [a, b, c])
    nest = tirx.For(a, 0, 8, 0, tirx.For(b, 0, 8, 0, tirx.For(c, 0, 8, 0, body)))
    store = tp.is_store(tp.is_buffer(), [tp.wildcard(), tp.wildcard(), tp.wildcard()], tp.is_const(0))
    m3 = tp.is_nest(3, store).match(nest)
    assert [l.loop_var.name for l in m3.loops] == ["a", "b", "c"]
    assert tp.is_nest(2, store).match(nest) is None
    (m2,) = tp.find_all(tp.is_nest(2, store), tirx.SeqStmt([nest, nest]))[:1]
    assert [l.loop_var.name for l in m2.loops] == ["b", "c"]
    any_depth = tp.is_nest(None, store).match(nest)
    assert len(any_depth.loops) == 3


def test_loop_specs_filter_extent_and_kind():
    a = var("a")
    X = tirx.decl_buffer((8,), "int32", "X")
    par = tirx.For(a, 0, 8, tirx.ForKind.PARALLEL, tirx.BufferStore(X, imm(0), [a]))
    assert tp.is_nest([tp.loop(extent=8, kind="parallel")], tp.wildcard()).match(par) is not None
    assert tp.is_nest([tp.loop(extent=8, kind="serial")], tp.wildcard()).match(par) is None
    assert tp.is_for(tp.wildcard(), extent=4).match(par) is None


def test_canonicalisation_hides_unit_loops_constants_and_nested_seqs():
    i, u = var("i"), var("u")
    A = tirx.decl_buffer((16,), "int32", "A")
    B = tirx.decl_buffer((16,), "int32", "B")
    copy = tirx.BufferStore(B, tirx.BufferLoad(A, [i + u * 4]), [i + imm(2) * imm(0)])
    messy = tirx.For(i, 0, imm(4) * imm(4), 0, tirx.For(u, 0, 1, 0, copy))
    iv = tp.is_var("i")
    pat = tp.is_nest([tp.loop(iv, extent=16)], tp.is_store(tp.is_buffer("B"), [iv], tp.is_buffer("A")[iv]))
    assert pat.match(messy) is not None
    nested = tirx.SeqStmt([tirx.SeqStmt([tirx.Evaluate(imm(1)), tirx.Evaluate(imm(2))]), tirx.Evaluate(imm(3))])
    seq = tp.is_seq(tp.wildcard(), tp.wildcard(), tp.wildcard())
    assert seq.match(nested) is not None


def test_is_seq_matches_a_contiguous_run():
    e = [tirx.Evaluate(imm(k)) for k in range(1, 5)]
    m = tp.is_seq(tp.wildcard("x"), tp.wildcard("y")).match(tirx.SeqStmt(e))
    assert m.span == (0, 2)
    ev = lambda v: tp.wildcard().where(lambda mm, v=v: isinstance(mm.node, tirx.Evaluate) and mm.node.value.value == v)
    m = tp.is_seq(ev(3), ev(4)).match(tirx.SeqStmt(e))
    assert m.span == (2, 4)


def test_where_runs_on_the_complete_match():
    x, y = var("x"), var("y")
    p = (tp.is_var("a") + tp.is_var("b")).where(lambda m: m["a"].name == "y")
    m = p.match(x + y)
    assert m is not None and m["a"].same_as(y)  # the commutative order that satisfies it


def test_has_dtype_and_astype():
    x = var("x")
    assert tp.wildcard().has_dtype("int32").match(x) is not None
    assert tp.wildcard().has_dtype("int8").match(x) is None
    assert tp.wildcard().astype("int8").match(tirx.Cast("int8", x)) is not None
    assert tp.wildcard().astype("int16").match(tirx.Cast("int8", x)) is None


def test_affine_pattern():
    i, j = var("i"), var("j")
    A = tirx.decl_buffer((256,), "int8", "A")
    B = tirx.decl_buffer((16,), "int8", "B")
    p = tp.is_nest(2, tp.is_store(tp.is_buffer(), [tp.affine("d")], tp.is_buffer()[tp.affine("s")]))
    ok = tirx.For(i, 0, 4, 0, tirx.For(j, 0, 4, 0, tirx.BufferStore(B, tirx.BufferLoad(A, [i * 20 + j + 3]), [i * 4 + j])))
    bad = tirx.For(i, 0, 4, 0, tirx.For(j, 0, 4, 0, tirx.BufferStore(B, tirx.BufferLoad(A, [i * j]), [i * 4 + j])))
    assert p.match(ok)["s"] is not None
    assert p.match(bad) is None


def test_is_call_accepts_short_and_full_names():
    x = var("x")
    e = tirx.if_then_else(x < 3, x, imm(0))
    assert tp.is_call("if_then_else", tp.wildcard(), tp.wildcard(), tp.is_const(0)).match(e) is not None
    assert tp.is_call(e.op.name, tp.wildcard(), tp.wildcard(), tp.wildcard()).match(e) is not None
    assert tp.is_call("exp", tp.wildcard()).match(e) is None


def test_alternation_and_floor_ops():
    x = var("x")
    p = (tp.is_var("a") // 4) | (tp.is_var("a") % 4)
    assert p.match(tirx.floordiv(x, 4))["a"].same_as(x)
    assert p.match(tirx.floormod(x, 4))["a"].same_as(x)
    assert p.match(x * 4) is None


def test_find_all_is_preorder_and_non_overlapping():
    a, b = var("a"), var("b")
    X = tirx.decl_buffer((8, 8), "int32", "X")
    inner = tirx.For(b, 0, 8, 0, tirx.BufferStore(X, imm(0), [a, b]))
    nest = tirx.For(a, 0, 8, 0, inner)
    found = tp.find_all(tp.is_for(tp.wildcard()), nest)
    assert len(found) == 1 and found[0].node.loop_var.name == "a"


@given(tiled_reductions(max_tiles=2, tiles=(2, 4)))
def test_match_works_on_flattened_tir(case):
    case_func = case.func
    flat = tirx.transform.FlattenBuffer()(tvm.IRModule({"main": case_func}))["main"]
    i, j, k = tp.is_var("i"), tp.is_var("j"), tp.is_var("k")
    A, B, C = tp.is_buffer("A"), tp.is_buffer("B"), tp.is_buffer("C")
    sn, sk = tp.wildcard("sn"), tp.wildcard("sk")
    upd = tp.is_store(C, [i * sn + j], C[i * sn + j] + A[i * sk + k].astype("int32") * B[j * sk + k].astype("int32"))
    pat = tp.is_nest([i, j, k], tp.is_seq(tp.is_if(tp.wildcard(), tp.wildcard()), upd))
    found = tp.find_all(pat, flat)
    assert len(found) == 1, tp.explain(pat, flat)
    assert int(found[0]["sk"]) == case.k and int(found[0]["sn"]) == case.n


def test_region_of_unaccessed_buffer_is_a_clear_error():
    a = var("a")
    X = tirx.decl_buffer((8,), "int32", "X")
    Y = tirx.decl_buffer((8,), "int32", "Y")
    m = tp.is_nest(1, tp.wildcard()).match(tirx.For(a, 0, 8, 0, tirx.BufferStore(X, imm(0), [a])))
    with pytest.raises(KeyError, match="Y is not accessed"):
        m.region(Y)
    with pytest.raises(KeyError, match="not bound"):
        m["nope"]


def test_region_follows_the_pattern_and_refuses_ambiguous_accesses():
    i, j = var("i"), var("j")
    A = tirx.decl_buffer((8, 8), "float32", "A")
    C = tirx.decl_buffer((8, 8), "float32", "C")
    body = tirx.BufferStore(C, tirx.BufferLoad(A, [i, j]) + tirx.BufferLoad(A, [j, i]), [i, j])
    nest = tirx.For(i, 0, 8, 0, tirx.For(j, 0, 8, 0, body))
    iv, jv = tp.is_var("i"), tp.is_var("j")
    X, Y = tp.is_buffer("X"), tp.is_buffer("Y")
    m = tp.is_nest([iv, jv], tp.is_store(tp.is_buffer("C"), [iv, jv], X[iv, jv] + Y[jv, iv])).match(nest)
    assert m.region("X").strides == (8, 1)
    assert m.region(Y).strides == (1, 8)     # the access Y matched, not A's first access
    with pytest.raises(tp.RegionError, match="different indices"):
        m.region(m["X"])                      # the buffer itself: two access patterns
