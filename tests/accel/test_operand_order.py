"""An epilogue offloads whatever the order of its operands: ``R.add(b, x @ w)`` as well as
``R.add(x @ w, b)``, a residual added on either side, for matmul and conv2d, with and
without a ReLU or a requantise; bit-exact against ``tvm.compile(mod, "llvm")``."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import relax as R

from tirpat.testing.differential import assert_matches_llvm


def model(kind, layout, m, n, k, bias_left, residual, tail, seed=0):
    """A Relax module: matmul ([m, k] x [k, n]) or a 3x3 conv2d (an m x m image, k input and n
    output channels), plus a bias on the left or right, an int32 residual input added on
    the ``residual`` side (or None), then ``tail``: nothing, ReLU or a requantise to int8."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()

    def const(shape, dtype, lo, hi):
        return relax.const(rng.integers(lo, hi, shape).astype(dtype))

    if kind == "matmul":
        x_shape, out_shape = (m, k), (m, n)
    else:
        x_shape = (1, m, m, k) if layout == "NHWC" else (1, k, m, m)
        out_shape = (1, m, m, n) if layout == "NHWC" else (1, n, m, m)
    x = relax.Var("x", R.Tensor(x_shape, "int8"))
    params = [x]
    if residual:
        params.append(relax.Var("r", R.Tensor(out_shape, "int32")))
    with bb.function("main", params):
        with bb.dataflow():
            if kind == "matmul":
                acc = relax.op.matmul(x, const((k, n), "int8", -128, 128), out_dtype="int32")
                b = const((n,), "int32", -3000, 3000)
            else:
                w = const((3, 3, k, n) if layout == "NHWC" else (n, k, 3, 3), "int8", -128, 128)
                acc = relax.op.nn.conv2d(x, w, padding=1, data_layout=layout, out_dtype="int32",
                                         kernel_layout="HWIO" if layout == "NHWC" else "OIHW")
                b = const((1, 1, 1, n) if layout == "NHWC" else (1, n, 1, 1), "int32", -3000, 3000)
            acc = bb.emit(acc)
            y = bb.emit(relax.op.add(b, acc) if bias_left else relax.op.add(acc, b))
            if residual == "left":
                y = bb.emit(relax.op.add(params[1], y))
            elif residual == "right":
                y = bb.emit(relax.op.add(y, params[1]))
            if tail == "relu":
                y = bb.emit(relax.op.nn.relu(y))
            elif tail == "requant":
                shifted = relax.op.right_shift(relax.op.add(y, relax.const(32, "int32")), relax.const(6, "int32"))
                y = bb.emit(relax.op.astype(relax.op.clip(shifted, -128, 127), "int8"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("kind", ["matmul", "conv"])
def test_a_bias_on_the_left_offloads_like_one_on_the_right(kind):
    # the new-user trial's model: R.add(b, R.matmul(x, w)); and the same for conv2d
    for bias_left in (True, False):
        compiled = assert_matches_llvm(model(kind, "NHWC", 20, 24, 40 if kind == "matmul" else 16, bias_left, None,
                                             "none"), "accel, llvm", calls=1, seed=1, strict=True)
        (part,) = compiled.report.partitions
        assert part.epilogue == ["bias"] and compiled.report.macs["host"] == 0


@settings(max_examples=6, deadline=None)
@given(st.sampled_from([("matmul", "NHWC"), ("conv", "NHWC"), ("conv", "NCHW")]), st.integers(1, 24),
       st.integers(1, 24), st.integers(2, 24), st.booleans(), st.sampled_from([None, "left", "right"]),
       st.sampled_from(["none", "relu", "requant"]))
def test_every_operand_order_is_bit_exact(kind_layout, m, n, k, bias_left, residual, tail):
    kind, layout = kind_layout
    if kind == "conv":
        m = 1 + m % 9
    compiled = assert_matches_llvm(model(kind, layout, m, n, k, bias_left, residual, tail), "accel, llvm", calls=1,
                                   seed=1, strict=True)
    (part,) = compiled.report.partitions
    assert compiled.report.macs["host"] == 0
    # (a residual one row or one column wide is applied, and named, as a bias; the bias of a
    # single output channel is a constant the requantise's rounding add absorbs: named so)
    absorbed = n == 1 and tail == "requant" and residual is None
    assert ("bias" in part.epilogue or absorbed) and (residual is not None or "residual add" not in part.epilogue)
    assert not absorbed or part.epilogue == ["requantise"]
