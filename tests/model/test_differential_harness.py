"""``tirpat.testing.differential``: the differential harness the operator tests use fails
when a built model's output differs from llvm's in any call, output, value, shape or
dtype, and draws the inputs it says; ``int8_models.int8_layer`` builds the layer it says."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from tirpat.testing import differential
from tirpat.testing.differential import INPUT_RANGES, assert_matches_llvm, llvm_reference, random_inputs
from tirpat.testing.int8_models import int8_layer


def _module(shapes_dtypes, body, name: str = "main") -> tvm.IRModule:
    """``name(p0, p1, ...)`` returning ``body(*params)``."""
    params = [relax.Var(f"p{i}", relax.TensorType(shape, dtype)) for i, (shape, dtype) in enumerate(shapes_dtypes)]
    bb = relax.BlockBuilder()
    with bb.function(name, params):
        with bb.dataflow():
            out = bb.emit_output(body(*params))
        bb.emit_func_output(out)
    return bb.get()


def _double(dtype: str = "int8") -> tvm.IRModule:
    return _module([((2, 5), dtype)], lambda x: relax.op.add(x, x))


class _Faulty:
    """A built model that is wrong from call ``bad`` on (as a device that plans or caches
    on a later call could be), by one in element [0, 0] of output ``output``."""

    def __init__(self, model, bad: int, output: int = 0):
        self.model, self.bad, self.output, self.calls = model, bad, output, 0

    def __call__(self, *args):
        got = self.model(*args)
        outs = list(got) if isinstance(got, tuple) else [got]
        if self.calls >= self.bad:
            outs[self.output] = outs[self.output].copy()
            outs[self.output][0, 0] += 1
        self.calls += 1
        return tuple(outs) if isinstance(got, tuple) else outs[0]


@pytest.mark.parametrize("bad", [0, 1, 2])
def test_a_model_wrong_on_any_of_the_calls_fails(monkeypatch, bad):
    real_build = differential.build
    monkeypatch.setattr(differential, "build", lambda mod, target, strict: _Faulty(real_build(mod, target), bad))
    with pytest.raises(AssertionError, match=f"call {bad}, output 0 differs from llvm's"):
        assert_matches_llvm(_double(), "llvm", calls=3)
    # with fewer calls than the faulty one, nothing is seen
    if bad:
        assert isinstance(assert_matches_llvm(_double(), "llvm", calls=bad), _Faulty)


def test_every_output_of_a_tuple_is_compared(monkeypatch):
    mod = _module([((3, 4), "int8")], lambda x: relax.Tuple([relax.op.negative(x), relax.op.add(x, x)]))
    model = assert_matches_llvm(mod, "llvm")
    assert len(model(np.zeros((3, 4), "int8"))) == 2
    real_build = differential.build
    monkeypatch.setattr(differential, "build", lambda mod, target, strict: _Faulty(real_build(mod, target), 0, 1))
    with pytest.raises(AssertionError, match="call 0, output 1 differs"):
        assert_matches_llvm(mod, "llvm")


def test_a_different_dtype_shape_or_count_of_outputs_fails():
    x = [((2, 5), "int8")]
    as_int32 = _module(x, lambda v: relax.op.astype(relax.op.add(v, v), "int32"))
    with pytest.raises(AssertionError, match="dtype"):       # same values, another dtype
        assert_matches_llvm(_double(), "llvm", reference=as_int32, inputs=[np.ones((2, 5), "int8")])
    flat = _module(x, lambda v: relax.op.reshape(relax.op.add(v, v), (10,)))
    with pytest.raises(AssertionError, match="shape"):
        assert_matches_llvm(_double(), "llvm", reference=flat)
    pair = _module(x, lambda v: relax.Tuple([relax.op.add(v, v), v]))
    with pytest.raises(AssertionError, match="call 0: 1 outputs, llvm's 2"):
        assert_matches_llvm(_double(), "llvm", reference=pair)


def test_inputs_given_or_a_function_of_the_call():
    seen = []

    def inputs(call):
        seen.append(call)
        return [np.full((2, 5), call, "int8")]

    assert_matches_llvm(_double(), "llvm", calls=4, inputs=inputs)
    assert seen == [0, 1, 2, 3]
    fixed = [np.arange(10, dtype="int8").reshape(2, 5)]
    assert_matches_llvm(_double(), "llvm", calls=2, inputs=fixed)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="calls must be at least 1, not 0"):
        assert_matches_llvm(_double(), "llvm", calls=0)
    with pytest.raises(ValueError, match="Relax function 'main'"):
        llvm_reference(_module([((2,), "int8")], lambda x: x, name="forward"))
    tir = tvm.IRModule({"main": tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(0))})
    with pytest.raises(ValueError, match="main is a PrimFunc, not a Relax function"):
        random_inputs(tir, 0)
    n = tvm.tirx.Var("n", "int64")
    with pytest.raises(ValueError, match="parameter p0 of main is not a tensor of static shape"):
        random_inputs(_module([((n, 4), "int8")], lambda x: x), 0)
    with pytest.raises(ValueError, match="parameter p0 of main is bool: no random inputs"):
        random_inputs(_module([((4,), "bool")], lambda x: x), 0)


@settings(max_examples=30)
@given(st.lists(st.tuples(st.lists(st.integers(1, 5), min_size=1, max_size=3),
                          st.sampled_from(["int8", "int32", "int16", "uint8", "float32"])), min_size=1, max_size=4),
       st.integers(0, 2**32 - 1))
def test_random_inputs_have_each_parameters_shape_dtype_and_range(params, seed):
    mod = _module([(tuple(s), d) for s, d in params], lambda *ps: ps[0])
    drawn = random_inputs(mod, seed)
    assert [(a.shape, str(a.dtype)) for a in drawn] == [(tuple(s), d) for s, d in params]
    for a, (_, dtype) in zip(drawn, params):
        if dtype in INPUT_RANGES:
            lo, hi = INPUT_RANGES[dtype]
            assert lo <= a.min() and a.max() < hi
    # the same seed (or a generator of it) draws the same arrays; the ranges can be widened
    again = random_inputs(mod, np.random.default_rng(seed))
    assert all(np.array_equal(a, b) for a, b in zip(drawn, again))
    wide = random_inputs(_module([((4000,), "int32")], lambda x: x), seed, ranges={})[0]
    assert np.abs(wide.astype(np.int64)).max() > 5000


@pytest.mark.parametrize("kind, layout, shape", [("matmul", "NCHW", (6, 5)), ("conv2d", "NHWC", (1, 4, 4, 5)),
                                                 ("conv2d", "NCHW", (1, 5, 4, 4)), ("depthwise", "NCHW", (1, 3, 4, 4))])
def test_int8_layer_is_the_layer_it_says(kind, layout, shape):
    n, k = (3, 3) if kind == "depthwise" else (3, 5)
    mod = int8_layer(kind, shape[0] if kind == "matmul" else 4, n, k, lambda bb, y: y, seed=2, bias=7,
                     layout=layout)
    assert [int(d) for d in mod["main"].params[0].ty.shape.values] == list(shape)
    x = random_inputs(mod, 0)[0].astype(np.int64)
    weight, bias = (c.value.numpy().astype(np.int64) for c in _constants(mod))
    assert np.abs(bias).max() < 7 and bias.size == n
    nchw = layout == "NCHW" and kind != "matmul"
    if kind == "matmul":
        want = x @ weight.T + bias
    else:      # numpy's 3x3 'same' convolution, channels last
        img = np.pad(x.transpose(0, 2, 3, 1) if nchw else x, [(0, 0), (1, 1), (1, 1), (0, 0)])
        w = weight.transpose(2, 3, 1, 0) if nchw else weight        # [3, 3, in per group, n]
        want = np.zeros((1, 4, 4, n), np.int64)
        for i in range(3):
            for j in range(3):
                window = img[:, i:i + 4, j:j + 4, :]
                want += window * w[i, j, 0] if kind == "depthwise" else window @ w[i, j]
        want = want + bias.reshape(n)
        want = want.transpose(0, 3, 1, 2) if nchw else want
    (got,) = llvm_reference(mod)(x.astype(np.int8))
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match=r"k \(5\) must equal n \(3\)"):
        int8_layer("depthwise", 4, 3, 5, lambda bb, y: y)
    with pytest.raises(ValueError, match="kind 'dense'"):
        int8_layer("dense", 4, 3, 5, lambda bb, y: y)


def _constants(mod) -> list:
    """The module's constants in order of use (the weight, then the bias)."""
    found = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: found.append(e) if isinstance(e, tvm.ir.GenericConst)
                                    else None)
    return found
