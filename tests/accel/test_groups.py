"""Grouped convolutions (1 < groups < channels, several channels per group: ResNeXt, RegNet,
ShuffleNet) on accel: quantised, integerised, then one batched matmul of the groups' im2col
matrices and its epilogue (``accel.compiler.groups``), bit for bit llvm's result of the
integerised module, every MAC of the model on accel and counted once."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.testing.differential import assert_matches_llvm  # noqa: E402


def grouped_model(c: int, groups: int, per_out: int, k: int, stride: int, size: int, seed: int,
                  act: str = "Relu"):
    """Float ONNX: a grouped Conv (``groups`` groups of ``c // groups`` input and ``per_out``
    output channels, kernel ``k``, padding ``k // 2``, a bias), ``act`` (a ReLU joins the
    requantise; a Sigmoid is a table looked up after it), then a 1x1 Conv to 4 channels."""
    rng = np.random.default_rng(seed)
    f = groups * per_out
    inits = {"w": rng.normal(0, 0.4, (f, c // groups, k, k)), "b": rng.normal(0, 0.2, f),
             "v": rng.normal(0, 0.3, (4, f, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["g"], kernel_shape=[k, k], strides=[stride] * 2,
                              pads=[k // 2] * 4, group=groups),
             helper.make_node(act, ["g"], ["r"]),
             helper.make_node("Conv", ["r", "v"], ["y"], kernel_shape=[1, 1])]
    out = (size + 2 * (k // 2) - k) // stride + 1
    graph = helper.make_graph(nodes, "grouped", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, out, out])],
                              [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), f * (c // groups) * k * k * out * out


@settings(max_examples=4, deadline=None)
@given(st.sampled_from([(8, 2), (12, 3), (16, 4), (8, 4)]), st.integers(1, 3), st.sampled_from([1, 3]),
       st.integers(1, 2), st.integers(4, 6), st.booleans(), st.sampled_from(["Relu", "Sigmoid"]),
       st.integers(0, 2**16))
def test_a_quantised_grouped_convolution_runs_on_accel_as_one_batched_matmul(shape, per_out, k, stride, size,
                                                                          per_channel, act, seed):
    c, groups = shape
    model, grouped_macs = grouped_model(c, groups, per_out, k, stride, size, seed, act)
    rng = np.random.default_rng(seed)
    q = tp.quantize(model, {"x": rng.normal(size=(8, 1, c, size, size)).astype(np.float32)}, per_channel=per_channel)
    mod = from_onnx(q, keep_params_in_input=False)
    compiled = assert_matches_llvm(mod, "accel, llvm", reference=tp.integerize()(mod), inputs=lambda n: [
        np.random.default_rng(seed + n).normal(size=(1, c, size, size)).astype(np.float32)])
    report = compiled.report.to_json()
    f = groups * per_out
    out = (size + 2 * (k // 2) - k) // stride + 1
    assert report["total_macs"] == grouped_macs + 4 * f * out * out      # the grouped conv counted once
    assert report["macs"]["accel"] == report["total_macs"]
    # one partition (one device stream a call) for all the groups, and the 1x1 convolution
    patterns = [p.pattern for p in compiled.report.partitions]
    assert (patterns.count("accel.matmul"), patterns.count("accel.conv2d")) == (1, 1)
    assert "relax.nn.conv2d" not in [h.op for h in compiled.report.on_host]


def test_a_grouped_convolution_left_whole_says_why():
    """A weight that is not a constant (an input of the model) is not split: the convolution
    stays on the host, and the reason says what accel would need."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 6, 6), "int8"))
    w = relax.Var("w", relax.TensorType((8, 4, 3, 3), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1, groups=2, out_dtype="int32"))
            y = bb.emit_output(relax.op.astype(relax.op.clip(relax.op.right_shift(y, relax.const(6, "int32")),
                                                             -128, 127), "int8"))
        bb.emit_func_output(y)
    with pytest.warns(tp.OffloadWarning, match="a grouped convolution \\(groups = 2, 4 input and 4 output channels "
                                               "per group\\) left whole"):
        model = tp.build(bb.get(), "accel, llvm")
    assert model.report.share("accel") == 0.0


def test_a_grouped_convolution_s_gather_and_permute_say_they_are_data_movement():
    """The host's share of a grouped convolution on accel (the gather of its groups' im2col
    matrices, the permute of the batched result back to NCHW) is data movement accel does not
    run, and the report says so: no "no backend takes" for operators accel's own rewrite made,
    and a strict build does not fail for them."""
    model, _ = grouped_model(8, 2, 2, 3, 1, 4, seed=5)
    rng = np.random.default_rng(5)
    mod = from_onnx(tp.quantize(model, {"x": rng.normal(size=(8, 1, 8, 4, 4)).astype(np.float32)}),
                    keep_params_in_input=False)
    compiled = tp.build(mod, "accel, llvm", strict=True)
    reasons = {(h.op, h.reason) for h in compiled.report.on_host if h.op not in ("relax.quantize", "relax.dequantize")}
    gathered = {op for op, why in reasons if why.startswith("accel: the im2col matrices of a grouped convolution's "
                                                             "groups") and "data movement accel does not run" in why}
    assert gathered == {"relax.reshape", "relax.take", "relax.where", "relax.permute_dims"}
    back = {op for op, why in reasons
            if why.startswith("accel: a transpose that is no upsampling: data movement accel does not run")}
    assert back == {"relax.reshape", "relax.permute_dims"}
    assert len({why for _, why in reasons}) == 2        # those two reasons, nothing else


def test_a_batch_of_dilated_asymmetrically_padded_grouped_convolutions_is_one_matmul():
    """The gather's indices and border mask on an integer module: a batch of 3 images, dilation
    2, padding (top 2, left 0, bottom 1, right 2), bit for bit llvm's, one accel.matmul."""
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 8, 7, 6), "int8"))
    w = rng.integers(-100, 100, (6, 4, 3, 3)).astype(np.int8)
    bias = rng.integers(-1000, 1000, (1, 6, 1, 1)).astype(np.int32)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w), padding=(2, 0, 1, 2), dilation=2, groups=2,
                                           out_dtype="int32"))
            y = bb.emit(relax.op.add(y, relax.const(bias)))
            y = bb.emit_output(relax.op.astype(relax.op.clip(relax.op.right_shift(y, relax.const(6, "int32")),
                                                             -128, 127), "int8"))
        bb.emit_func_output(y)
    model = assert_matches_llvm(bb.get(), "accel, llvm", calls=1)
    assert [p.pattern for p in model.report.partitions] == ["accel.matmul"]
