"""accel.build on topi's conv2d (NCHW and NHWC): bit-exact vs numpy, and what the report says."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import te, topi

import accel
import tirpat as tp

SHIFT = 6


def reference_conv(x, w, layout, stride, padding, dilation):
    """conv2d in int64, wrapped to int32 as the hardware does; x, w in ``layout`` (OIHW / HWIO).
    ``stride``/``dilation`` are ints or (h, w); ``padding`` an int or (top, left, bottom, right)."""
    (sh, sw), (dh, dw) = ((v, v) if isinstance(v, int) else v for v in (stride, dilation))
    top, left, bottom, right = (padding,) * 4 if isinstance(padding, int) else padding
    x, w = x.astype(np.int64), w.astype(np.int64)
    if layout == "NCHW":
        x, w = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)
    kh, kw, _, f = w.shape
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    oh = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((x.shape[0], oh, ow, f), np.int64)
    for i in range(kh):
        for j in range(kw):
            y0, x0 = i * dh, j * dw
            out += xp[:, y0:y0 + sh * (oh - 1) + 1:sh, x0:x0 + sw * (ow - 1) + 1:sw, :] @ w[i, j]
    out = (out + 2**31) % 2**32 - 2**31
    return out.transpose(0, 3, 1, 2) if layout == "NCHW" else out


def conv_workload(layout, n, c, h, w, f, k, stride, padding, dilation=1, epilogue="none"):
    """``(prim_func, make_inputs, reference)`` for topi's conv2d with an optional epilogue:
    ``bias``, ``bias_relu`` or ``requant`` (bias, ReLU, rounding shift, saturate to int8)."""
    if layout == "NCHW":
        X = te.placeholder((n, c, h, w), "int8", name="X")
        W = te.placeholder((f, c, k, k), "int8", name="W")
        acc = topi.nn.conv2d_nchw(X, W, stride, padding, dilation, out_dtype="int32")
        fdim = 1
    else:
        X = te.placeholder((n, h, w, c), "int8", name="X")
        W = te.placeholder((k, k, c, f), "int8", name="W")
        acc = topi.nn.conv2d_nhwc(X, W, stride, padding, dilation, out_dtype="int32")
        fdim = 3
    params, out = [X, W], acc
    if epilogue != "none":
        B = te.placeholder((f,), "int32", name="bias")
        params.append(B)
        out = te.compute(acc.shape, lambda *i: acc(*i) + B[i[fdim]], name="bias_add")
    if epilogue in ("bias_relu", "requant"):
        out = topi.nn.relu(out)
    if epilogue == "requant":
        r = out
        out = te.compute(r.shape, lambda *i: te.max(te.min((r(*i) + (1 << (SHIFT - 1))) >> SHIFT, 127), -128)
                         .astype("int8"), name="requant")
    shape = [int(d) for d in out.shape]

    def inputs(rng):
        args = [rng.integers(-128, 128, [int(d) for d in t.shape], dtype=np.int8) for t in (X, W)]
        if epilogue != "none":
            args.append(rng.integers(-3000, 3000, (f,), dtype=np.int32))
        return args, np.zeros(shape, "int8" if epilogue == "requant" else "int32")

    def reference(x, wt, bias=None):
        r = reference_conv(x, wt, layout, stride, padding, dilation)
        if bias is not None:
            r = r + bias.reshape((1, -1, 1, 1) if layout == "NCHW" else (1, 1, 1, -1))
            r = (r + 2**31) % 2**32 - 2**31
        if epilogue in ("bias_relu", "requant"):
            r = np.maximum(r, 0)
        if epilogue == "requant":
            return np.clip((r + (1 << (SHIFT - 1))) >> SHIFT, -128, 127).astype(np.int8)
        return r.astype(np.int32)

    return te.create_prim_func(params + [out]), inputs, reference


def run(func, inputs, reference, seed=0):
    ex = accel.build(func)
    args, out = inputs(np.random.default_rng(seed))
    with accel.Session() as s:
        ex(*args, out)
    np.testing.assert_array_equal(out, reference(*args))
    return ex, s


@settings(max_examples=40)
@given(layout=st.sampled_from(["NCHW", "NHWC"]), c=st.integers(1, 64), f=st.integers(1, 64),
       size=st.integers(1, 32), k=st.integers(1, 5), stride=st.integers(1, 3), padding=st.integers(0, 2),
       batch=st.integers(1, 2), epilogue=st.sampled_from(["none", "bias", "bias_relu", "requant"]))
def test_conv2d_is_bit_exact(layout, c, f, size, k, stride, padding, batch, epilogue):
    if size + 2 * padding < k:
        k = size + 2 * padding      # the kernel must fit the padded input
    func, inputs, reference = conv_workload(layout, batch, c, size, size, f, k, stride, padding, epilogue=epilogue)
    ex, s = run(func, inputs, reference, seed=c * 100 + size)
    assert ex.report.share("accel") == 1.0
    assert s.stats.instructions["GEMM"] >= 1


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("epilogue", ["none", "bias", "bias_relu", "requant"])
def test_epilogues_run_on_the_alu(layout, epilogue):
    func, inputs, reference = conv_workload(layout, 1, 32, 9, 11, 24, 3, 1, 1, epilogue=epilogue)
    ex, s = run(func, inputs, reference)
    assert "100.0%" in str(ex.report)
    if epilogue != "none":
        assert s.stats.instructions["ALU"] + s.stats.instructions["ALU_CHAIN"] > 0
        assert ex.report.partitions[0].epilogue
    if epilogue == "requant":   # the clip is a saturating STORE or ALU MAX/MIN, then a narrowing STORE
        assert "SATURATE" in s.disassembly() or ("MIN" in s.disassembly() and "WRAP" in s.disassembly())


@pytest.mark.parametrize("stride,dilation", [(2, 1), (1, 2), (3, 2)])
def test_strides_and_dilation(stride, dilation):
    func, inputs, reference = conv_workload("NHWC", 2, 16, 13, 10, 20, 3, stride, 2, dilation)
    run(func, inputs, reference)


@pytest.mark.parametrize("layout,h,w,c,kh,kw,stride,padding,dilation", [
    ("NHWC", 9, 13, 32, 3, 1, (2, 1), (1, 0, 0, 0), (1, 2)),
    ("NCHW", 9, 13, 32, 1, 3, (1, 3), (0, 2, 1, 1), (2, 1)),
    ("NHWC", 12, 7, 3, 5, 3, (1, 2), (2, 1, 2, 1), (1, 1)),
])
def test_rectangular_kernels_and_asymmetric_padding(layout, h, w, c, kh, kw, stride, padding, dilation):
    f = 24
    if layout == "NCHW":
        X, W = te.placeholder((2, c, h, w), "int8", name="X"), te.placeholder((f, c, kh, kw), "int8", name="W")
        out = topi.nn.conv2d_nchw(X, W, stride, padding, dilation, out_dtype="int32")
    else:
        X, W = te.placeholder((2, h, w, c), "int8", name="X"), te.placeholder((kh, kw, c, f), "int8", name="W")
        out = topi.nn.conv2d_nhwc(X, W, stride, padding, dilation, out_dtype="int32")
    shapes = [[int(d) for d in t.shape] for t in (X, W, out)]

    def inputs(rng):
        return [rng.integers(-128, 128, s, dtype=np.int8) for s in shapes[:2]], np.zeros(shapes[2], np.int32)

    ex, _ = run(te.create_prim_func([X, W, out]), inputs,
                lambda x, wt: reference_conv(x, wt, layout, stride, padding, dilation))
    assert ex.report.share("accel") == 1.0


def test_nhwc_gathers_by_strided_loads():
    func, inputs, reference = conv_workload("NHWC", 1, 64, 12, 12, 32, 1, 2, 0)
    ex, _ = run(func, inputs, reference)
    text = ex.report.text(verbose=True)
    assert "im2col gather by strided, padded LOADs from X" in text
    # 1x1, no padding, channels-last: only the weight reorder is left on the CPU
    assert [name for name, _ in ex.report.partitions[0].on_host] == ["W_global"]


def test_nhwc_padding_is_done_by_the_loads():
    func, inputs, reference = conv_workload("NHWC", 1, 16, 7, 7, 16, 3, 1, 2)
    ex, s = run(func, inputs, reference)
    assert [name for name, _ in ex.report.partitions[0].on_host] == ["W_global"]
    text = s.disassembly()
    assert "7x16 pad=(2, 7, 0, 0)" in text      # a row of the tile: 2 pixels of left border
    assert "0x16 pad=(16, 0, 0, 0)" in text     # a kernel row above the image: all padding


def test_padding_and_nchw_are_reported():
    func, inputs, reference = conv_workload("NCHW", 1, 32, 8, 8, 16, 3, 1, 1)
    ex, _ = run(func, inputs, reference)
    why = dict(ex.report.partitions[0].on_host)
    assert "zero-pads the input and transposes it to channels-last" in why["pad_temp"]
    assert "transposes the result from channels-last to NCHW" in why["conv2d_nchw_global"]
    assert "[KH, KW, F, C]" in why["W_global"]


def test_few_channels_build_im2col_on_the_cpu():
    func, inputs, reference = conv_workload("NHWC", 1, 3, 16, 16, 16, 3, 1, 1)
    ex, _ = run(func, inputs, reference)
    assert "im2col on the CPU" in ex.report.text(verbose=True)
    assert any("builds the im2col matrix on the CPU" in why for _, why in ex.report.partitions[0].on_host)


def test_depthwise_convs_run_on_dwmac_and_grouped_ones_stay_on_the_cpu():
    X = te.placeholder((1, 8, 10, 10), "int8", name="X")
    for W, conv in ((te.placeholder((8, 1, 3, 3), "int8", name="W"),
                     lambda X, W: topi.nn.depthwise_conv2d_nchw(X, W, 1, 1, 1, out_dtype="int32")),
                    (te.placeholder((8, 4, 3, 3), "int8", name="W"),
                     lambda X, W: topi.nn.group_conv2d_nchw(X, W, 1, 1, 1, 2, out_dtype="int32"))):
        out = conv(X, W)
        depthwise = int(W.shape[1]) == 1
        if depthwise:
            ex = accel.build(te.create_prim_func([X, W, out]))
            assert ex.report.share("accel") == 1.0
        else:
            with pytest.warns(tp.OffloadWarning, match="a grouped convolution with several channels per group"):
                ex = accel.build(te.create_prim_func([X, W, out]))
            assert ex.report.share("accel") == 0.0
        x = np.random.default_rng(0).integers(-128, 128, (1, 8, 10, 10), dtype=np.int8)
        w = np.random.default_rng(1).integers(-128, 128, [int(d) for d in W.shape], dtype=np.int8)
        got = np.zeros([int(d) for d in out.shape], np.int32)
        with accel.Session() as s:
            ex(x, w, got)
        # over the image: 10 rows of a virtual width of 12 (the padded input's), 4 a block of
        # 3 tiles, padded to 12 rows: 9 tiles of 16 pixels x 16 channels (row by row, 10)
        assert s.stats.instructions["DWMAC"] == (9 if depthwise else 0)
        groups = 8 // int(W.shape[1])
        want = np.concatenate([
            reference_conv(x[:, g * (8 // groups):(g + 1) * (8 // groups)], w[g * (8 // groups):(g + 1) * (8 // groups)],
                           "NCHW", 1, 1, 1) for g in range(groups)], axis=1)
        np.testing.assert_array_equal(got, want)
