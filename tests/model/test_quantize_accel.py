"""Quantised models on accel: ``tp.build(QDQ model, "accel, llvm")`` integerises them (accel's
PRE_PARTITION pass), offloads at least 90% of the MACs, names every host operator with its
reason, and is bit-exact against the same integer module compiled for llvm alone, and so
within one output step of onnxruntime's exact QDQ execution."""

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tvm  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.testing import onnx_cnn  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402


def mlp(seed: int = 0):
    """Gemm + ReLU + Gemm on a batch of 16."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.2, (64, 32)), "b1": rng.normal(0, 0.1, 64),
             "w2": rng.normal(0, 0.2, (10, 64)), "b2": rng.normal(0, 0.1, 10)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 10])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def smoothed(seed: int = 0):
    """Conv + ReLU, a residual Conv + Add (host operators), an overlapping 3x3 average pool
    (its window sums are a depthwise convolution, which accel declines), Conv, Gemm."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.3, (8, 3, 3, 3)), "w2": rng.normal(0, 0.3, (8, 8, 3, 3)),
             "w3": rng.normal(0, 0.1, (10, 8 * 8 * 8)), "w4": rng.normal(0, 0.3, (8, 8, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w4"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["r", "e"], ["s"]),
             helper.make_node("AveragePool", ["s"], ["p"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Conv", ["p", "w2"], ["d"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Flatten", ["d"], ["f"]), helper.make_node("Gemm", ["f", "w3"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "smoothed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MODELS = {"mlp": mlp, "smoothed": smoothed, **onnx_cnn.MODELS}


@pytest.fixture(scope="module", params=[(name, False) for name in sorted(MODELS)] + [("residual", True)],
                ids=lambda p: p[0] + ("-per-channel" if p[1] else ""))
def built(request, quantised_cnn):
    name, per_channel = request.param
    if name in onnx_cnn.MODELS:       # quantised, integerised and on llvm once for the session
        qdq, mod, _, _, reference = quantised_cnn(name, seed=1, per_channel=per_channel)
    else:
        model = MODELS[name](seed=1)
        qdq = tp.quantize(model, onnx_cnn.calibration(model, 16), per_channel=per_channel)
        mod = from_onnx(qdq, keep_params_in_input=False)
        reference = relax.VirtualMachine(tvm.compile(tp.integerize()(mod), "llvm"), tvm.cpu())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)     # the report names what stays on the host
        compiled = tp.build(mod, "accel, llvm")
    return qdq, compiled, reference


def test_bit_exact_against_llvm_and_within_a_step_of_onnxruntime(built):
    qdq, compiled, reference = built
    session = exact_session(qdq)
    step = onnx_cnn.output_scale(qdq)
    for x in onnx_cnn.calibration(qdq, 4, seed=9)["x"]:
        ours = compiled(x)
        assert np.array_equal(ours, reference["main"](tvm.runtime.tensor(x)).numpy())
        assert np.abs(ours - session.run(None, {"x": x})[0]).max() <= 1.5 * step
    assert compiled.stats["accel"].macs > 0          # it ran on the simulated device


def test_macs_on_accel_and_host_ops_named(built):
    _, compiled, _ = built
    report = compiled.report.to_json()
    assert sum(report["macs"].values()) == report["total_macs"]
    assert report["macs"]["accel"] >= 0.9 * report["total_macs"], report["macs"]
    assert report["on_host"] and all(h["op"] and h["reason"] for h in report["on_host"])
    host_ops = {h["op"] for h in report["on_host"]}
    assert {"relax.quantize", "relax.dequantize"} <= host_ops          # the input's and the output's
    assert "relax.matmul" not in host_ops
    # the only convolution left on the host is an overlapping average pool's depthwise window sum
    assert all("grouped" in h["reason"] for h in report["on_host"] if h["op"] == "relax.nn.conv2d")


def test_host_reasons_are_the_operators_own(built):
    """A check's reason is attributed to the operators it saw, not to others that share a
    variable name (names repeat after integerize's rewrites): nothing before the declined
    grouped convolution of an average pool says "grouped"."""
    _, compiled, _ = built
    on_host = compiled.report.to_json()["on_host"]
    grouped = [n for n, h in enumerate(on_host) if h["op"] == "relax.nn.conv2d"]
    for h in on_host[: grouped[0] if grouped else len(on_host)]:
        assert "grouped" not in h["reason"], h
    if grouped:
        assert "grouped" in on_host[grouped[0]]["reason"]


def open_batch(model):
    """``model`` with its batch dimension left open (``N``), as exporters often write it."""
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    return model


@pytest.mark.parametrize("name", ["residual", "smoothed"])
def test_symbolic_batch_is_integerised_and_accel_says_why_it_stays_on_the_host(name):
    """A batch left open changes none of the integer arithmetic (the weights and the pooled
    dimensions set it): the model integerises completely, runs for any batch within a step of
    onnxruntime; accel needs static shapes, so its convolutions and matmuls stay on the host,
    each named with that reason, bit-exact against the integer module on llvm."""
    model = open_batch(MODELS[name](seed=1))
    qdq = tp.quantize(model, onnx_cnn.calibration(MODELS[name](seed=1), 16))
    mod = from_onnx(qdq, keep_params_in_input=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tp.IntegerizeWarning)       # nothing left in float
        integer = tp.integerize()(mod)
    ops = [str(c.op.name) for c in tp.model.integerize.calls(integer["main"])]
    assert ops.count("relax.quantize") == 1 and ops.count("relax.dequantize") == 1
    reference = relax.VirtualMachine(tvm.compile(integer, "llvm"), tvm.cpu())
    with pytest.warns(tp.OffloadWarning, match="input-shapes"):
        compiled = tp.build(mod, "accel, llvm")
    on_host = compiled.report.to_json()["on_host"]
    gemms = [h for h in on_host if h["op"] in ("relax.nn.conv2d", "relax.matmul")]
    assert len(gemms) == ops.count("relax.nn.conv2d") + ops.count("relax.matmul")
    assert all("accel needs static shapes" in h["reason"] for h in gemms), gemms
    session = exact_session(qdq)
    step = onnx_cnn.output_scale(qdq)
    shape = onnx_cnn.input_shape(MODELS[name](seed=1))[1:]
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32)
        ours = reference["main"](tvm.runtime.tensor(x)).numpy()
        assert ours.shape[0] == batch
        assert np.array_equal(compiled(x), ours)
        assert np.abs(ours - session.run(None, {"x": x})[0]).max() <= 1.5 * step
