"""tp.integerize() of the upsampling operators of detectors' FPNs and decoders: a ConvTranspose
(a convolution over its stride's phases, then a pixel shuffle of the int8 result and the padding's
crop; with stride = kernel a 1x1 convolution and the shuffle alone) and a nearest Resize, checked
against onnxruntime's exact run of the same QDQ model (quantised by onnxruntime)."""


import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tvm  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tvm import relax  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.model.integerize import calls  # noqa: E402
from tirpat.testing import onnx_cnn  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402
from integerize_checks import integerised  # noqa: E402


def conv_transpose_model(cin: int, cout: int, k: int, stride: int, size: int, bias: bool, act: str, seed: int,
                         pads: tuple = (0, 0, 0, 0), output_padding: int = 0, dilation: int = 1):
    """A float ``ConvTranspose`` (and optional ReLU) between QDQ-able inputs and outputs;
    ``pads`` (top, left, bottom, right) and ``output_padding`` as PyTorch's exporter writes them."""
    rng = np.random.default_rng(seed)
    inits = {"w": rng.normal(0, 0.5, (cin, cout, k, k))}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = rng.normal(0, 0.3, cout)
        inputs.append("b")
    top, left, bottom, right = pads
    nodes = [helper.make_node("ConvTranspose", inputs, ["c" if act != "none" else "y"], kernel_shape=[k, k],
                              strides=[stride, stride], pads=[top, left, bottom, right], dilations=[dilation] * 2,
                              output_padding=[output_padding] * 2)]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    span = dilation * (k - 1) + 1
    height = (size - 1) * stride + span - top - bottom + output_padding
    width = (size - 1) * stride + span - left - right + output_padding
    graph = helper.make_graph(nodes, "op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, height, width])],
                              [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def steps(q, mod, inputs) -> np.ndarray:
    """|ours - onnxruntime| in output steps, every element of every input."""
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    session, scale = exact_session(q), onnx_cnn.output_scale(q)
    out = []
    for x in inputs:
        ours = vm["main"](tvm.runtime.tensor(x)).numpy()
        ref = session.run(None, {"x": x})[0]
        out.append(np.round(np.abs(ours.astype(np.float64) - ref) / scale).ravel())
    return np.concatenate(out)


def op_names(mod) -> list[str]:
    return [str(c.op.name) for c in calls(mod["main"])]


@settings(max_examples=6, deadline=None)
@given(st.integers(1, 6), st.integers(1, 10), st.sampled_from([1, 2, 3]), st.integers(1, 7), st.booleans(),
       st.sampled_from(["none", "Relu"]), st.booleans(), st.integers(0, 2**16))
def test_conv_transpose_with_stride_equal_to_kernel_within_one_step(cin, cout, k, size, bias, act, per_channel, seed):
    model = conv_transpose_model(cin, cout, k, k, size, bias, act, seed)
    data = np.random.default_rng(seed).normal(size=(10, 1, cin, size, size)).astype(np.float32)
    q = tp.quantize(model, {"x": data[:6]}, per_channel=per_channel)
    mod, said = integerised(q)
    assert not said, said
    ops = op_names(mod)
    assert "relax.nn.conv2d_transpose" not in ops and "relax.nn.conv2d" in ops and "relax.permute_dims" in ops
    for call in calls(mod["main"]):
        if str(call.op.name) == "relax.nn.conv2d":
            assert [str(a.ty.dtype) for a in call.args] == ["int8", "int8"] and str(call.ty.dtype) == "int32"
    assert steps(q, mod, data[6:]).max() <= 1


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.integers(1, 4), st.integers(1, 3), st.integers(1, 6),
       st.tuples(*[st.integers(0, 2)] * 4), st.integers(0, 2), st.booleans(), st.sampled_from(["none", "Relu"]),
       st.sampled_from(["symmetric", "per-channel", "uint8"]), st.integers(0, 2**16))
def test_any_conv_transpose_is_integer_within_one_step(tmp_path_factory, cin, cout, k, stride, size, pads,
                                                       output_padding, bias, act, form, seed):
    """Overlapping taps (k > s), gaps (k < s), padding cropping either side and output padding
    (as decoders export ConvTranspose k3 s2 p1 op1 or k4 s2 p1), symmetric or not: integer, and
    within one step of onnxruntime."""
    from test_integerize_asymmetric import FORMS, ort_quantize

    pads = tuple(min(p, k - 1) for p in pads)                   # ONNX: padding below the kernel
    output_padding = min(output_padding, stride - 1)            # and output padding below the stride
    for begin, end in ((pads[0], pads[2]), (pads[1], pads[3])):  # an output of at least one pixel
        assume((size - 1) * stride + k - begin - end + output_padding >= 1)
    model = conv_transpose_model(cin, cout, k, stride, size, bias, act, seed, pads, output_padding)
    data = np.random.default_rng(seed).normal(size=(10, 1, cin, size, size)).astype(np.float32)
    if form == "uint8":         # onnxruntime's default: uint8 activations with zero points
        q = ort_quantize(model, data[:6], *FORMS["uint8"], str(tmp_path_factory.mktemp("q")))
    else:
        q = tp.quantize(model, {"x": data[:6]}, per_channel=form == "per-channel")
    mod, said = integerised(q)
    assert not said, said
    assert "relax.nn.conv2d_transpose" not in op_names(mod)
    assert steps(q, mod, data[6:]).max() <= 1


def test_a_dilated_conv_transpose_stays_float_with_its_reason():
    model = conv_transpose_model(3, 4, 3, 2, 5, True, "none", 1, dilation=2)
    data = np.random.default_rng(1).normal(size=(6, 1, 3, 5, 5)).astype(np.float32)
    q = tp.quantize(model, {"x": data})
    mod, said = integerised(q)
    assert "relax.nn.conv2d_transpose" in op_names(mod)
    assert any("a dilated ConvTranspose (dilation (2, 2))" in s for s in said), said
    assert steps(q, mod, data).max() <= 1
