"""Table activations on accel: a conv2d or matmul partition whose requantise is followed by
integerize's table lookup (``take(table, astype(x, int32) + 128)``, what sigmoid, HardSwish,
GELU, ... become) runs the lookup as accel's LUT instruction, bit for bit what
``tvm.compile(mod, "llvm")`` computes; a lookup accel cannot run stays on the host and says why."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import tirpat as tp
from tirpat.model.integerize.rules import emit_table
from tirpat.testing.differential import assert_matches_llvm
from tirpat.testing.int8_models import int8_layer
from tirpat.testing.onnx_qdq import dequantized, qdq, qdq_model

#: 256 int8 entries: random, or a function of the int8 input (HardSwish- and sigmoid-like)
TABLES = st.one_of(
    st.integers(0, 2**32 - 1).map(lambda s: np.random.default_rng(s).integers(-128, 128, 256).astype(np.int8)),
    st.just(np.clip((x := np.arange(-128, 128)) * np.clip(x + 48, 0, 96) // 96, -128, 127).astype(np.int8)),
    st.just(np.round(255 / (1 + np.exp(-np.arange(-128, 128) / 16)) - 128).astype(np.int8)),
)


def _model(kind, m, n, k, table, shift, bias, seed, clip=(-128, 127), clamp=None):
    """:func:`int8_layer`'s matmul, 3x3 NHWC conv2d or depthwise one with a per-channel bias
    (or none), a requantise by ``shift`` with ``clip`` before the cast to int8, then ``table``
    looked up as integerize emits it; ``clamp = (bound, multiplier)``: the accumulator
    clamped to +-bound and multiplied first, as integerize's fixed-point requantise writes it."""

    def epilogue(bb, y):
        if clamp is not None:
            y = bb.emit(relax.op.minimum(relax.op.maximum(y, relax.const(np.int32(-clamp[0]))),
                                         relax.const(np.int32(clamp[0]))))
            y = bb.emit(relax.op.multiply(y, relax.const(np.int32(clamp[1]))))
        y = bb.emit(relax.op.add(y, relax.const(np.int32(1 << (shift - 1)))))
        y = bb.emit(relax.op.right_shift(y, relax.const(np.int32(shift))))
        if clip is not None:
            y = bb.emit(relax.op.clip(y, *clip))
        return bb.emit(emit_table(bb.emit(relax.op.astype(y, "int8")), table))

    return int8_layer(kind, m, n, k, epilogue, seed=seed, bias=2**12 if bias else 0)


def _assert_on_accel_bit_exact(mod):
    # three calls, so that the simulator's batched plan (made at the third run of a stream) runs too
    model = assert_matches_llvm(mod, "accel, llvm", seed=1)
    report = model.report.to_json()
    assert report["macs"]["host"] == 0 and len(report["partitions"]) == 1, report
    part = report["partitions"][0]
    assert part["backend"] == "accel" and "relax.take" in part["ops"] and part["fallback"] is None, part
    assert "table" in part["epilogue"] and all("epilogue" not in why for _, why in part["on_host"]), part
    assert model.stats["accel"].instructions["LUT"] >= 1
    assert mod["main"].ret_ty.dtype == "int8"       # and the model's output is llvm's, dtype included


@settings(max_examples=6, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 48), TABLES, st.integers(1, 14), st.booleans(),
       st.integers(0, 2**16))
def test_matmul_then_table_is_bit_exact_on_accel(m, n, k, table, shift, bias, seed):
    _assert_on_accel_bit_exact(_model("matmul", m, n, k, table, shift, bias, seed))


@settings(max_examples=3, deadline=None)
@given(st.integers(2, 9), st.integers(1, 20), st.integers(1, 12), TABLES, st.integers(4, 14), st.booleans(),
       st.integers(0, 2**16))
def test_conv2d_then_table_is_bit_exact_on_accel(m, n, k, table, shift, bias, seed):
    _assert_on_accel_bit_exact(_model("conv2d", m, n, k, table, shift, bias, seed))


@settings(max_examples=2, deadline=None)
@given(st.integers(3, 9), st.integers(1, 20), TABLES, st.integers(2, 10), st.integers(0, 2**16))
def test_depthwise_conv2d_then_table_is_bit_exact_on_accel(m, n, table, shift, seed):
    _assert_on_accel_bit_exact(_model("depthwise", m, n, n, table, shift, True, seed))


def test_a_narrower_clip_before_the_table_is_taken_too():
    # ReLU6-like bounds inside int8: the LUT's index is still the int8 value
    table = np.arange(256).astype(np.uint8).astype(np.int8)
    _assert_on_accel_bit_exact(_model("matmul", 16, 16, 32, table, 6, False, 0, clip=(0, 96)))


def test_a_clip_whose_lower_end_the_simplifier_drops_is_taken_too():
    # the clamp and multiplier of PP-OCR's first convolution: the shifted value cannot go
    # below -128, so TVM keeps only min(x, 127) of the clip; the LUT's index is still x + 128
    table = np.random.default_rng(3).integers(-128, 128, 256).astype(np.int8)
    _assert_on_accel_bit_exact(_model("conv2d", 6, 16, 3, table, 23, True, 0, clamp=(21276, 50469)))


def test_a_table_after_a_wrapping_cast_is_a_lookup_of_its_own():
    # without a clip the int8 cast wraps, and accel's LUT clamps its index: not the same, so the
    # matmul's epilogue stops at the cast; the lookup of the wrapped int8 values is an element-wise
    # partition of its own (a LUT of an int8 tensor), still llvm's result
    mod = _model("matmul", 16, 16, 32, np.arange(256).astype(np.uint8).astype(np.int8), 2, False, 0, clip=None)
    model = assert_matches_llvm(mod, "accel, llvm", seed=1)
    report = model.report.to_json()
    matmul, lookup = report["partitions"]
    assert matmul["pattern"] == "accel.matmul" and "relax.take" not in matmul["ops"], matmul
    assert lookup["pattern"] == "accel.elementwise" and lookup["epilogue"] == ["table lookup"], lookup
    assert not report["on_host"] and model.stats["accel"].instructions["LUT"] == 1, report["on_host"]


@settings(max_examples=3, deadline=None)
@given(st.integers(0, 2**16), st.floats(0.02, 0.2), st.integers(-20, 20), st.booleans())
def test_hardswish_as_x_times_a_quantised_hardsigmoid_is_a_conv_and_lut_partition(seed, sc, zc, gate_first):
    """A QDQ convolution then HardSwish exported as ``x * HardSigmoid(x)`` (the gate quantised
    before the multiply, as ``tp.quantize`` leaves PaddleOCR's blocks): integerize makes the
    pair one table of the convolution's int8 output, so the whole block is one accel partition
    ending in a LUT, bit for bit llvm's result, with nothing left on the host."""
    pytest.importorskip("onnx")
    from onnx import helper
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    for part in (qdq("x", "xd", 0.02, 0),
                 dequantized("w", rng.integers(-127, 128, (8, 3, 3, 3)).astype(np.int8), 0.01),
                 ([helper.make_node("Conv", ["xd", "w"], ["c"], pads=[1, 1, 1, 1])], []),
                 qdq("c", "cd", sc, zc),
                 ([helper.make_node("HardSigmoid", ["cd"], ["g"], alpha=1 / 6, beta=0.5)], []),
                 qdq("g", "gd", 1 / 255, -128),
                 ([helper.make_node("Mul", ["gd", "cd"] if gate_first else ["cd", "gd"], ["m"])], []),
                 qdq("m", "y", sc, zc)):
        nodes, inits = nodes + part[0], inits + part[1]
    mod = from_onnx(qdq_model(nodes, inits, {"x": (1, 3, 8, 8)}, (1, 8, 8, 8)), keep_params_in_input=False)
    x = rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
    model = assert_matches_llvm(mod, "accel, llvm", calls=1, inputs=[x], reference=tp.integerize()(mod))
    report = model.report.to_json()
    parts = [p for p in report["partitions"] if p["backend"] == "accel"]
    assert len(parts) == 1 and parts[0]["ops"].count("relax.take") == 1, report["partitions"]
    assert report["macs"]["host"] == 0 and "relax.take" not in [h["op"] for h in report["on_host"]], report["on_host"]
    assert model.stats["accel"].instructions["LUT"] >= 1
