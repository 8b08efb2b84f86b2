"""explain(): a person can fix a pattern from its output alone."""

from tvm import te, tirx

import tirpat as tp


def lowered_matmul():
    A = te.placeholder((32, 32), "int8", name="A")
    B = te.placeholder((32, 32), "int8", name="B")
    k = te.reduce_axis((0, 32), "k")
    C = te.compute((32, 32), lambda i, j: te.sum(A[i, k].astype("int32") * B[j, k].astype("int32"), axis=k), name="C")
    return tp.lower(te.create_prim_func([A, B, C]))


def gemm(cast="int32", transpose_b=False):
    i, j, k = tp.is_var("i"), tp.is_var("j"), tp.is_var("k")
    A, B, C = tp.is_buffer("A"), tp.is_buffer("B"), tp.is_buffer("C")
    bi = [k, j] if transpose_b else [j, k]
    upd = tp.is_store(C, [i, j], C[i, j] + A[i, k].astype(cast) * B[tuple(bi)].astype("int32"))
    return tp.is_nest([i, j, k], tp.is_seq(tp.is_if(tp.wildcard(), tp.wildcard()), upd))


def test_explain_on_match_lists_the_matches():
    text = str(tp.explain(gemm(), lowered_matmul()))
    assert "matches main 1 time(s)" in text


def test_explain_names_path_expected_and_found():
    text = str(tp.explain(gemm(cast="int16"), lowered_matmul()))
    assert "no match in main" in text
    assert "value" in text and "expected a cast to int16, found a cast to int32" in text
    assert "at <top> (For i)" in text


def test_explain_wrong_layout_names_the_index():
    text = str(tp.explain(gemm(transpose_b=True), lowered_matmul()))
    assert "index 0" in text and "expected index k, found j" in text


def test_explain_on_a_node():
    text = str(tp.explain(tp.is_const(1), tirx.IntImm("int32", 2)))
    assert text == "no match: at <root>: expected the constant 1, found 2"


def test_explain_reports_when_no_candidate_exists():
    text = str(tp.explain(tp.is_if(tp.wildcard(), tp.wildcard()), tp.lower(
        te.create_prim_func([te.placeholder((4,), name="X"), te.compute((4,), lambda i: 1.0, name="Y")]))))
    assert "no node of a kind" in text and "IfThenElse" in text


def test_explain_hints_at_lowering_and_names_the_rules():
    A = te.placeholder((8,), "float32", name="A")
    f = te.create_prim_func([A, te.compute((8,), lambda i: A[i] * 2, name="B")])
    text = str(tp.explain(tp.is_copy(), f))          # not lowered: still T.sblock blocks
    assert "hint:" in text and "tp.lower" in text
    rw = (tp.Rewriter.from_pattern(tp.is_copy(), lambda m: None, name="dma")
          | tp.Rewriter.from_pattern(tp.is_nest(1, tp.wildcard()), lambda m: None, name="any_loop"))
    text = str(tp.explain(rw, tp.lower(f)))
    assert text.startswith("rules 'dma', 'any_loop' rewrite nothing in main: every match was declined")
    assert "rule 'any_loop' at main: <top> (For i): declined (the callback returned None)" in text


def test_a_failing_where_is_the_reason_given():
    i = tp.is_var("i")
    p = tp.is_nest([i], tp.is_store(tp.is_buffer("B"), [i], tp.wildcard())).where(lambda m: False)
    A = te.placeholder((8,), "float32", name="A")
    f = tp.lower(te.create_prim_func([A, te.compute((8,), lambda k: A[k] * 2, name="B")]))
    assert "where() predicate <lambda> is false" in str(tp.explain(p, f))


def doubled(n=4):
    A = te.placeholder((n,), "float32", name="A")
    return tp.lower(te.create_prim_func([A, te.compute((n,), lambda i: A[i] * 2.0, name="B")]))


def never(m):
    return None


def test_a_rule_set_names_each_rules_miss_and_ranks_the_furthest_first():
    i = tp.is_var("i")
    early = tp.Rewriter.from_pattern(tp.is_for(tp.wildcard(), extent=99), never, name="early")
    scale = tp.Rewriter.from_pattern(tp.is_nest([i], tp.is_store(tp.is_buffer("B"), [i],
                                                                 tp.is_load(tp.is_buffer("A"), [i]) * 3.0)),
                                     never, name="scale")
    ex = tp.explain(early | scale, doubled())
    text = str(ex)
    assert [m.rule for m in ex.misses] == ["scale", "early"]
    assert text.index("rule 'scale':") < text.index("rule 'early':")
    assert "expected the constant 3" in text and "expected the constant 99, found 4" in text


def test_a_rule_set_keeps_the_one_relevant_rule_and_tells_shared_misses_once():
    copies = [tp.Rewriter.from_pattern(tp.is_copy(), never, name=f"dma{n}") for n in range(3)]
    wide = tp.Rewriter.from_pattern(tp.is_for(tp.wildcard(), extent=8), never, name="wide")
    ex = tp.explain(copies[0] | copies[1] | copies[2] | wide, doubled())
    text = str(ex)
    # the copy rules got deeper, and all three together are still not allowed to push `wide` out
    assert "rules 'dma0', 'dma1', 'dma2':" in text
    assert "  rule 'wide':\n    1. at <top> (For i):\n       path: extent\n       expected the constant 8, found 4" in text
    assert text.count("expected the stored value to be a buffer load") == 2   # two sites, not 2 x 3 rules
    assert [m.rule for m in ex.misses].count("wide") == 1


def test_the_guides_explain_output_is_what_explain_prints():
    import contextlib
    import io
    import pathlib
    import re
    import sys

    import tvm

    root = pathlib.Path(__file__).resolve().parents[2]
    guide = (root / "docs" / "bring-your-own-accelerator.md").read_text()
    code, quoted = re.search(r"```python\n(PRODUCT = .*?)```\s*```text\n(.*?)```", guide, re.S).groups()
    sys.path.insert(0, str(root / "examples"))
    try:
        from vecunit import compiler
    finally:
        sys.path.remove(str(root / "examples"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {"tvm": tvm, "tp": tp, "compiler": compiler})  # noqa: S102 - the guide's own example
    assert printed.getvalue() == quoted
