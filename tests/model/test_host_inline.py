"""The host's fused functions get their elementwise steps inlined (tirpat.model.host_inline):
one loop nest where TVM's fusion left one per step, the same results bit for bit, and the
backends' PrimFuncs left alone."""

import warnings

import numpy as np
import pytest
import tvm
from hypothesis import given, settings, strategies as st
from tvm import ir, relax, tirx

import tirpat as tp
from tirpat.model.host_inline import inline_elementwise, inline_function
from tirpat.model.partition import BACKEND_ATTR


def _chain(shape, steps):
    """A float model: x, then each ``(op, constant)`` of ``steps`` in turn (on the host: no
    backend takes elementwise float arithmetic)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for op, value in steps:
                y = bb.emit(op(y, relax.const(value)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _host_blocks(mod) -> list:
    """The number of blocks (the root aside) of each host PrimFunc the build pipeline leaves."""
    lowered = tp.relax_pipeline("accel, llvm")(mod)
    out = []
    for func in lowered.functions.values():
        if isinstance(func, tirx.PrimFunc) and (func.attrs is None or BACKEND_ATTR not in func.attrs):
            out.append(func.script().count("T.sblock(") - 1)
    return out


def _build(mod):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)     # nothing here is accel's
        return tp.build(mod, "accel, llvm")


def test_a_fused_chain_is_one_loop_nest():
    steps = [(relax.op.multiply, np.float32(0.5)), (relax.op.add, np.float32(1.0)),
             (relax.op.subtract, np.float32(3.0)), (relax.op.multiply, np.float32(2.0))]
    blocks = _host_blocks(_chain((4, 8), steps))
    assert blocks and max(blocks) == 1, blocks      # without the inlining: 4 blocks, one per step


def test_a_product_and_a_sum_are_not_contracted():
    """x * s + c with c = -(x * s) rounded to float32 is 0 step by step; a fused multiply-add
    would give the product's rounding error, which the scale makes large."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, (4, 64)).astype("float32")
    s = np.float32(0.1)
    c = -(x * s)
    steps = [(relax.op.multiply, s), (relax.op.add, c), (relax.op.multiply, np.float32(2.0 ** 40))]
    assert max(_host_blocks(_chain(x.shape, steps))) == 1
    got = np.asarray(_build(_chain(x.shape, steps))(x))
    assert not np.any(got)      # with contraction: almost every element nonzero
    assert (np.count_nonzero(((x.astype(np.float64) * s) + c) * 2.0 ** 40)) > 0     # the test can tell


_OPS = [relax.op.add, relax.op.subtract, relax.op.multiply, relax.op.maximum, relax.op.minimum]


@settings(deadline=None, max_examples=15)
@given(st.lists(st.tuples(st.sampled_from(range(len(_OPS))), st.floats(-4, 4, width=32)), min_size=2, max_size=6),
       st.integers(0, 2 ** 31))
def test_inlined_chains_compute_what_tvm_compile_does(steps, seed):
    """Differential: the build (host functions inlined) against ``tvm.compile(mod, "llvm")``
    (no fusion, no inlining), bit for bit, on random chains of float arithmetic with a
    round-and-cast at the end (a requantise's shape)."""
    chain = [(_OPS[op], np.float32(value)) for op, value in steps]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 40), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for op, value in chain:
                y = bb.emit(op(y, relax.const(value)))
            y = bb.emit(relax.op.round(y))
            y = bb.emit(relax.op.clip(y, -128, 127))
            out = bb.emit_output(relax.op.astype(y, "int8"))
        bb.emit_func_output(out)
    mod = bb.get()
    data = np.random.default_rng(seed).uniform(-100, 100, (3, 40)).astype("float32")
    ref = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_array_equal(np.asarray(_build(mod)(data)), ref)


def test_backend_and_scheduled_functions_are_left_alone():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def two_steps(a: T.Buffer((8,), "float32"), c: T.Buffer((8,), "float32")):
        b = T.sblock_alloc_buffer((8,), "float32")
        for i in range(8):
            with T.sblock("b"):
                v = T.axis.spatial(8, i)
                b[v] = a[v] * T.float32(2)
        for i in range(8):
            with T.sblock("c"):
                v = T.axis.spatial(8, i)
                c[v] = b[v] + T.float32(1)

    tagged = two_steps.with_attr(BACKEND_ATTR, "accel")
    scheduled = two_steps.with_attr("tirx.is_scheduled", True)
    mod = ir.IRModule({"tagged": tagged, "scheduled": scheduled, "plain": two_steps})
    out = inline_elementwise()(mod)
    assert out["tagged"].same_as(tagged) and out["scheduled"].same_as(scheduled)
    assert out["plain"].script().count("T.sblock(") == 1 + 1         # the root and one block
    with pytest.raises(TypeError, match="PrimFunc"):
        inline_function(mod)


def test_an_integer_step_that_may_wrap_stays_a_loop_nest_of_its_own():
    """A product that may overflow int32 is stored before the max after it reads it (inlined,
    llvm's no-signed-wrap reasoning could drop the max); a max or a cast is inlined."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def chain(a: T.Buffer((8,), "int32"), c: T.Buffer((8,), "int8")):
        b = T.sblock_alloc_buffer((8,), "int32")
        r = T.sblock_alloc_buffer((8,), "int32")
        m = T.sblock_alloc_buffer((8,), "int32")
        for i in range(8):
            with T.sblock("relu"):
                v = T.axis.spatial(8, i)
                r[v] = T.max(a[v], 0)
        for i in range(8):
            with T.sblock("scale"):
                v = T.axis.spatial(8, i)
                b[v] = r[v] * 861094
        for i in range(8):
            with T.sblock("floor"):
                v = T.axis.spatial(8, i)
                m[v] = T.max(b[v], -772)
        for i in range(8):
            with T.sblock("narrow"):
                v = T.axis.spatial(8, i)
                c[v] = T.Cast("int8", T.min(m[v], 127))

    text = inline_function(chain).script()
    assert 'T.sblock("scale")' in text and 'T.sblock("relu")' not in text       # relu inlined into scale
    assert text.count("T.sblock(") == 1 + 2 and "b[v] = " in text       # the product is stored


def _compiled(func, x: np.ndarray, out_dtype: str) -> np.ndarray:
    ex = tvm.compile(ir.IRModule({"main": func}), "llvm")
    out = tvm.runtime.tensor(np.zeros(x.shape, out_dtype))
    ex["main"](tvm.runtime.tensor(x), out)
    return out.numpy()


_CLAMPS = {"max": tirx.max, "min": tirx.min, "shift": lambda v, c: v >> (abs(c) % 31)}


def _step(y, op: str, c: int):
    """A te.compute body: step ``op`` by ``c`` on the tensor ``y``."""
    return lambda j: _CLAMPS[op](y[j], c)


@settings(deadline=None, max_examples=25)
@given(st.lists(st.tuples(st.sampled_from(sorted(_CLAMPS)), st.integers(-2**31, 2**31 - 1)), min_size=1, max_size=4),
       st.sampled_from(["int8", "uint8", "int16"]))
def test_a_narrowing_cast_of_a_value_the_inlined_steps_pin_computes_what_one_loop_per_step_does(steps, dtype):
    """Steps that cannot wrap (max, min, shift by a constant) one loop nest each, then a
    narrowing cast: inlined, ``min(max(x, 472153), -139616)`` is a constant to TVM's
    simplifier, whose fold of ``int8(-139616)`` raised "Literal value -139616 exceeds range of
    int8" (random_int8_model(2050)); the inlined function computes the truncation llvm does."""
    from tvm import te

    a = te.placeholder((6,), "int32", name="a")
    y = a
    for i, (op, c) in enumerate(steps):
        y = te.compute((6,), _step(y, op, c), name=f"step{i}")
    out = te.compute((6,), lambda j: tirx.Cast(dtype, y[j]), name="narrow")
    func = te.create_prim_func([a, out])
    x = np.array([-2**31, -1000, -1, 0, 77777, 2**31 - 1], "int32")
    inlined = inline_function(func)
    assert inlined.script().count("T.sblock(") == 1 + 1        # every step inlined into the cast
    np.testing.assert_array_equal(_compiled(inlined, x, dtype), _compiled(func, x, dtype))


def test_a_narrowing_cast_folds_with_the_loop_ranges_known():
    """``int8(max(i, 300))`` for ``i`` in ``[0, 6)`` is ``int8(300)`` to the simplifier that
    knows the loop's range (TVM's own fold of it fails); inlined, it computes 44."""
    from tvm import te

    a = te.placeholder((6,), "int32", name="a")
    out = te.compute((6,), lambda i: tirx.Cast("int8", tirx.max(i, 300) + a[i] * 0), name="narrow")
    got = _compiled(inline_function(te.create_prim_func([a, out])), np.ones(6, "int32"), "int8")
    np.testing.assert_array_equal(got, np.full(6, 44, "int8"))


def test_blocks_tvm_cannot_inline_are_not_offered(monkeypatch):
    # a split's outputs: each block writes a parameter (compute_inline refuses it) and reads
    # none of another block (reverse_compute_inline refuses it); a refusal is an error whose
    # message prints the function, one per block of a 25-way split
    from tvm import s_tir, te

    x = te.placeholder((1, 8, 4, 4), "int8", name="x")
    def part(g):
        return te.compute((1, 2, 4, 4), lambda n, c, h, w: x[n, c + 2 * g, h, w], name=f"p{g}")

    parts = [part(g) for g in range(4)]
    func = te.create_prim_func([x, *parts])
    offered = []
    for name in ("compute_inline", "reverse_compute_inline"):
        original = getattr(s_tir.Schedule, name)
        monkeypatch.setattr(s_tir.Schedule, name, lambda self, block, original=original, name=name:
                            offered.append(name) or original(self, block))
    tvm.ir.assert_structural_equal(inline_function(func), func)
    assert offered == []
