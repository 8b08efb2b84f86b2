"""Pattern construction: readable reprs and clear errors for bad input."""

import pytest
from tvm import tirx

import tirpat as tp


def test_reprs_read_like_the_constructors():
    i, j = tp.is_var("i"), tp.is_var("j")
    A = tp.is_buffer("A", dtype="int8")
    assert repr(A[i, j]) == "is_buffer('A', dtype='int8')[is_var('i'), is_var('j')]"
    assert repr(i * 16 + j) == "((is_var('i') * is_const(16)) + is_var('j'))"
    assert repr(tp.max(i, 0)) == "tp.max(is_var('i'), is_const(0))"
    assert repr(A[i, j].astype("int32")) == "is_buffer('A', dtype='int8')[is_var('i'), is_var('j')].astype('int32')"
    assert repr(tp.is_nest(2, tp.wildcard())) == "is_nest(2, wildcard())"
    assert repr(tp.is_nest([tp.loop(i, extent=16)], tp.wildcard())) == "is_nest([loop(is_var('i'), extent=is_const(16))], wildcard())"
    assert "is_copy(dst=is_buffer(scope='local.x')" in repr(tp.is_copy(dst=tp.is_buffer(scope="local.x")))
    assert repr(tp.wildcard().has_dtype("int8")) == "wildcard().has_dtype('int8')"
    assert repr(i | j) == "(is_var('i') | is_var('j'))"


@pytest.mark.parametrize("make, exc, text", [
    (lambda: tp.is_nest(2.5, tp.wildcard()), TypeError, "depth must be an int"),
    (lambda: tp.is_nest("3", tp.wildcard()), TypeError, "loops must be"),
    (lambda: tp.is_nest(0, tp.wildcard()), ValueError, "at least 1"),
    (lambda: tp.is_nest(2, tp.is_var()), TypeError, "statement pattern"),
    (lambda: tp.is_store(tp.is_buffer(), [0], tp.is_nest(1, tp.wildcard())), TypeError, "expression pattern"),
    (lambda: tp.is_store("C", [0], tp.wildcard()), TypeError, "buffer pattern"),
    (lambda: tp.is_var() + "x", TypeError, "expected a tirpat pattern"),
    (lambda: tp.is_var() + None, TypeError, "expected a tirpat pattern"),
    (lambda: tp.is_const("1"), TypeError, "int or float"),
    (lambda: tp.is_buffer(ndim=-1), ValueError, "ndim"),
    (lambda: tp.is_buffer(dtype=8), TypeError, "dtype"),
    (lambda: tp.loop(kind="sideways"), ValueError, "unknown loop kind"),
    (lambda: tp.loop(extent=-1), ValueError, "non-negative"),
    (lambda: tp.is_copy(dst="A"), TypeError, "buffer pattern"),
    (lambda: tp.is_seq(), ValueError, "at least one"),
    (lambda: tp.wildcard().has_dtype(8), TypeError, "dtype string"),
    (lambda: tp.wildcard().where(3), TypeError, "callable"),
    (lambda: tp.is_var() | tp.is_nest(1, tp.wildcard()), TypeError, "cannot alternate"),
    (lambda: tp.is_var(3), TypeError, "capture name"),
    (lambda: tp.match("x", tirx.IntImm("int32", 1)), TypeError, "tirpat pattern"),
    (lambda: tp.is_var().match(42), TypeError, "PrimExpr or a Stmt"),
    (lambda: tp.explain(42, tirx.IntImm("int32", 1)), TypeError, "tirpat pattern"),
    (lambda: tp.is_call(3), TypeError, "op_name"),
])
def test_bad_input_raises_a_clear_error(make, exc, text):
    with pytest.raises(exc, match=text):
        make()


def test_patterns_compare_by_identity():
    a, b = tp.is_var("i"), tp.is_var("i")
    assert a == a and a != b and len({a, b}) == 2


@pytest.mark.parametrize("make, text", [
    (lambda: tp.wildcard().astype("notadtype"), "is not a dtype"),
    (lambda: tp.wildcard().has_dtype("int9x"), "is not a dtype"),
    (lambda: tp.is_buffer(dtype="integer8"), "is not a dtype"),
    (lambda: tp.is_call("no_such_op"), "no TIR op named"),
])
def test_typos_in_dtypes_and_op_names_are_caught(make, text):
    with pytest.raises(ValueError, match=text):
        make()
