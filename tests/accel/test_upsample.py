"""Upsampling on accel by DMA (:mod:`accel.compiler.upsample`): an int8 nearest resize by
integer factors and a pixel shuffle (a ConvTranspose with stride = kernel after integerize),
LOADed, widened by a DWMAC by ones and written by STOREs with an element stride
(``dram_step``), bit-exact against ``tvm.compile(..., "llvm")`` of the same module over three
calls; what accel cannot move stays on the host and says why."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import accel
import accel.hw.cycles
import accel.hw.isa
import tirpat as tp
from accel.compiler import upsample
from tirpat.testing.differential import assert_matches_llvm


def resize_module(c: int, h: int, w: int, sy: int, sx: int, dtype: str = "int8", method: str = "nearest_neighbor",
                  mode: str = "asymmetric", rounding: str = "floor") -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, h, w), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.image.resize2d(x, (h * sy, w * sx), method=method,
                                                       coordinate_transformation_mode=mode, rounding_method=rounding))
        bb.emit_func_output(y)
    return bb.get()


def shuffle_module(c: int, kh: int, kw: int, h: int, w: int, axes=(0, 1, 4, 2, 5, 3)) -> tvm.IRModule:
    """integerize's pixel shuffle of a ConvTranspose's taps: ``[1, c*kh*kw, h, w] -> [1, c, h*kh, w*kw]``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c * kh * kw, h, w), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.permute_dims(relax.op.reshape(x, [1, c, kh, kw, h, w]), list(axes))
            shape = [int(d) for d in bb.normalize(y).ty.shape.values]
            y = bb.emit_output(relax.op.reshape(y, [1, shape[1], shape[2] * shape[3], shape[4] * shape[5]]))
        bb.emit_func_output(y)
    return bb.get()


def _host_ops(model) -> list[str]:
    return [h["op"] for h in model.report.to_json()["on_host"]]


@settings(max_examples=12)   # each example builds and runs a model
@given(st.integers(1, 40), st.integers(1, 24), st.integers(1, 40), st.integers(1, 4), st.integers(1, 4),
       st.integers(0, 1000))
def test_nearest_resize_runs_on_accel_bit_exact(c, h, w, sy, sx, seed):
    if (sy, sx) == (1, 1):
        sx = 2
    model = assert_matches_llvm(resize_module(c, h, w, sy, sx), "accel, llvm", seed=seed)
    assert _host_ops(model) == []
    assert [p.pattern for p in model.report.partitions] == ["accel.upsample"]
    counts = model.stats["accel"].instructions
    # per block of input rows: its LOAD, a zeroing LOAD, one DWMAC, a STORE per output place;
    # and the ones weight's LOAD
    blocks = counts["DWMAC"]
    assert counts["STORE"] == blocks * sy * sx and counts["LOAD"] == 2 * blocks + 1
    assert counts["GEMM"] == counts["ALU"] == 0


@settings(max_examples=8)
@given(st.integers(1, 24), st.sampled_from([(2, 2), (1, 2), (3, 3), (4, 4)]), st.integers(1, 20), st.integers(1, 30),
       st.integers(0, 1000))
def test_pixel_shuffle_runs_on_accel_bit_exact(c, kernel, h, w, seed):
    kh, kw = kernel
    model = assert_matches_llvm(shuffle_module(c, kh, kw, h, w), "accel, llvm", seed=seed)
    assert _host_ops(model) == []
    counts = model.stats["accel"].instructions
    # one input plane per tap: a block of rows is kh*kw LOADs and DWMACs and one STORE each
    assert counts["STORE"] == counts["DWMAC"] and counts["DWMAC"] % (kh * kw) == 0


def test_a_detector_s_pixel_shuffle_fits_its_blocks_beside_the_last_shorter_one():
    """ppocrv6_det_small's first ConvTranspose, 24 channels of 80 x 80 pixels per tap: blocks
    of rows whose INP and ACC buffers, with those of the last shorter block, fit the planner."""
    model = assert_matches_llvm(shuffle_module(24, 2, 2, 80, 80), "accel, llvm", seed=3)
    assert _host_ops(model) == [] and not model.report.partitions[0].fallback


def test_a_large_resize_is_blocked_by_rows_and_costs_its_strided_stores():
    """A 96-channel 40 x 40 -> 80 x 80 resize (the detectors' FPN): its 3,840 input rows in
    blocks that fit ACC and INP twice over; each STORE costs its rows' span (ISA.md section 6)."""
    model = assert_matches_llvm(resize_module(96, 40, 40, 2, 2), "accel, llvm", seed=1)
    m = upsample.analyse(np.arange(96 * 40 * 40).reshape(1, 96, 40, 40).repeat(2, 2).repeat(2, 3).reshape(-1),
                         (1, 96, 40, 40), (1, 96, 80, 80))
    assert upsample.describe(m, accel.Config()) == (
        "offloaded upsampling copy: 3840 row(s) of 40 int8 elements in blocks of 320, each to 4 place(s) "
        "(factors 2 x 2, STORE dram_step 2)")
    stats = model.stats["accel"]
    # 12 blocks of 320 rows, 4 STOREs each; a strided row of 40 int8 spans 79 bytes: 2 cycles
    assert stats.instructions["STORE"] == 4 * 12 and stats.bytes["sram_to_dram"] == 96 * 80 * 80
    store = accel.hw.isa.Store(sram_addr=0, sram_ld=48, slot=0, dram_offset=0, dram_ld=160, rows=320, cols=40,
                               dram_step=2, mode=accel.hw.isa.StoreMode.WRAP)
    assert accel.hw.cycles.cost(store, accel.Config()) == 320 * 2 + accel.Config().issue_overhead


@pytest.mark.parametrize("mod, why", [
    (resize_module(4, 4, 4, 2, 2, method="linear"), "a linear resize; accel copies, it does not interpolate"),
    (resize_module(4, 4, 4, 2, 2, mode="half_pixel", rounding="floor"),
     "coordinates half_pixel and rounding floor: output y does not read input y // s"),
    (resize_module(4, 4, 4, 2, 2, dtype="float32"), "a resize of float32; accel moves int8 tensors"),
])
def test_what_accel_cannot_move_stays_on_the_host_and_says_why(mod, why):
    with pytest.warns(tp.OffloadWarning, match=why):
        model = tp.build(mod, "accel, llvm")
    assert why in model.report.to_json()["on_host"][0]["reason"] and why in str(model.report)


def test_a_transpose_that_is_no_upsampling_is_data_movement_left_to_the_host():
    """A reshape -> permute_dims -> reshape whose rows do not read consecutive input elements is
    no pixel shuffle: the report says it is data movement accel does not run (the channel
    shuffle's test: a strict build does not fail for such)."""
    with pytest.warns(tp.OffloadWarning, match="nothing was offloaded"):       # the module is this move alone
        model = tp.build(shuffle_module(2, 2, 2, 3, 3, axes=(0, 1, 5, 2, 4, 3)), "accel, llvm")
    why = "a transpose that is no upsampling: data movement accel does not run"
    assert all(h["reason"].startswith(f"accel: {why}") for h in model.report.to_json()["on_host"])


def test_a_conv_transpose_left_in_the_model_says_why():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 5, 5), "float32"))
    w = relax.const(np.ones((4, 2, 3, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d_transpose(x, w, strides=2, dilation=2))
        bb.emit_func_output(y)
    why = "this is a dilated ConvTranspose (dilation (2, 2)), which has no integer form"
    with pytest.warns(tp.OffloadWarning, match="a float32 ConvTranspose"):
        model = tp.build(bb.get(), "accel, llvm")
    assert why in model.report.to_json()["on_host"][0]["reason"]


def test_resize_modes_that_read_y_over_s_run_on_accel():
    """half_pixel with rounding to nearest reads y // s for an integer factor, as asymmetric floor does."""
    for mode, rounding in (("half_pixel", "round_prefer_ceil"), ("pytorch_half_pixel", "round_prefer_floor")):
        model = assert_matches_llvm(resize_module(3, 5, 6, 3, 2, mode=mode, rounding=rounding), "accel, llvm", seed=2)
        assert _host_ops(model) == []


def test_the_index_map_is_read_off_the_partition():
    index = np.arange(2 * 4 * 3 * 5).reshape(2, 4, 3, 5)
    m = upsample.analyse(index.reshape(1, 2, 2, 2, 3, 5).transpose(0, 1, 4, 2, 5, 3).reshape(-1), (1, 8, 3, 5),
                         (1, 2, 6, 10))
    # planes of 15 elements per tap, 60 per output channel: a loop over the 2 channels
    assert (m.loops, m.loop_in, m.loop_out, m.rows, m.gy) == (2, 60, 60, 3, 5)
    assert m.groups == ((0, ((0, 0),)), (15, ((0, 1),)), (30, ((1, 0),)), (45, ((1, 1),)))
    with pytest.raises(upsample.Declined, match="no upsampling"):
        upsample.analyse(np.arange(6), (2, 3), (2, 3))


def test_quantised_conv_transpose_and_resize_end_on_accel():
    """onnx_cnn's upsampling model (a stride-2 conv, a nearest Resize, a conv, a ConvTranspose
    with kernel = stride = 2 and a bias) quantised per tensor: every MAC and every operator but
    the input's quantize and the output's dequantize on accel, bit-exact against llvm of the
    integerised module."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tvm.relax.frontend.onnx import from_onnx

    from tirpat.testing import onnx_cnn

    model = onnx_cnn.upsampling(seed=1)
    mod = from_onnx(tp.quantize(model, onnx_cnn.calibration(model, 16)), keep_params_in_input=False)
    compiled = assert_matches_llvm(mod, "accel, llvm", reference=tp.integerize()(mod), inputs=lambda k: [
        np.random.default_rng(4 + k).standard_normal((1, 3, 16, 16)).astype(np.float32)])
    assert sorted(_host_ops(compiled)) == ["relax.dequantize", "relax.quantize"]
    assert [p.pattern for p in compiled.report.partitions].count("accel.upsample") == 2
    report = compiled.report.to_json()
    assert report["macs"]["accel"] == report["total_macs"] > 0


def test_quantised_overlapping_conv_transpose_ends_on_accel():
    """A decoder's ConvTranspose k3 s2 p1 op1 (onnx_cnn.decoder), quantised per channel: integerize's
    convolution over the stride's phases runs on accel, every MAC of the model there, bit-exact
    against llvm of the integerised module."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tvm.relax.frontend.onnx import from_onnx

    from tirpat.testing import onnx_cnn

    model = onnx_cnn.decoder(seed=2)
    mod = from_onnx(tp.quantize(model, onnx_cnn.calibration(model, 16), per_channel=True), keep_params_in_input=False)
    compiled = assert_matches_llvm(mod, "accel, llvm", reference=tp.integerize()(mod), inputs=lambda k: [
        np.random.default_rng(7 + k).standard_normal((1, 3, 16, 16)).astype(np.float32)])
    assert "relax.nn.conv2d_transpose" not in _host_ops(compiled)
    assert [p.pattern for p in compiled.report.partitions].count("accel.conv2d") == 3
    report = compiled.report.to_json()
    assert report["macs"]["accel"] == report["total_macs"] > 0


def _written(m: upsample.Upsample, size: int) -> np.ndarray:
    """The index map the form's STOREs write: for each output element, the input element."""
    out = np.full(size, -1, np.int64)
    x = np.arange(m.x)
    for loop in range(m.loops):
        for start, places in m.groups:
            for r in range(m.rows):
                source = start + loop * m.loop_in + r * m.gy + x
                for a, b in places:
                    at = loop * m.loop_out + (r * m.sy + a) * m.wo + b + x * m.sx
                    assert (out[at] == -1).all()        # every element written once
                    out[at] = source
    return out


@settings(max_examples=40)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 6), st.integers(1, 7), st.integers(1, 4),
       st.integers(1, 4), st.booleans())
def test_the_form_s_stores_write_exactly_the_index_map(n, c, h, w, sy, sx, shuffle):
    """Resizes and pixel shuffles of any shape: the STOREs of the form :func:`analyse` finds
    write each output element once, from the input element the map gives it."""
    if (sy, sx) == (1, 1):
        sy = 2
    if shuffle:
        index = np.arange(n * c * sy * sx * h * w).reshape(n, c, sy, sx, h, w).transpose(0, 1, 4, 2, 5, 3)
        in_shape = (n, c * sy * sx, h, w)
    else:
        index = np.arange(n * c * h * w).reshape(n, c, h, w).repeat(sy, axis=2).repeat(sx, axis=3)
        in_shape = (n, c, h, w)
    index = index.reshape(-1)
    out_shape = (n, c, h * sy, w * sx)
    m = upsample.analyse(index, in_shape, out_shape)
    np.testing.assert_array_equal(_written(m, index.size), index)
    # the same elements in another order along a row: no STORE writes that
    if w > 1:
        swapped = index.reshape(out_shape).copy()
        swapped[..., [0, sx]] = swapped[..., [sx, 0]]      # input x = 0 and x = 1 of one place
        with pytest.raises(upsample.Declined, match="consecutive input elements"):
            upsample.analyse(swapped.reshape(-1), in_shape, out_shape)


# -- concat: each input copied into its slice of the output ----------------------------------------
def concat_module(shapes: list, axis: int = 1) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(s, "int8")) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            y = bb.emit_output(relax.op.concat(xs, axis=axis))
        bb.emit_func_output(y)
    return bb.get()


@settings(max_examples=8)
@given(st.lists(st.integers(1, 30), min_size=2, max_size=4), st.integers(1, 20), st.integers(1, 50),
       st.integers(0, 1000))
def test_concat_runs_on_accel_bit_exact(channels, h, w, seed):
    model = assert_matches_llvm(concat_module([(1, c, h, w) for c in channels]), "accel, llvm", seed=seed)
    assert _host_ops(model) == []
    counts = model.stats["accel"].instructions
    assert counts["STORE"] == counts["DWMAC"] >= len(channels)


def test_a_concat_whose_inputs_interleave_stays_on_the_host_and_says_why():
    why = "input 0 of the concat is not one run of the output"
    with pytest.warns(tp.OffloadWarning, match=why):
        model = tp.build(concat_module([(1, 2, 3, 4), (1, 2, 5, 4)], axis=2), "accel, llvm")
    assert _host_ops(model) == ["relax.concat"]


def test_quantised_concat_ends_on_accel():
    """Two convolution branches concatenated (onnxruntime gives the Concat one scale; integerize
    rescales each branch to it): the concat runs on accel, bit-exact against llvm of the
    integerised module."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(3)
    inits = {"w": rng.normal(size=(4, 3, 1, 1)), "v": 3 * rng.normal(size=(5, 3, 3, 3))}
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["x", "v"], ["b"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 9, 6, 6])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = rng.normal(size=(8, 1, 3, 6, 6)).astype(np.float32)
    mod = from_onnx(tp.quantize(model, {"x": data[:6]}), keep_params_in_input=False)
    compiled = assert_matches_llvm(mod, "accel, llvm", reference=tp.integerize()(mod), calls=2,
                                   inputs=lambda k: [data[6 + k]])
    assert "relax.concat" not in _host_ops(compiled)


def test_a_quantised_channel_shuffle_stays_on_the_host_as_data_movement():
    """ShuffleNet's channel shuffle (reshape to [N, groups, C/groups, H, W], swap those two,
    reshape back) between two quantised convolutions: the int8 planes are reordered on the CPU,
    and the report says it is a channel shuffle, data movement accel does not run; a strict
    build does not fail for it (nothing in the model would put it on accel)."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (8, 4, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.4, (4, 8, 1, 1)).astype(np.float32), "v"),
             numpy_helper.from_array(np.array([1, 2, 4, 3, 3], np.int64), "split"),
             numpy_helper.from_array(np.array([1, 8, 3, 3], np.int64), "joined")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Reshape", ["a", "split"], ["b"]),
             helper.make_node("Transpose", ["b"], ["c"], perm=[0, 2, 1, 3, 4]),
             helper.make_node("Reshape", ["c", "joined"], ["d"]),
             helper.make_node("Conv", ["d", "v"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "shuffle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod = from_onnx(tp.quantize(model, {"x": rng.normal(size=(8, 1, 4, 3, 3)).astype(np.float32)}),
                    keep_params_in_input=False)
    compiled = tp.build(mod, "accel, llvm", strict=True)
    moved = {h.op: h.reason for h in compiled.report.on_host if h.op in ("relax.reshape", "relax.permute_dims")}
    assert set(moved) == {"relax.reshape", "relax.permute_dims"}
    for reason in moved.values():
        assert reason.startswith("accel: a channel shuffle (whole planes reordered): data movement accel does not "
                                 "run"), reason
