"""tirpat.model.partition.fold_constant_calls gives what relax's FoldConstant gives (which
it replaces, being faster: FoldConstant legalizes every call of a model and compiles each
foldable one alone)."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given, settings, strategies as st
from tvm import relax

from tirpat.model.partition import fold_constant_calls

_UNARY = [lambda a: relax.op.astype(a, "int32"), lambda a: relax.op.astype(a, "float32"),
          lambda a: relax.op.permute_dims(a), lambda a: relax.op.reshape(a, (-1,)),
          lambda a: relax.op.dequantize(a, relax.const(np.float32(0.5)), relax.const(np.int8(3))),
          lambda a: relax.op.negative(relax.op.astype(a, "int32"))]


def _module(steps, seed: int) -> tvm.IRModule:
    """A function of x whose bindings mix calls of constants (0-d ones too), chains of them,
    a concatenation of two, calls of x, a var-to-var binding and an unused binding."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "int32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(x, x))
            alias = bb.emit(y)
            bb.emit(relax.op.multiply(x, x))     # unused
            for op, shape in steps:
                c = relax.const(rng.integers(-5, 5, shape).astype("int8"))
                v = bb.emit(_UNARY[op](c))
                if shape == (2, 3) and op in (0, 5):
                    twice = bb.emit(relax.op.concat([v, v], axis=0))
                    y = bb.emit(relax.op.add(alias, relax.op.strided_slice(twice, [0], [0], [2])))
                elif op == 0:
                    y = bb.emit(relax.op.add(y, relax.op.sum(v)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@settings(deadline=None, max_examples=12)
@given(st.lists(st.tuples(st.integers(0, len(_UNARY) - 1), st.sampled_from([(), (2, 3), (4,)])), min_size=1,
                max_size=5), st.integers(0, 99))
def test_it_folds_what_fold_constant_folds(steps, seed):
    mod = relax.transform.ConvertToDataflow()(_module(steps, seed))
    want = relax.transform.FoldConstant()(mod)
    got = fold_constant_calls(mod)
    assert tvm_ffi.structural_equal(got, want), tvm_ffi.get_first_structural_mismatch(got, want)


def test_a_scalar_cast_stays_as_fold_constant_leaves_it():
    """astype of a 0-d constant legalizes to a constant, which FoldConstant does not take for
    a fold: the call stays, and so do the calls that use it."""
    mod = _module([(0, ())], 0)
    got = fold_constant_calls(mod)
    assert "R.astype(" in got.script()
    assert tvm_ffi.structural_equal(got, relax.transform.FoldConstant()(mod))
