"""An in-place epilogue inside a loop that repeats the accumulator's reset: the planner
must see that each iteration writes the accumulator anew before it reads it, however many
iterations the loop has.

The case from a YOLO-family detector (its DFL head): a 1x1 conv2d without bias over an
image row of thousands of pixels (4 x 8400), then a requantise. The scheduler resets one
accumulator tile, accumulates and stores it in place inside the loop over the row's more
than 64 blocks of pixels; the planner once gave up enumerating that loop and refused the
partition ("... inside loop 'yy', but the loop's next iteration reads ..."), which ran on
the host instead."""

import warnings

import numpy as np
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.script import relax as R

import tirpat as tp
from tirpat.testing.differential import assert_matches_llvm


def conv1x1_requant(layout: str, c: int, h: int, w: int, f: int, shift: int, seed: int = 0) -> tvm.IRModule:
    """``astype(clip(right_shift(conv2d_1x1(x, W), shift), -128, 127), int8)``: a 1x1 conv2d
    of an int8 image (1 x ``c`` x ``h`` x ``w`` in ``layout``) to ``f`` channels, no bias."""
    rng = np.random.default_rng(seed)
    x = relax.Var("x", R.Tensor((1, h, w, c) if layout == "NHWC" else (1, c, h, w), "int8"))
    wt = rng.integers(-128, 128, (1, 1, c, f) if layout == "NHWC" else (f, c, 1, 1)).astype("int8")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(wt), data_layout=layout, out_dtype="int32",
                                           kernel_layout="HWIO" if layout == "NHWC" else "OIHW"))
            y = bb.emit(relax.op.right_shift(y, relax.const(shift, "int32")))
            y = bb.emit(relax.op.astype(relax.op.clip(y, -128, 127), "int8"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=6, deadline=None)
@given(layout=st.sampled_from(["NCHW", "NHWC"]), c=st.sampled_from([3, 16, 24]), h=st.integers(2, 3),
       w=st.integers(16 * 64 + 1, 16 * 72), f=st.sampled_from([1, 4, 16]), shift=st.integers(0, 9))
def test_a_1x1_conv_over_a_long_row_runs_on_accel_bit_exact(layout, c, h, w, f, shift):
    mod = conv1x1_requant(layout, c, h, w, f, shift)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tp.OffloadWarning)     # a fallback to the host fails the test
        compiled = assert_matches_llvm(mod, "accel, llvm", calls=1, seed=1, strict=True, quiet=False)
    assert compiled.stats["accel"].macs > 0      # the conv ran on accel, not on the host
