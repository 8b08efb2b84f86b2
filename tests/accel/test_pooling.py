"""Pooling on accel (:mod:`accel.compiler.pooling`).

Max pooling: an int8 ``max_pool2d`` (NCHW and NHWC, any window, stride and padding) runs on
the ALU (``MAX`` over ACC tiles, the border as the LOADs' padding), bit-exact against llvm over
three calls; one the ALU cannot run stays on the host and says why.

Average pooling: integerize's global sums
``sum(astype(x, int32), axis=[2, 3])`` and disjoint-window sums ``sum(reshape(astype(x, int32),
[n, c, h/kh, kh, w/kw, kw]), axis=[3, 5])`` of an int8 tensor, with the rescale after them, run
on accel as convolutions with a weight of ones (a GEMM with one output column; DWMAC),
bit-exact against ``tvm.compile(..., "llvm")`` of the same module over three calls; a sum in
another form stays on the host, computed as before; a quantised ONNX model's AveragePool and
GlobalAveragePool end on accel, bit-exact against llvm of the integerised module."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import tirpat as tp
from accel.compiler.pooling import sums_as_convolutions
from tirpat.testing.differential import assert_matches_llvm


def _rescale(bb: relax.BlockBuilder, s, c: int, per_channel: bool, keepdims: bool = True):
    """integerize's requantise of a sum: clamp, multiply (one multiplier, or one per channel),
    round, shift, clip and cast to int8."""
    s = bb.emit(relax.op.maximum(s, relax.const(-36246, "int32")))
    s = bb.emit(relax.op.minimum(s, relax.const(36246, "int32")))
    if per_channel:
        shape = (1, c, 1, 1) if keepdims else (1, c)
        multiplier = relax.const(np.arange(20000, 20000 + 997 * c, 997, dtype="int32")[:c].reshape(shape))
    else:
        multiplier = relax.const(29624, "int32")
    s = bb.emit(relax.op.multiply(s, multiplier))
    s = bb.emit(relax.op.add(s, relax.const(1 << 22, "int32")))
    s = bb.emit(relax.op.right_shift(s, relax.const(23, "int32")))
    return bb.emit(relax.op.astype(relax.op.clip(s, -128, 127), "int8"))


def global_sum_module(c: int, h: int, w: int, keepdims: bool = True, per_channel: bool = False,
                      shared: bool = False, axis=(2, 3)) -> tvm.IRModule:
    """``main(x)``: integerize's global average pool of an int8 ``[1, c, h, w]`` tensor, the sum
    rescaled to int8; ``shared``: the widened input is also used by a multiply (a
    squeeze-excitation block's scale), as a second output."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, w), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wide = bb.emit(relax.op.astype(x, "int32"))
            s = bb.emit(relax.op.sum(wide, axis=list(axis), keepdims=keepdims))
            out = _rescale(bb, s, c, per_channel, keepdims)
            if shared:
                out = relax.Tuple([out, bb.emit(relax.op.multiply(wide, relax.const(3, "int32")))])
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def window_sum_module(c: int, h: int, w: int, kh: int, kw: int) -> tvm.IRModule:
    """``main(x)``: integerize's average pool of disjoint ``kh x kw`` windows of an int8 tensor."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, w), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            tiles = bb.emit(relax.op.reshape(relax.op.astype(x, "int32"), [1, c, h // kh, kh, w // kw, kw]))
            s = bb.emit(relax.op.sum(tiles, axis=[3, 5]))
            out = bb.emit_output(_rescale(bb, s, c, False))
        bb.emit_func_output(out)
    return bb.get()


def _host_ops(model) -> list[str]:
    return [h["op"] for h in model.report.to_json()["on_host"]]


@settings(max_examples=15)   # each example builds and runs a model
@given(st.integers(1, 70), st.integers(1, 12), st.integers(1, 40), st.booleans(), st.booleans(), st.booleans(),
       st.integers(0, 1000))
def test_global_sum_and_rescale_run_on_accel_bit_exact(c, h, w, keepdims, per_channel, shared, seed):
    model = assert_matches_llvm(global_sum_module(c, h, w, keepdims, per_channel, shared), "accel, llvm", seed=seed)
    host = _host_ops(model)
    if h * w == 1:      # a sum of one value is its widening: left to the host
        assert "relax.sum" in host
        return
    # the sum and its whole rescale are one accel partition; a reshape (a view) only where the
    # convolution's result has another shape than the sum's
    assert "relax.sum" not in host and "relax.right_shift" not in host, host
    assert set(host) <= {"relax.reshape", "relax.astype", "relax.multiply"}, host
    # (with H = C = 1 and keepdims the [N, 1, C, W] view is x's own shape: that reshape is no reshape)
    assert host.count("relax.reshape") == (0 if h > 1 and keepdims else 1 if h > 1 or (c == 1 and keepdims)
                                           else 2), host
    (partition,) = model.report.partitions
    assert partition.pattern == "accel.conv2d" and "requantise" in partition.epilogue
    assert model.report.share("accel") == 1.0
    stats = model.stats["accel"]
    # one output column (of 16): M = C channels, K = H*W values, padded to whole tiles (K per
    # kernel row of W values, then to whole blocks of tiles, which pad by at most an eighth)
    assert 16 * c * h * w <= stats.macs <= 16 * -(-c // 16) * 16 * h * -(-w // 16) * 16 * 9 // 8
    assert stats.instructions["GEMM"] > 0


@settings(max_examples=12)
@given(st.integers(1, 40), st.integers(1, 5), st.integers(1, 12), st.sampled_from([1, 2, 3]),
       st.sampled_from([1, 2, 4]), st.integers(0, 1000))
def test_disjoint_window_sums_run_on_dwmac_bit_exact(c, rows, cols, kh, kw, seed):
    h, w = rows * kh, cols * kw
    model = assert_matches_llvm(window_sum_module(c, h, w, kh, kw), "accel, llvm", seed=seed)
    host = _host_ops(model)
    if kh * kw == 1:        # windows of one value: only a widening, left to the host
        assert "relax.sum" in host
        return
    stats = model.stats["accel"]
    if rows == cols == 1:   # one window: the global sum's GEMM (one output pixel is no DWMAC tile)
        assert host == ([] if kh > 1 else ["relax.reshape"] * 2) and stats.instructions["GEMM"] > 0, host
        return
    assert host == [], host
    if c == 1:              # one group: the convolution with a 1-channel kernel of ones is a GEMM
        assert stats.instructions["DWMAC"] == 0 and stats.instructions["GEMM"] > 0
        return
    tiles = (rows * -(-cols // 16) if cols > 1 else -(-rows // 16)) * -(-c // 16)     # one column wide: down it
    assert stats.instructions["DWMAC"] == tiles and stats.macs == tiles * kh * kw * 256


def test_sums_in_other_forms_stay_on_the_host():
    """A sum over the channels, or of an int32 tensor that is not a widened int8 one, is no
    pool: the pass leaves it, and the host computes it."""
    mod = global_sum_module(8, 4, 4, axis=(1,))
    assert tvm_ffi_equal(sums_as_convolutions()(mod), mod)
    model = assert_matches_llvm(mod, "accel, llvm", seed=0)
    assert "relax.sum" in _host_ops(model)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 4, 4), "int32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.sum(x, axis=[2, 3], keepdims=True))
        bb.emit_func_output(out)
    assert tvm_ffi_equal(sums_as_convolutions()(bb.get()), bb.get())


def tvm_ffi_equal(a, b) -> bool:
    import tvm_ffi

    return tvm_ffi.structural_equal(a, b)


def _ops(mod) -> list:
    return [(str(b.value.op.name), [int(d) for d in b.var.ty.shape.values])
            for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]


def test_the_sum_becomes_a_convolution_and_the_rescale_moves_where_its_shape_differs():
    """With H > 1 the convolution's result is the sum's ``[N, C, 1, 1]``: the sum is replaced
    and the rescale stays as it is. With H = 1 (or a sum that drops the pooled dimensions) the
    chain after the sum runs on the convolution's result, one reshape (a view) back to the
    sum's shape after its cast, a per-channel multiplier re-laid with it."""
    ops = _ops(sums_as_convolutions()(global_sum_module(8, 3, 5, per_channel=True)))
    assert ops[0] == ("relax.nn.conv2d", [1, 8, 1, 1]) and "relax.reshape" not in [op for op, _ in ops]
    assert [op for op, _ in ops[1:]] == ["relax.maximum", "relax.minimum", "relax.multiply", "relax.add",
                                         "relax.right_shift", "relax.clip", "relax.astype"]
    for h, keepdims, shape in ((1, True, [1, 8, 1, 1]), (3, False, [1, 8])):
        ops = _ops(sums_as_convolutions()(global_sum_module(8, h, 5, keepdims, per_channel=True)))
        result = [1, 1, 8, 1] if h == 1 else [1, 8, 1, 1]
        assert ops[-2:] == [("relax.astype", result), ("relax.reshape", shape)]
        assert ("relax.nn.conv2d", result) in ops and ("relax.multiply", result) in ops
        assert "relax.sum" not in [op for op, _ in ops]


def test_quantised_average_pools_end_on_accel():
    """onnx_cnn's residual model (2x2 AveragePool, GlobalAveragePool after convolutions),
    quantised per tensor: both pools run on accel, bit-exact against llvm of the integerised
    module."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tvm.relax.frontend.onnx import from_onnx

    from tirpat.testing import onnx_cnn

    model = onnx_cnn.residual(seed=1)
    mod = from_onnx(tp.quantize(model, onnx_cnn.calibration(model, 16)), keep_params_in_input=False)
    integer = tp.integerize()(mod)
    assert [str(c.op.name) for c in tp.model.integerize.calls(integer["main"])].count("relax.sum") == 2
    rng = np.random.default_rng(4)
    compiled = assert_matches_llvm(mod, "accel, llvm", reference=integer,
                                   inputs=lambda _: [rng.standard_normal((1, 3, 16, 16)).astype(np.float32)])
    host = _host_ops(compiled)
    assert "relax.sum" not in host and "relax.nn.conv2d" not in host, host


def max_pool_module(layout: str, c: int, h: int, w: int, window, strides, padding, dilation=(1, 1),
                    dtype: str = "int8", ceil_mode: bool = False) -> tvm.IRModule:
    """``main(x)``: a ``max_pool2d`` of ``x`` ([1, c, h, w] or [1, h, w, c])."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, w) if layout == "NCHW" else (1, h, w, c), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.max_pool2d(x, pool_size=window, strides=strides, padding=padding,
                                                        dilation=dilation, layout=layout, ceil_mode=ceil_mode))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=20)
@given(st.sampled_from(["NCHW", "NHWC"]), st.integers(1, 40), st.integers(1, 20), st.integers(1, 20),
       st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3),
       st.lists(st.integers(0, 3), min_size=4, max_size=4), st.booleans(), st.integers(0, 1000))
def test_max_pool_runs_on_the_alu_bit_exact(layout, c, h, w, kh, kw, sh, sw, pads, ceil_mode, seed):
    """Any window, stride and padding; ``ceil_mode`` (PyTorch's and Caffe's exports) adds a last,
    partial window."""
    top, left, bottom, right = [min(p, k - 1) for p, k in zip(pads, (kh, kw, kh, kw))]
    h, w = max(h, kh - top - bottom), max(w, kw - left - right)     # at least one window
    mod = max_pool_module(layout, c, h, w, (kh, kw), (sh, sw), (top, left, bottom, right), ceil_mode=ceil_mode)
    model = assert_matches_llvm(mod, "accel, llvm", seed=seed)
    assert _host_ops(model) == []
    (partition,) = model.report.partitions
    assert partition.pattern == "accel.pool"
    out = [int(d) for d in mod["main"].ret_ty.shape.values]
    oh, ow = out[2:] if layout == "NCHW" else out[1:3]
    tiles = oh * -(-ow // 16) * -(-c // 16)
    counts = model.stats["accel"].instructions
    # per tile of 16 pixels x 16 channels: a reset, a LOAD per window row, a MAX per window
    # element and the subtraction of the offset, a STORE
    assert (counts["GEMM"], counts["LOAD"], counts["ALU"], counts["STORE"]) == \
        (tiles, tiles * kh, tiles * (kh * kw + 1), tiles)


@pytest.mark.parametrize("dtype, dilation, why", [
    ("float32", (1, 1), "a max pool of float32; accel pools int8 tensors"),
    ("int8", (2, 1), "a dilated max pool"),
])
def test_a_max_pool_accel_cannot_run_stays_on_the_host_and_says_why(dtype, dilation, why):
    mod = max_pool_module("NCHW", 8, 8, 8, (2, 2), (2, 2), (0, 0, 0, 0), dilation, dtype)
    with pytest.warns(tp.OffloadWarning, match=why):
        model = tp.build(mod, "accel, llvm")
    assert _host_ops(model) == ["relax.nn.max_pool2d"]
    assert why in model.report.to_json()["on_host"][0]["reason"]


def test_quantised_max_pool_ends_on_accel():
    """onnx_cnn's strided model (two stride-2 convolutions, a 2x2 MaxPool, Gemm) quantised per
    tensor: the max pool runs on accel between int8 tensors, bit-exact against llvm of the
    integerised module."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tvm.relax.frontend.onnx import from_onnx

    from tirpat.testing import onnx_cnn

    model = onnx_cnn.strided(seed=1)
    mod = from_onnx(tp.quantize(model, onnx_cnn.calibration(model, 16)), keep_params_in_input=False)
    rng = np.random.default_rng(4)
    compiled = assert_matches_llvm(mod, "accel, llvm", reference=tp.integerize()(mod),
                                   inputs=lambda _: [rng.standard_normal((1, 3, 16, 16)).astype(np.float32)])
    assert "relax.nn.max_pool2d" not in _host_ops(compiled)
    assert "accel.pool" in [p.pattern for p in compiled.report.partitions]
