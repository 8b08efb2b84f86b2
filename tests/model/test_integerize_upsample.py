"""tp.integerize() of the upsampling operators of detectors' FPNs: a ConvTranspose with
stride = kernel (one tap per output pixel: a 1x1 convolution to one channel per output channel
and tap, then a pixel shuffle of the int8 result) and a nearest Resize, checked against
onnxruntime's exact run of the same QDQ model (quantised by onnxruntime)."""


import numpy as np
import pytest
from hypothesis import given, settings
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


def conv_transpose_model(cin: int, cout: int, k: int, stride: int, size: int, bias: bool, act: str, seed: int):
    """A float ``ConvTranspose`` (and optional ReLU) between QDQ-able inputs and outputs."""
    rng = np.random.default_rng(seed)
    inits = {"w": rng.normal(0, 0.5, (cin, cout, k, k))}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = rng.normal(0, 0.3, cout)
        inputs.append("b")
    nodes = [helper.make_node("ConvTranspose", inputs, ["c" if act != "none" else "y"], kernel_shape=[k, k],
                              strides=[stride, stride])]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    out = (size - 1) * stride + k
    graph = helper.make_graph(nodes, "op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, out, out])],
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


def test_overlapping_conv_transpose_stays_float_with_its_reason():
    model = conv_transpose_model(3, 4, 3, 2, 5, True, "none", 1)
    data = np.random.default_rng(1).normal(size=(6, 1, 3, 5, 5)).astype(np.float32)
    q = tp.quantize(model, {"x": data})
    mod, said = integerised(q)
    assert "relax.nn.conv2d_transpose" in op_names(mod)
    assert any("stride (2, 2) and kernel (3, 3): overlapping taps" in s for s in said), said
    assert steps(q, mod, data).max() <= 1
