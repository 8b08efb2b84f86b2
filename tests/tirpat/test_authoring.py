"""What a rule author runs into first: declining with a reason, clear errors for patterns
that cannot work, for unlowered functions and for things that are not TIR."""

import pytest
import tvm
from tvm import te, tirx

import tirpat as tp


def scaled():
    A = te.placeholder((8, 16), "int8", name="A")
    B = te.compute((8, 16), lambda i, j: A[i, j] * 2, name="B")
    C = te.compute((16, 8), lambda i, j: B[j, i], name="C")
    return te.create_prim_func([A, C])


def test_a_callback_declines_with_a_reason_and_report_and_explain_list_it():
    func = tp.lower(scaled())

    def dma(m):
        c = m["c"]
        if len(c.extents) < 2:
            return None  # declines without a reason
        if c.src.strides[-1] != 1:
            return tp.decline("the source is not contiguous along the inner loop")
        return tirx.Evaluate(0)

    rw = tp.Rewriter.from_pattern(tp.is_copy(name="c"), dma, name="dma")
    new, report = rw.rewrite(func)
    assert new.same_as(func) and report.counts == {}
    # declined at the 2-D nest, then (as the scan goes on inside) at its inner loop and store
    first, inner, store = report.declined
    assert first.rule == "dma" and first.reason == "the source is not contiguous along the inner loop"
    assert inner.reason is store.reason is None
    assert "declined:\n  rule 'dma' at main: <top> (For i): the source is not contiguous" in str(report)
    text = str(tp.explain(rw, func))
    assert text.startswith("rule 'dma' rewrite nothing in main: every match was declined")
    assert "1. rule 'dma' at main: <top> (For i): the source is not contiguous along the inner loop" in text
    assert "2. rule 'dma' at main: i (For j): declined (the callback returned None)" in text
    with pytest.raises(TypeError, match="reason as a non-empty string"):
        tp.decline("")


def test_explain_of_a_rewriter_lists_sites_and_declines_together():
    func = tp.lower(scaled())
    any_store = tp.is_store(tp.is_buffer("out"), None, tp.wildcard("v"))
    copy = tp.Rewriter.from_pattern(tp.is_copy(), lambda m: tp.decline("not today"), name="copy")
    keep = tp.Rewriter.from_pattern(any_store, lambda m: m.node, name="keep")
    text = str(tp.explain(copy | keep, func))
    assert text.startswith("rules 'copy', 'keep' rewrite main at 2 site(s):")
    assert "declined at 3 site(s):\n  1. rule 'copy' at main: <top> (For i): not today" in text


def test_find_all_on_a_function_with_blocks_says_so():
    with pytest.raises(ValueError, match="still has T.sblock blocks; patterns match lowered TIR: tp.lower"):
        tp.find_all(tp.is_copy(), scaled())
    with pytest.raises(ValueError, match="function main still has T.sblock blocks"):
        tp.find_all(tp.is_copy(), tvm.IRModule({"main": scaled()}))
    assert len(tp.find_all(tp.is_copy(), tp.lower(scaled()))) == 1


def test_one_capture_name_for_two_kinds_of_node_is_refused_when_built():
    i = tp.is_var("A")
    with pytest.raises(ValueError, match=r"the capture name 'A' stands for a buffer in is_buffer\('A'\) and for "
                                         r"an expression in is_var\('A'\); one name binds one node"):
        tp.is_nest([i], tp.is_store(tp.is_buffer("A"), [i], tp.is_const(0)))
    with pytest.raises(ValueError, match="'s' stands for a statement .* and for an expression"):
        tp.is_seq(tp.wildcard("s"), tp.is_store(tp.is_buffer(), None, tp.wildcard("s")))
    with pytest.raises(ValueError, match="'c' stands for a copy region"):
        tp.is_seq(tp.is_copy(name="c"), tp.is_store(tp.is_buffer("c"), None, tp.wildcard()))
    # a wildcard takes what its place holds: here a buffer, as the other 'B' is
    B = tp.is_buffer("B")
    tp.is_store(tp.wildcard("B"), None, B[tp.wildcard()])
    # the same name for the same kind of node is unification, as always
    x = tp.is_var("x")
    assert (x + tp.is_var("x")).match(tirx.Var("n", "int32") + tirx.Var("n", "int32")) is None


@pytest.mark.parametrize("make", [
    lambda: tp.is_buffer(dtype="int9"),
    lambda: tp.wildcard().has_dtype("uint12"),
    lambda: tp.wildcard().astype("float7"),
    lambda: tp.is_buffer(dtype="bfloat8"),
])
def test_dtypes_tvm_does_not_compute_with_are_refused(make):
    with pytest.raises(ValueError, match="is not a dtype TVM computes with"):
        make()


def test_common_dtypes_are_accepted():
    for dtype in ("int8", "uint8", "int4", "int64", "bool", "float16", "bfloat16", "float8_e4m3fn", "int32x4"):
        tp.wildcard().has_dtype(dtype)


def test_explain_on_things_that_are_not_tir_says_what_it_expected():
    from tvm import relax

    A = te.placeholder((4,), "float32", name="A")
    with pytest.raises(TypeError, match="got tvm.te.tensor.Tensor: a TE tensor .* te.create_prim_func"):
        tp.explain(tp.is_copy(), A)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.add(x, x)))
    relax_mod = bb.get()
    with pytest.raises(TypeError, match="the module has no PrimFunc, only main .*LegalizeOps"):
        tp.explain(tp.is_copy(), relax_mod)
    with pytest.raises(TypeError, match="got tvm.ir.expr.Var: a Relax program"):
        tp.explain(tp.is_copy(), x)
    with pytest.raises(TypeError, match="PrimExpr or a Stmt"):
        tp.is_copy().match(A)
