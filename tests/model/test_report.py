"""The offload report at the size of a real model: a deep quantised CNN (40 convolutions, a
depthwise one accel declines, a transposed convolution no backend takes, a MatMul) gives a
summary of at most 60 lines whose MAC total equals an independent count from the ONNX graph
(onnx's shape inference and the ONNX operators' own definitions), and a verbose text and a JSON
report that list every operator."""

import re
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper, shape_inference  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.model.report import HostOp, ModelReport, Partition  # noqa: E402

CONVS, C, HW = 40, 8, 8


def deep(seed: int = 0):
    """40 3x3 convolutions with ReLU (a Sigmoid after every tenth), a depthwise convolution, a
    ConvTranspose that doubles the image, a 1x1 convolution and a MatMul."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = {}, [], "x"
    for n in range(CONVS):
        inits[f"w{n}"] = rng.normal(0, 0.3, (C, C, 3, 3))
        inits[f"b{n}"] = rng.normal(0, 0.1, C)
        nodes += [helper.make_node("Conv", [x, f"w{n}", f"b{n}"], [f"c{n}"], kernel_shape=[3, 3], pads=[1] * 4),
                  helper.make_node("Relu", [f"c{n}"], [f"r{n}"])]
        x = f"r{n}"
        if n % 10 == 9:
            nodes.append(helper.make_node("Sigmoid", [x], [f"s{n}"]))
            x = f"s{n}"
    inits["dw"] = rng.normal(0, 0.3, (C, 1, 3, 3))
    inits["tw"] = rng.normal(0, 0.3, (C, 4, 2, 2))
    inits["pw"] = rng.normal(0, 0.3, (2, 4, 1, 1))
    inits["mw"] = rng.normal(0, 0.3, (2 * HW, 5))
    nodes += [helper.make_node("Conv", [x, "dw"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=C),
              helper.make_node("ConvTranspose", ["d", "tw"], ["t"], kernel_shape=[2, 2], strides=[2, 2]),
              helper.make_node("Conv", ["t", "pw"], ["p"], kernel_shape=[1, 1]),
              helper.make_node("MatMul", ["p", "mw"], ["y"])]
    graph = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, HW, HW])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2 * HW, 5])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def onnx_macs(model) -> int:
    """The model's multiply-accumulates from its ONNX graph: Conv, its output's elements times
    a kernel window (weight elements per output channel); ConvTranspose, its input's elements
    times a kernel window (weight elements per input channel); MatMul, its output's elements
    times the reduction length."""
    inferred = shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    shapes.update({i.name: list(i.dims) for i in inferred.graph.initializer})
    total = 0
    for node in inferred.graph.node:
        if node.op_type == "Conv":
            total += int(np.prod(shapes[node.output[0]])) * int(np.prod(shapes[node.input[1]][1:]))
        elif node.op_type == "ConvTranspose":
            total += int(np.prod(shapes[node.input[0]])) * int(np.prod(shapes[node.input[1]][1:]))
        elif node.op_type == "MatMul":
            total += int(np.prod(shapes[node.output[0]])) * shapes[node.input[0]][-1]
        else:
            assert node.op_type in ("Relu", "Sigmoid", "QuantizeLinear", "DequantizeLinear"), node.op_type
    return total


@pytest.fixture(scope="module")
def built():
    model = deep()
    rng = np.random.default_rng(1)
    calibration = {"x": rng.normal(0, 1, (4, 1, C, HW, HW)).astype(np.float32)}
    quantised = tp.quantize(model, calibration)
    with warnings.catch_warnings():     # the ConvTranspose, Sigmoid and depthwise Conv stay on the host
        warnings.simplefilter("ignore", tp.OffloadWarning)
        warnings.simplefilter("ignore", tp.IntegerizeWarning)
        return model, tp.build(from_onnx(quantised, keep_params_in_input=False), "accel, llvm").report


def test_the_summary_fits_a_screen_and_counts_every_mac(built):
    model, report = built
    assert report.total_macs == onnx_macs(model) and report.uncounted == 0
    text = str(report)
    lines = text.splitlines()
    assert len(lines) <= 60, text
    assert f"multiply-accumulates: {report.total_macs:,}" in text
    # the 40 3x3 convolutions: one line with their calls and MACs, not 40; the 1x1 another
    conv = [line for line in lines if line.startswith("  accel: ") and "conv2d" in line]
    assert len(conv) == 2 and conv[0].endswith(f", {CONVS} calls, {CONVS * HW * HW * C * C * 9:,} MACs"), text
    assert conv[1].endswith(f"conv2d + clip + requantise, {(2 * HW) ** 2 * 2 * 4:,} MACs"), text
    # the host's operators by reason, with counts: the transposed convolution and the MatMul
    # with their MACs, the depthwise convolution with accel's reason
    on_host = [h for h in report.on_host if h.macs]
    assert sorted(h.op for h in on_host) == ["relax.matmul", "relax.nn.conv2d", "relax.nn.conv2d_transpose"]
    for h in on_host:
        assert f"{h.var} = {h.op.split('.')[-1]}, {h.macs:,} MACs" in text, text
    assert f"on the host: {len(report.on_host)} operators, {report.macs['host']:,} MACs" in text
    assert f"1 x conv2d_transpose, {C * HW * HW * 4 * 2 * 2:,} MACs: no backend of the target takes relax.nn.conv2d_transpose" in text


def test_verbose_and_json_list_every_operator(built):
    _, report = built
    verbose = report.text(verbose=True)
    assert len(verbose.splitlines()) > 60
    for p in report.partitions:
        assert f"{p.backend}: {p.function} ({p.pattern})" in verbose
    assert sum(f"{p.backend}: {p.function} (" in verbose for p in report.partitions) == len(report.partitions)
    for h in report.on_host:
        assert f"    {h.var} = {h.op.split('.')[-1]}" in verbose
    data = report.to_json()
    assert len(data["partitions"]) == len(report.partitions) >= CONVS
    assert [h["var"] for h in data["on_host"]] == [h.var for h in report.on_host]
    assert ModelReport.from_json(data) == report


def test_the_summary_stays_short_whatever_it_lists():
    """Many kinds of partition, many reasons, many notes and uncounted operators: still capped."""
    parts = [Partition("accel", f"f{n}", f"accel.p{n % 30}", ["relax.matmul"], 10 + n, rules={"r": 1},
                       on_host=[[f"w{n}", "reorders the weights"], [f"x{n}", "pads"], [f"y{n}", "casts"]],
                       device_macs=20 + n) for n in range(120)]
    host = [HostOp("relax.matmul", f"lv{n}", f"reason {n}", n) for n in range(100)]
    report = ModelReport(sum(p.macs for p in parts) + sum(h.macs for h in host), parts, host,
                         [f"relax.einsum (lv{n})" for n in range(40)],
                         {"path": "r", "applied": 0, "partitions": 100, "misses": {f"f{n}": "none" for n in range(100)}})
    text = str(report)
    assert len(text.splitlines()) <= 60, text
    assert "uncounted: 40 operators: einsum 40" in text
    # every kind of partition is shown or counted, the biggest first
    shown = re.findall(r"^  accel: (accel\.p\d+): matmul, 4 calls, ", text, re.M)
    more = re.search(r"^  \.\.\. and (\d+) more kinds of partition$", text, re.M)
    assert shown[:2] == ["accel.p29", "accel.p28"] and len(shown) + int(more[1]) == 30, text
    assert "... and 91 more reasons" in text and "... and 97 more without a record" in text
    assert "\n    lv99 = matmul, 99 MACs\n" in text     # the largest first
    assert text.endswith("(text(verbose=True), tirpat compile --verbose: every call and operator)")
    assert len(report.text(verbose=True).splitlines()) > 200
