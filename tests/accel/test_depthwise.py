"""Depthwise convolutions on accel's DWMAC, from Relax: ``relax.nn.conv2d`` with groups =
channels (NCHW/OIHW and NHWC/HWIO; kernels 3x3 and 5x5, strides 1 and 2, dilations 1 and 2,
any padding) with
the dense convolutions' fused epilogue (bias, ReLU, requantise to int8) built by
``tp.build(..., "accel, llvm")``, bit-exact against ``tvm.compile(..., "llvm")`` of the same
module; every multiply-accumulate on accel, one DWMAC per 16 x 16 output tile; what stays on
the host says why (a grouped convolution that is not depthwise)."""

import math

import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import tirpat as tp
from tirpat.testing.differential import assert_matches_llvm

SHIFT = 7


def depthwise_module(layout: str, c: int, h: int, w: int, k: int, stride: int, padding, epilogue: str,
                     groups: int | None = None, per_group_out: int = 1, dilation: int = 1) -> tvm.IRModule:
    """``main(x, w[, bias])``: an int8 depthwise conv2d (int32 result) and its epilogue:
    ``none``, ``bias``, ``bias_relu``, ``requant`` (bias, ReLU, rounding shift, clip, cast to int8)
    or ``residual`` (bias, then an int32 tensor of the output's shape added)."""
    groups = groups or c
    f = groups * per_group_out
    cin = c // groups
    bb = relax.BlockBuilder()
    if layout == "NCHW":
        x = relax.Var("x", relax.TensorType((1, c, h, w), "int8"))
        wt = relax.Var("w", relax.TensorType((f, cin, k, k), "int8"))
        kernel, bias_shape = "OIHW", (1, f, 1, 1)
    else:
        x = relax.Var("x", relax.TensorType((1, h, w, c), "int8"))
        wt = relax.Var("w", relax.TensorType((k, k, cin, f), "int8"))
        kernel, bias_shape = "HWIO", (1, 1, 1, f)
    params = [x, wt]
    if epilogue != "none":
        params.append(relax.Var("bias", relax.TensorType(bias_shape, "int32")))
    conv = relax.op.nn.conv2d(x, wt, strides=stride, padding=padding, dilation=dilation, groups=groups,
                              data_layout=layout, kernel_layout=kernel, out_dtype="int32")
    if epilogue == "residual":
        params.append(relax.Var("r", relax.TensorType(bb.normalize(conv).ty.shape, "int32")))
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit(conv)
            if epilogue != "none":
                out = bb.emit(relax.op.add(out, params[2]))
            if epilogue == "residual":
                out = bb.emit(relax.op.add(out, params[3]))
            if epilogue in ("bias_relu", "requant"):
                out = bb.emit(relax.op.nn.relu(out))
            if epilogue == "requant":
                out = bb.emit(relax.op.right_shift(relax.op.add(out, relax.const(1 << (SHIFT - 1), "int32")),
                                                   relax.const(SHIFT, "int32")))
                out = bb.emit(relax.op.astype(relax.op.clip(out, -128, 127), "int8"))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


@given(st.sampled_from(["NCHW", "NHWC"]), st.sampled_from([8, 16, 24, 40]), st.integers(1, 12),
       st.integers(1, 21) | st.sampled_from([15, 17, 20, 31, 33, 40]), st.sampled_from([3, 5]), st.sampled_from([1, 2]),
       st.integers(0, 2), st.sampled_from(["none", "bias", "bias_relu", "requant", "residual"]), st.integers(0, 1000),
       st.sampled_from([1, 1, 2]))
def test_depthwise_conv_on_accel_is_bit_exact_with_llvm(layout, c, h, w, k, stride, pad, epilogue, seed, dilation):
    pad = min(pad, k // 2)
    span = (k - 1) * dilation + 1
    h, w = h + max(0, span - h - 2 * pad), w + max(0, span - w - 2 * pad)     # the kernel fits the padded image
    mod = depthwise_module(layout, c, h, w, k, stride, pad, epilogue, dilation=dilation)
    # the third call replays the stream in the simulator's batched plan (accel.hw.fused)
    model = assert_matches_llvm(mod, "accel, llvm", seed=seed)
    stats = model.stats.get("accel")
    oh, ow = (h + 2 * pad - span) // stride + 1, (w + 2 * pad - span) // stride + 1
    if oh == ow == 1:       # one output pixel: no tile of pixels to gather, the host computes it
        assert model.report.share("accel") == 0.0 and "its output is one pixel" in model.report.text(verbose=True)
        return
    assert model.report.share("accel") == 1.0 and stats is not None
    rows = oh * -(-ow // 16) if ow > 1 else -(-oh // 16)      # one pixel wide: down the column
    # or over the image: rows of a virtual width, the padded input's or a little more, whole
    # tiles every few rows (the rows padded to whole blocks of them)
    padded = w + 2 * pad
    image = [-(-oh // (16 // math.gcd(width, 16))) * width // math.gcd(width, 16)
             for width in range(padded, padded + 16) if width // math.gcd(width, 16) <= 16] if ow > 1 < oh else []
    tiles = stats.instructions["DWMAC"] // -(-c // 16)
    assert tiles in (rows, *image) and stats.macs == stats.instructions["DWMAC"] * k * k * 256


def test_asymmetric_padding_and_the_report():
    mod = depthwise_module("NHWC", 24, 9, 30, 3, 2, (0, 1, 1, 0), "requant")
    model = assert_matches_llvm(mod, "accel, llvm", seed=1)
    text = model.report.text(verbose=True)
    assert "DWMAC reads a row of channels per kernel tap" in text and model.report.share("accel") == 1.0


def test_a_grouped_convolution_stays_on_the_host_and_says_why():
    mod = depthwise_module("NCHW", 16, 8, 8, 3, 1, 1, "none", groups=4)
    with pytest.warns(tp.OffloadWarning, match="a grouped convolution \\(groups = 4, 4 input and 1 output"):
        model = tp.build(mod, "accel, llvm")
    assert model.report.share("accel") == 0.0
    mod = depthwise_module("NHWC", 8, 8, 8, 3, 1, 1, "none", per_group_out=2)
    with pytest.warns(tp.OffloadWarning, match="1 input and 2 output channels per group"):
        tp.build(mod, "accel, llvm")


def legalized(mod: tvm.IRModule) -> tvm.tirx.PrimFunc:
    """The one PrimFunc of ``mod`` (a conv2d and its epilogue), legalized and fused as a
    partition is."""
    for step in (relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
                 relax.transform.FuseTIR()):
        mod = step(mod)
    [func] = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func.with_attr("global_symbol", "main")


@given(st.sampled_from(["NCHW", "NHWC"]), st.sampled_from([8, 24]), st.integers(2, 9),
       st.integers(2, 21) | st.sampled_from([15, 17, 20, 31, 33, 40]), st.sampled_from([3, 5]), st.sampled_from([1, 2]),
       st.integers(0, 2), st.sampled_from(["none", "requant", "residual"]), st.sampled_from([1, 2]),
       st.integers(0, 1000))
def test_over_the_image_is_bit_exact_with_llvm_and_never_stores_the_garbage_columns(layout, c, h, w, k, stride, pad,
                                                                                    epilogue, dilation, seed):
    """``pixels="image"`` forced: DWMAC tiles that span image rows (virtual rows a little wider
    than the padded input, the columns past a row's end computed from the next row's pixels)
    give llvm's result bit for bit, the output's every element written by the STOREs alone of
    its valid pixels (an output filled with a marker first keeps no marker where llvm writes,
    and writes nothing else: it has no other elements); refused, saying why, where the
    image has no such layout (one row high, one pixel wide; one pixel in all stays on the host)."""
    import numpy as np
    from tvm import ir, s_tir

    import accel
    from accel.compiler.schedule import Knobs, ScheduleError, gemm_blocks

    pad = min(pad, k // 2)
    span = (k - 1) * dilation + 1
    h, w = h + max(0, span - h - 2 * pad), w + max(0, span - w - 2 * pad)
    func = legalized(depthwise_module(layout, c, h, w, k, stride, pad, epilogue, dilation=dilation))
    sch = s_tir.Schedule(ir.IRModule({"main": func}))
    [(name, _)] = gemm_blocks(sch, with_depthwise=True)
    Knobs(pixels="image").annotate(sch, sch.get_sblock(name))
    rng = np.random.default_rng(seed)
    params = [p for p in func.params if tvm.tirx.is_buffer_var(p)]
    args = [rng.integers(-128, 128, [int(d) for d in p.shape]).astype(str(p.dtype)) for p in params[:-1]]
    out = params[-1]
    oh, ow = (h + 2 * pad - span) // stride + 1, (w + 2 * pad - span) // stride + 1
    try:
        ex = accel.build(sch.mod["main"])
    except ScheduleError as err:
        assert oh == 1 or ow == 1
        assert "one row high" in str(err)
        return
    # (one output pixel: no tile at all, the host computes it)
    marker = np.full([int(d) for d in out.shape], 77, str(out.dtype))
    got = [*(a.copy() for a in args), marker.copy()]
    with accel.Session():
        ex(*got)
    want = [tvm.runtime.tensor(a) for a in (*args, marker)]
    tvm.compile(ir.IRModule({"main": func}), "llvm")["main"](*want)
    np.testing.assert_array_equal(got[-1], want[-1].numpy())


@settings(max_examples=6)
@given(st.sampled_from(["NCHW", "NHWC"]), st.sampled_from([8, 24]), st.integers(1, 9),
       st.integers(1, 21) | st.sampled_from([17, 20, 33]), st.sampled_from([3, 5]), st.sampled_from([1, 2]),
       st.integers(0, 2), st.sampled_from([1, 2]), st.sampled_from([None, "row", "image"]), st.integers(0, 1000))
def test_a_tile_reads_one_band_per_kernel_row_not_one_load_per_tap(layout, c, h, w, k, stride, pad, dilation, pixels,
                                                                    seed):
    """Each DWMAC's input is ``k`` INP LOADs, one per kernel row (a band of the
    ``15*stride + (k - 1)*dilation + 1`` input pixels its taps read, border padding
    included), not ``k*k`` tiles of 16 pixels, whichever way the pixels run (along the
    rows, over the image, down a one-pixel-wide output's column); DWMAC reads tap ``rx``
    ``rx*dilation`` rows into its band, rows ``stride*16`` apart; the result is llvm's bit
    for bit."""
    import numpy as np
    from tvm import ir, s_tir

    import accel
    from accel.compiler.schedule import Knobs, ScheduleError, gemm_blocks

    pad = min(pad, k // 2)
    span = (k - 1) * dilation + 1
    h, w = h + max(0, span - h - 2 * pad), w + max(0, span - w - 2 * pad)
    oh, ow = (h + 2 * pad - span) // stride + 1, (w + 2 * pad - span) // stride + 1
    if oh == ow == 1:
        return      # no tile of pixels: the host computes it (test_depthwise_conv_on_accel_is_bit_exact_with_llvm)
    func = legalized(depthwise_module(layout, c, h, w, k, stride, pad, "requant", dilation=dilation))
    sch = s_tir.Schedule(ir.IRModule({"main": func}))
    [(name, _)] = gemm_blocks(sch, with_depthwise=True)
    Knobs(pixels=pixels).annotate(sch, sch.get_sblock(name))
    try:
        ex = accel.build(sch.mod["main"])
    except ScheduleError:
        assert pixels == "image" and 1 in (oh, ow)      # no layout over the image: it runs along its rows already
        return
    rng = np.random.default_rng(seed)
    args = [rng.integers(-128, 128, [int(d) for d in p.shape]).astype(str(p.dtype))
            for p in func.params if tvm.tirx.is_buffer_var(p)]
    want = [tvm.runtime.tensor(a) for a in args]
    tvm.compile(ir.IRModule({"main": func}), "llvm")["main"](*want)
    with accel.Session() as session:
        ex(*args)
    np.testing.assert_array_equal(args[-1], want[-1].numpy())
    stream = accel.decode(session.stream())
    dwmacs = [i for i in stream if isinstance(i, accel.Dwmac)]
    bands = [i for i in stream if isinstance(i, accel.Load) and i.mem == accel.Mem.INP]
    rows = 15 * stride + (k - 1) * dilation + 1
    assert dwmacs and len(bands) == k * len(dwmacs)
    assert {b.pad_top + b.rows + b.pad_bottom for b in bands} == {rows}
    assert {(d.inp_ld, d.ext_out * d.ext_in) for d in dwmacs} == {(16 * stride, k * k)}
    assert sorted((d.inp_stride_out, d.inp_stride_in) for d in dwmacs[:1])[0] in \
        ((rows * 16, dilation * 16), (dilation * 16, rows * 16))
