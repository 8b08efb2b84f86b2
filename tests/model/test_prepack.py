"""Weight layout stages run at compile time: the numpy evaluation of a stage is the compiled
stage's result, and a stage it does not cover is compiled instead."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax, s_tir, te, tirx
from tvm.script import tirx as T

from tirpat.model.partition import BACKEND_ATTR
from tirpat.model.prepack import Unsupported, evaluate, split_layout_stages


def compiled(func, *inputs):
    """``func`` compiled for llvm and run: the reference."""
    lib = tvm.compile(tvm.IRModule({"main": func}), "llvm")
    outs = [tvm.runtime.empty([int(d) for d in p.shape], str(p.dtype)) for p in func.params[len(inputs):]]
    lib["main"](*[tvm.runtime.tensor(a) for a in inputs], *outs)
    return [o.numpy() for o in outs]


@st.composite
def layout_stages(draw):
    """A copy re-laid out by ``transform_layout``, as a backend's schedule makes a layout stage:
    axes permuted, then the last two fused (a conv weight to [F, KH*KW*C]) or one split
    into blocks, padded where the block does not divide it."""
    shape = draw(st.lists(st.integers(1, 6), min_size=2, max_size=4))
    perm = draw(st.permutations(range(len(shape))))
    how = draw(st.sampled_from(["permute", "fuse", "split"]))
    block = draw(st.integers(2, 4))
    dtype = draw(st.sampled_from(["int8", "int32", "float32"]))
    a = te.placeholder(shape, dtype, name="a")
    b = te.compute(shape, lambda *i: a[i], name="b")
    sch = s_tir.Schedule(te.create_prim_func([a, b]))
    inner = shape[perm[-1]]

    def index_map(*ax):
        ax = [ax[p] for p in perm]
        if how == "fuse":
            return (*ax[:-2], ax[-2] * inner + ax[-1])
        if how == "split":
            return (*ax[:-1], ax[-1] // block, ax[-1] % block)
        return tuple(ax)

    pad = tirx.const(-7, dtype) if how == "split" else None
    sch.transform_layout(sch.get_sblock("b"), ("write", 0), index_map, pad_value=pad)
    return sch.mod["main"], shape, dtype


@settings(max_examples=15, deadline=None)
@given(layout_stages(), st.integers(0, 2**32 - 1))
def test_a_layout_stage_evaluates_as_it_runs_compiled(stage, seed):
    func, shape, dtype = stage
    rng = np.random.default_rng(seed)
    a = rng.integers(-100, 100, shape).astype(dtype)
    got, = evaluate(func, a)
    want, = compiled(func, a)
    np.testing.assert_array_equal(got, want)


@T.prim_func(s_tir=True)
def _scaled(a: T.Buffer((4, 3), "float32"), b: T.Buffer((3, 4), "float32")):
    for i, j in T.grid(3, 4):
        with T.sblock("b"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = a[vj, vi] * T.float32(2)


@T.prim_func(s_tir=True)
def _prefix_sum(a: T.Buffer((8,), "int32"), b: T.Buffer((8,), "int32")):
    for i in range(8):
        with T.sblock("b"):
            vi = T.axis.remap("S", [i])
            b[vi] = T.if_then_else(vi == 0, a[vi], b[vi - 1] + a[vi])


@T.prim_func(s_tir=True)
def _overlapping(a: T.Buffer((8,), "int32"), b: T.Buffer((4,), "int32")):
    for i in range(8):
        with T.sblock("b"):
            vi = T.axis.remap("S", [i])
            b[vi // 2] = a[vi]


@pytest.mark.parametrize("func, inputs, why", [
    (_scaled, [np.ones((4, 3), "float32")], "arithmetic on floats"),
    (_prefix_sum, [np.arange(8, dtype="int32")], "reads a buffer it writes"),
    (_overlapping, [np.arange(8, dtype="int32")], "overlap"),
])
def test_what_it_does_not_run_it_declines(func, inputs, why):
    with pytest.raises(Unsupported, match=why):
        evaluate(func, *inputs)


def test_inputs_are_checked():
    with pytest.raises(ValueError, match="expected float32"):
        evaluate(_scaled, np.ones((4, 3), "int8"))


@T.prim_func(s_tir=True)
def _partition(w: T.Buffer((4, 3), "float32"), x: T.Buffer((3, 4), "float32"), y: T.Buffer((3, 4), "float32")):
    w_t = T.sblock_alloc_buffer((3, 4), "float32")
    for i, j in T.grid(3, 4):
        with T.sblock("w_t"):
            vi, vj = T.axis.remap("SS", [i, j])
            T.sblock_attr({"meta_schedule.layout_rewrite_preproc": 1})
            w_t[vi, vj] = w[vj, vi] * T.float32(2)     # float arithmetic: compiled
    for i, j in T.grid(3, 4):
        with T.sblock("y"):
            vi, vj = T.axis.remap("SS", [i, j])
            y[vi, vj] = x[vi, vj] + w_t[vi, vj]


def test_a_stage_it_does_not_cover_is_compiled_and_folded():
    """The same result as the compiled stage, folded into a constant: the weight is re-laid out
    once, at compile time, whichever way the stage runs."""
    w = np.arange(12, dtype="float32").reshape(4, 3)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            part = bb.add_func(_partition.with_attr(BACKEND_ATTR, "test"), "part")
            y = bb.emit_output(relax.call_tir(part, [relax.const(w), x], relax.TensorType((3, 4), "float32")))
        bb.emit_func_output(y)
    mod, folded = split_layout_stages(bb.get())
    assert folded == {"part": ["w_t"]}      # by the partition, not by the prepacked copy TVM makes
    calls = [c for c in mod["main"].body.blocks[0].bindings if isinstance(c.value, relax.Call)]
    assert len(calls) == 1
    weight = calls[0].value.args[1].fields[0]
    assert isinstance(weight, tvm.ir.Constant)
    np.testing.assert_array_equal(weight.value.numpy(), w.T * 2)
