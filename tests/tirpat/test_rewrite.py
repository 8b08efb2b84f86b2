"""Rewriting: reports, ordered choice, fresh variables, errors, passes and pipelines."""

import numpy as np
import pytest
import tvm
from hypothesis import given
from tvm import te, tirx

import tirpat as tp
from tirpat.testing import reference_copy_rule, run, tiled_reductions

COUNTER = {"n": 0}


@tvm.register_global_func("tests.tirpat.count", override=True)
def _count(*args):
    COUNTER["n"] += 1


def counting_call(m):
    return tirx.Evaluate(tirx.call_packed("tests.tirpat.count", 0))


def two_copies():
    A = te.placeholder((8, 8), "float32", name="A")
    B = te.compute((8, 8), lambda i, j: A[i, j], name="B")
    C = te.compute((8, 8), lambda i, j: B[j, i], name="C")
    return tp.lower(te.create_prim_func([A, C]))


def test_report_counts_and_sites():
    f = two_copies()
    rw = reference_copy_rule("dma")
    new = rw(f)
    assert rw.report.counts == {"dma": 2}
    assert len(rw.report.sites) == 2 and rw.report.sites[0].rule == "dma"
    assert "dma" in str(rw.report)
    a = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
    out = run(new, [a, np.zeros((8, 8), "float32")])[1]
    np.testing.assert_array_equal(out, a.T)


def test_input_is_never_mutated():
    f = two_copies()
    before = f.script()
    reference_copy_rule()(f)
    assert f.script() == before


def test_ordered_choice_first_rule_wins():
    f = two_copies()
    first = tp.Rewriter.from_pattern(tp.is_copy(), counting_call, name="first")
    second = tp.Rewriter.from_pattern(tp.is_copy(), counting_call, name="second")
    rw = first | second
    rw(f)
    assert rw.report.counts == {"first": 2}
    declining = tp.Rewriter.from_pattern(tp.is_copy(), lambda m: None, name="declines")
    rw = declining | second
    rw(f)
    assert rw.report.counts == {"second": 2}


def test_rules_are_indexed_by_root_kind():
    rw = (tp.Rewriter.from_pattern(tp.is_copy(), counting_call, name="copy")
          | tp.Rewriter.from_pattern(tp.is_const(1), lambda m: m.node, name="const"))
    assert [r.name for r in rw._rules_for(tirx.For)] == ["copy"]
    assert [r.name for r in rw._rules_for(tirx.IntImm)] == ["const"]
    assert rw._rules_for(tirx.Evaluate) == ()


def test_each_inserted_replacement_gets_fresh_variables():
    f = two_copies()
    v = tirx.Var("t", "int32")
    shared = tirx.For(v, 0, 2, 0, tirx.Evaluate(tirx.call_packed("tests.tirpat.count", v)))
    rw = tp.Rewriter.from_pattern(tp.is_copy(), lambda m: shared, name="same_stmt")
    new = rw(f)
    assert tirx.analysis.verify_well_formed(new, assert_mode=False)
    COUNTER["n"] = 0
    run(new, [np.zeros((8, 8), "float32"), np.zeros((8, 8), "float32")])
    assert COUNTER["n"] == 4


def test_callback_returning_the_wrong_kind_raises():
    f = two_copies()
    with pytest.raises(tp.RewriteError, match="'bad'.*returned int"):
        tp.Rewriter.from_pattern(tp.is_copy(), lambda m: 3, name="bad")(f)
    with pytest.raises(tp.RewriteError, match="expected a PrimExpr"):
        tp.Rewriter.from_pattern(tp.is_const(0), lambda m: tirx.Evaluate(0), name="e")(f)


def test_replacement_with_an_undefined_variable_raises():
    f = two_copies()
    ghost = tirx.Var("ghost", "int32")
    with pytest.raises(tp.RewriteError, match="ghost"):
        tp.Rewriter.from_pattern(tp.is_copy(), lambda m: tirx.Evaluate(ghost), name="g")(f)
    # a loop variable of the replaced nest is not defined once the nest is gone
    with pytest.raises(tp.RewriteError, match="not defined at that site"):
        tp.Rewriter.from_pattern(tp.is_copy(), lambda m: tirx.Evaluate(m.loops[-1].loop_var), name="l")(f)


def test_errors_inside_a_pass_keep_their_type():
    mod = tvm.IRModule({"main": two_copies()})
    bad = tp.Rewriter.from_pattern(tp.is_copy(), lambda m: 3, name="bad")
    with pytest.raises(tp.RewriteError, match="bad"):
        bad.as_pass()(mod)


def test_expression_rules_rewrite_expressions():
    A = te.placeholder((16,), "int32", name="A")
    B = te.compute((16,), lambda i: A[i] * 2, name="B")
    f = tp.lower(te.create_prim_func([A, B]))
    x = tp.wildcard("x")
    rw = tp.Rewriter.from_pattern(x * 2, lambda m: m["x"] + m["x"], name="mul2_to_add")
    new = rw(f)
    assert rw.report.counts == {"mul2_to_add": 1}
    a = np.arange(16, dtype="int32")
    np.testing.assert_array_equal(run(new, [a, np.zeros(16, "int32")])[1], a * 2)
    with pytest.raises(tp.RewriteError, match="int32 expression with a int8"):
        tp.Rewriter.from_pattern(x * 2, lambda m: tirx.Cast("int8", m["x"]), name="d")(f)


def test_seq_rule_replaces_just_the_run():
    i = tirx.Var("i", "int32")
    X = tirx.decl_buffer((4,), "int32", "X")
    stmts = [tirx.BufferStore(X, tirx.IntImm("int32", k), [tirx.IntImm("int32", k)]) for k in range(4)]
    zero = lambda k: tp.is_store(tp.is_buffer(), [tp.is_const(k)], tp.wildcard())
    rw = tp.Rewriter.from_pattern(tp.is_seq(zero(1), zero(2)), lambda m: tirx.Evaluate(tirx.IntImm("int32", 7)), name="s")
    out = rw(tirx.SeqStmt(stmts))
    assert [type(s).__name__ for s in out.seq] == ["BufferStore", "Evaluate", "BufferStore"]


def test_irmodule_and_as_pass():
    mod = tvm.IRModule({"main": two_copies()})
    rw = reference_copy_rule()
    out = rw(mod)
    assert isinstance(out, tvm.IRModule) and rw.report.counts == {"reference_copy": 2}
    out2 = rw.as_pass()(mod)
    assert tvm.ir.structural_equal(out2["main"], out["main"]) if hasattr(tvm.ir, "structural_equal") else True
    import tvm_ffi

    assert tvm_ffi.structural_equal(out2["main"], out["main"])


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(TypeError, match="pattern"):
        tp.Rewriter.from_pattern("not a pattern", counting_call)
    with pytest.raises(TypeError, match="callable"):
        tp.Rewriter.from_pattern(tp.is_copy(), 5)
    with pytest.raises(TypeError, match="PrimFunc"):
        tp.Rewriter.from_pattern(tp.is_copy(), counting_call)(42)
    with pytest.raises(TypeError, match="Rewriter"):
        tp.Rewriter.from_pattern(tp.is_copy(), counting_call) | 3


@given(tiled_reductions(tiles=(4, 8)))
def test_pipeline_in_tvm_compile_rewrites_gemm_tiles(case):
    """A GEMM-tile rule run by tvm.compile: counted calls, and the result stays exact."""
    i, j, k = tp.is_var("i"), tp.is_var("j"), tp.is_var("k")
    A, B, C = tp.is_buffer("A", dtype="int8"), tp.is_buffer("B", dtype="int8"), tp.is_buffer("C", dtype="int32")
    update = tp.is_store(C, [i, j], C[i, j] + A[i, k].astype("int32") * B[j, k].astype("int32"))
    tile = tp.is_nest([i, j, k], tp.is_seq(tp.is_if(tp.wildcard("first"), tp.is_store(C, [i, j], tp.is_const(0))), update))

    def gemm_call(m):
        ra, rb, rc = m.region("A"), m.region("B"), m.region("C")
        ti, tj, tk = (int(l.extent) for l in m.loops)
        return tirx.Evaluate(tirx.call_packed(
            "tests.tirpat.gemm", ra.buffer, rb.buffer, rc.buffer, ra.offset, rb.offset, rc.offset,
            ti, tj, tk, ra.strides[0], rb.strides[1], rc.strides[0], tirx.Cast("int32", m.at_origin(m["first"]))))

    tp.register_pipeline("tests_gemm", tp.Rewriter.from_pattern(tile, gemm_call, name="gemm"))
    calls = []

    def gemm(a, b, c, oa, ob, oc, ti, tj, tk, sa, sb, sc, first):
        from tirpat.testing import tensor_view

        av, bv, cv = tensor_view(a), tensor_view(b), tensor_view(c)
        ta = np.lib.stride_tricks.as_strided(av[oa:], (ti, tk), (sa, 1)).astype("int32")
        tb = np.lib.stride_tricks.as_strided(bv[ob:], (tj, tk), (sb, 1)).astype("int32")
        tc = np.lib.stride_tricks.as_strided(cv[oc:], (ti, tj), (sc * 4, 4), writeable=True)
        tc[...] = (0 if first else tc) + ta @ tb.T
        calls.append(1)

    tvm.register_global_func("tests.tirpat.gemm", gemm, override=True)
    ex = tvm.compile(tvm.IRModule({"main": case.func}), target="llvm", tir_pipeline="tests_gemm")
    rng = np.random.default_rng(1)
    a, b, c = case.inputs(rng)
    ta, tb, tc = (tvm.runtime.tensor(x) for x in (a, b, c))
    ex["main"](ta, tb, tc)
    np.testing.assert_array_equal(tc.numpy(), case.reference(a, b))
    assert len(calls) == (case.m // case.tile[0]) * (case.n // case.tile[1]) * (case.k // case.tile[2])


@tvm.register_global_func("tests.tirpat.dma", override=True)
def _dma(dst, src, n):
    from tirpat.testing import tensor_view

    tensor_view(dst)[:n] = tensor_view(src)[:n]


def test_scratch_buffers_handed_to_calls_do_not_share_memory():
    # Two cache_read buffers, each filled by a packed call: TVM's StorageRewrite would
    # merge them (it cannot see inside the call), silently corrupting the result.
    from tvm import s_tir

    A = te.placeholder((16,), "int8", name="A")
    B = te.placeholder((16,), "int8", name="B")
    C = te.compute((16,), lambda i: A[i] + B[i], name="C")
    sch = s_tir.Schedule(te.create_prim_func([A, B, C]))
    sch.cache_read(sch.get_sblock("C"), 0, "local.sram")
    sch.cache_read(sch.get_sblock("C"), 1, "local.sram")
    copy = tp.is_copy(dst=tp.is_buffer(scope="local.sram"), name="c")
    rw = tp.Rewriter.from_pattern(copy, lambda m: tirx.Evaluate(tirx.call_packed(
        "tests.tirpat.dma", m["c"].dst.buffer, m["c"].src.buffer, *m["c"].extents)), name="dma")
    tp.register_pipeline("tests_scratch", rw)
    ex = tvm.compile(sch.mod, target="llvm", tir_pipeline="tests_scratch")
    a, b = np.arange(16, dtype=np.int8), np.full(16, 100, np.int8)
    c = tvm.runtime.tensor(np.zeros(16, np.int8))
    ex["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_array_equal(c.numpy(), a + b)


def test_register_pipeline_guards_tvm_pipelines_and_takes_one_after_pass():
    rw = reference_copy_rule()
    with pytest.raises(ValueError, match="one of TVM's own pipelines"):
        tp.register_pipeline("default", rw)
    tp.register_pipeline("tests_after_one", rw, after=tvm.tirx.transform.RemoveNoOp())


def test_callback_errors_name_the_rule_and_site_and_lists_become_sequences():
    f = two_copies()

    def boom(m):
        raise ZeroDivisionError("bad tile")

    with pytest.raises(tp.RewriteError, match=r"rule 'boom' at main: <top> \(For i\): its callback "
                                              r"raised ZeroDivisionError: bad tile") as info:
        tp.Rewriter.from_pattern(tp.is_copy(), boom, name="boom")(f)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    # inside tvm.compile too, where TVM's FFI would otherwise turn it into a bare RuntimeError("bad tile")
    tp.register_pipeline("tests_boom", tp.Rewriter.from_pattern(tp.is_copy(), boom, name="boom"))
    with pytest.raises(tp.RewriteError, match="rule 'boom' at main: .* raised ZeroDivisionError: bad tile"):
        tvm.compile(tvm.IRModule({"main": f}), target="llvm", tir_pipeline="tests_boom")
    two = lambda m: [counting_call(m), counting_call(m)]  # noqa: E731
    rw = tp.Rewriter.from_pattern(tp.is_copy(), two, name="two")
    new = rw(f)
    COUNTER["n"] = 0
    run(new, [np.zeros((8, 8), "float32"), np.zeros((8, 8), "float32")])
    assert COUNTER["n"] == 4


def test_find_all_takes_a_module():
    mod = tvm.IRModule({"main": two_copies()})
    assert len(tp.find_all(tp.is_copy(), mod)) == 2
    with pytest.raises(TypeError, match="find_all expects a tirpat pattern"):
        tp.find_all("x", mod)


# -- reports per call and per thread --------------------------------------------------------
def _named_copies(name):
    return two_copies().with_attr("global_symbol", name)


def test_a_call_returns_its_report_and_rw_report_is_the_last_one():
    rw = reference_copy_rule("dma")
    new, report = rw.rewrite(two_copies())
    assert report.counts == {"dma": 2} and rw.report is report
    assert isinstance(new, tvm.tirx.PrimFunc)
    _, other = rw.rewrite(tvm.IRModule({"f": two_copies()}))
    assert rw.report is other and [s.func for s in other.sites] == ["f", "f"]
    assert report.counts == {"dma": 2}  # an earlier report is left as it was


def _lockstep_rule(barrier):
    """A copy rule whose callback waits for the other thread at every site, so that two
    rewrites are surely in flight at once."""
    def dma(m):
        barrier.wait(timeout=60)
        return counting_call(m)

    return tp.Rewriter.from_pattern(tp.is_copy(), dma, name="dma")


def _in_threads(work):
    import threading

    results, errors = {}, []

    def run_one(k):
        try:
            results[k] = work(k)
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=run_one, args=(k,)) for k in ("f0", "f1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads), errors
    return results


def test_two_threads_rewriting_with_one_rewriter_each_get_their_own_report():
    import threading

    rw = _lockstep_rule(threading.Barrier(2))

    def work(name):
        new, report = rw.rewrite(_named_copies(name))
        return [s.func for s in report.sites]

    for name, returned in _in_threads(work).items():
        assert returned == [name, name]


def test_a_pass_handed_a_report_collects_its_compiles_rewrites_whatever_other_threads_compile():
    """The report of the rewrites one ``tvm.compile`` ran (the pass is handed it, in a pipeline
    registered for that compile), while another build runs the same rewriter in another thread."""
    import threading

    rw = _lockstep_rule(threading.Barrier(2))

    def work(name):
        report = tp.Report()
        with tp.registered(tp.tir_pipeline(rw.as_pass(report=report))) as pipeline:
            tvm.compile(tvm.IRModule({name: _named_copies(name)}), target="llvm", tir_pipeline=pipeline)
        assert pipeline not in tvm.tirx.compilation_pipeline.PIPELINE_MAP     # gone with the compile
        return [s.func for s in report.sites]

    for name, funcs in _in_threads(work).items():
        assert funcs == [name, name]
