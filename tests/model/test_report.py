"""The offload report at the size of a real model: a deep quantised CNN (40 convolutions, a
depthwise one, a transposed convolution no backend takes, a MatMul) gives a
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
    grouped ConvTranspose that doubles the image (integerize declines groups: it stays on the
    host), a 1x1 convolution and a MatMul."""
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
    inits["tw"] = rng.normal(0, 0.3, (C, 2, 2, 2))
    inits["pw"] = rng.normal(0, 0.3, (2, 4, 1, 1))
    inits["mw"] = rng.normal(0, 0.3, (2 * HW, 5))
    nodes += [helper.make_node("Conv", [x, "dw"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, group=C),
              helper.make_node("ConvTranspose", ["d", "tw"], ["t"], kernel_shape=[2, 2], strides=[2, 2], group=2),
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
    with warnings.catch_warnings():     # the ConvTranspose stays on the host
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
    # the 40 3x3 convolutions: a line per epilogue with its calls and MACs, not 40 (every tenth
    # one's Sigmoid is a table lookup on accel, which takes in the quantised ReLU before it: one
    # table of the convolution's output); the depthwise and the 1x1 one line (the same
    # epilogue: integerize's precise requantise clamps both accumulators first)
    conv = [line for line in lines if line.startswith("  accel: ") and "conv2d" in line]
    tabled, plain = CONVS // 10, CONVS - CONVS // 10
    assert len(conv) == 3, text
    assert conv[0].endswith(f"ReLU, {plain} calls, {plain * HW * HW * C * C * 9:,} MACs"), text
    assert conv[1].endswith(f"requantise + table, {tabled} calls, {tabled * HW * HW * C * C * 9:,} MACs"), text
    small = HW * HW * C * 9 + (2 * HW) ** 2 * 2 * 4
    assert conv[2].endswith(f"conv2d + clip + requantise, 2 calls, {small:,} MACs"), text
    # the MatMul of a batch of matrices by one weight: one GEMM of its rows on accel
    matmul = [line for line in lines if line.startswith("  accel: accel.matmul")]
    assert len(matmul) == 1 and matmul[0].endswith(f"{2 * 2 * HW * 5 * 2 * HW:,} MACs"), text
    # the host's operators by reason, with counts: the transposed convolution with its MACs
    on_host = [h for h in report.on_host if h.macs]
    assert sorted(h.op for h in on_host) == ["relax.nn.conv2d_transpose"]
    for h in on_host:
        assert f"{h.var} = {h.op.split('.')[-1]}, {h.macs:,} MACs" in text, text
    # few operators left on the host: each on its line, with its reason
    assert f"on host: {report.macs['host']:,} (" in text
    assert f"= conv2d_transpose, {C * HW * HW * 2 * 2 * 2:,} MACs: accel: a float32 ConvTranspose: " in text
    assert "this is a grouped ConvTranspose (groups = 2)" in text


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


def _call(op, *shapes, **attrs):
    """A normalised Relax call of ``op`` on float32 tensors of ``shapes``."""
    from tvm import relax
    from tvm.script import relax as R

    args = [relax.Var(f"a{n}", R.Tensor(shape, "float32")) for n, shape in enumerate(shapes)]
    return relax.BlockBuilder().normalize(op(*args, **attrs))


def _macs_cases():
    from tvm import relax

    nn = relax.op.nn
    # independent counts: a MAC for each (output element, reduction index) or, transposed,
    # each (input element, output channel, kernel tap) pair
    return [
        (nn.conv1d, [(2, 6, 10), (4, 3, 3)], {"groups": 2}, 2 * 4 * 8 * 3 * 3),
        (nn.conv2d, [(1, 4, 7, 7), (8, 4, 3, 3)], {"strides": 2}, 8 * 3 * 3 * 4 * 3 * 3),
        (nn.conv3d, [(1, 2, 4, 4, 4), (3, 2, 1, 1, 1)], {}, 3 * 64 * 2),
        (nn.conv1d_transpose, [(1, 4, 5), (4, 3, 2)], {"strides": 2}, 4 * 5 * 3 * 2),
        (nn.conv2d_transpose, [(2, 6, 3, 3), (6, 2, 4, 4)], {"strides": 2, "groups": 3}, 2 * 6 * 9 * 2 * 16),
        (nn.conv3d_transpose, [(1, 2, 2, 2, 2), (2, 5, 3, 3, 3)], {}, 2 * 8 * 5 * 27),
        (relax.op.matmul, [(3, 5, 7), (7, 2)], {}, 3 * 5 * 2 * 7),
        (relax.op.outer, [(5,), (6,)], {}, 30),
        (nn.attention, [(1, 7, 2, 8), (1, 9, 2, 8), (1, 9, 2, 6)], {}, 2 * 7 * 9 * 8 + 2 * 7 * 9 * 6),
    ]


@pytest.mark.parametrize("case", range(9))
def test_every_operator_that_multiplies_and_accumulates_is_counted(case):
    from tirpat.model.report import MAC_OPS, macs_known, macs_of

    op, shapes, attrs, expected = _macs_cases()[case]
    call = _call(op, *shapes, **attrs)
    assert call.op.name in MAC_OPS and macs_known(call) and macs_of(call) == expected


def test_einsum_is_counted_and_one_with_an_ellipsis_is_named_uncounted():
    from tvm import relax

    from tirpat.model.report import macs_known, macs_of

    def einsum(*shapes, subscripts):
        return _call(lambda *a: relax.op.einsum(list(a), subscripts), *shapes)

    assert macs_of(einsum((2, 3, 4), (4, 5), subscripts="abc,cd->abd")) == 2 * 3 * 4 * 5
    ellipsis = einsum((2, 3, 4), (4, 5), subscripts="...c,cd->...d")
    assert not macs_known(ellipsis) and macs_of(ellipsis) == 0


def test_a_symbolic_transposed_convolution_is_named_uncounted():
    from tvm import relax, tirx
    from tvm.script import relax as R

    n = tirx.Var("n", "int64")
    x, w = relax.Var("x", R.Tensor((n, 4, 5, 5), "float32")), relax.Var("w", R.Tensor((4, 2, 3, 3), "float32"))
    y = relax.Var("y", R.Tensor((1, 4, 5, 5), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, y]):
        with bb.dataflow():
            up = bb.emit(relax.op.nn.conv2d_transpose(x, w))
            fixed = bb.emit(relax.op.nn.conv2d(y, relax.op.permute_dims(w, [1, 0, 2, 3])))
            out = bb.emit_output(relax.Tuple([up, fixed]))
        bb.emit_func_output(out)
    report = tp.build(bb.get(), "llvm").report
    assert report.total_macs == 2 * 3 * 3 * 4 * 3 * 3 and report.uncounted_ops == ["relax.nn.conv2d_transpose (lv)"]
    assert "  uncounted: 1 operator: conv2d_transpose (at lv)" in str(report)
    assert report.to_json()["uncounted"] == 1


def test_a_call_tir_that_multiplies_and_accumulates_is_counted():
    """A frontend's emit_te gives a call_tir: its reductions that multiply count, a symbolic one
    is named uncounted, one that only adds (a sum) counts nothing."""
    from tvm import relax, te, tirx
    from tvm.script import relax as R

    def matmul(a, b):
        k = te.reduce_axis((0, a.shape[1]), "k")
        return te.compute((a.shape[0], b.shape[1]), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")

    def total(a):
        k = te.reduce_axis((0, a.shape[1]), "k")
        return te.compute((a.shape[0],), lambda i: te.sum(a[i, k], axis=k), name="S")

    n = tirx.Var("n", "int64")
    x, w = relax.Var("x", R.Tensor((4, 8), "float32")), relax.Var("w", R.Tensor((8, 5), "float32"))
    v = relax.Var("v", R.Tensor((n, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, v]):
        with bb.dataflow():
            y = bb.emit_te(matmul, x, w)
            s = bb.emit_te(total, x)
            d = bb.emit_te(matmul, v, w)
            out = bb.emit_output(relax.Tuple([y, s, d]))
        bb.emit_func_output(out)
    report = tp.build(bb.get(), "llvm").report
    assert report.total_macs == 4 * 5 * 8 and [h.macs for h in report.on_host] == [4 * 5 * 8, 0, 0]
    assert report.uncounted_ops == [f"relax.call_tir ({report.on_host[2].var})"]


def test_verbose_names_every_uncounted_operator():
    report = ModelReport(0, [], [], [f"relax.matmul (lv{n})" for n in range(6)])
    assert "uncounted: 6 operators: matmul 6 (at lv0, lv1, lv2, lv3, ...)" in str(report)
    assert f"uncounted: 6 operators: matmul 6 (at {', '.join(f'lv{n}' for n in range(6))})" in report.text(verbose=True)


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_a_precise_requantise_is_named_requantise_not_a_residual_add(per_channel, residual):
    """The epilogue's words where the backend gave none (its epilogue fell back to the CPU):
    integerize's precise requantise adds its low product, shifted, to its high one (a value
    the partition computes, not a residual), and with weights per channel its constants are
    vectors along the channels (not a bias); a residual added before it is still named."""
    from tvm import relax
    from tvm.script import relax as R

    from tirpat.model.integerize.fixed_point import Requantize
    from tirpat.model.integerize.rules import emit_requantize
    from tirpat.model.report import epilogue_of

    n = 4
    multipliers = np.array([0.00087, 0.00093, 0.0011, 0.00071]) if per_channel else 0.00087
    rq = Requantize.choose([multipliers], [np.full(n, 146_000) if per_channel else 146_000], precise=True)
    assert rq.split > 0
    x, w = relax.Var("x", R.Tensor((1, 6, 6, n), "int8")), relax.Var("w", R.Tensor((3, 3, n, n), "int8"))
    b, r = relax.Var("b", R.Tensor((n,), "int32")), relax.Var("r", R.Tensor((1, 6, 6, n), "int32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b, r]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO",
                                           out_dtype="int32"))
            y = bb.emit(relax.op.add(y, b))
            if residual:
                y = bb.emit(relax.op.add(y, r))
            out = bb.emit_output(emit_requantize([y], rq))
        bb.emit_func_output(out)
    func = relax.transform.Normalize()(bb.get())["main"]
    calls = [binding.value for block in func.body.blocks for binding in block.bindings]
    assert [c.op.name for c in calls].count("relax.multiply") == 2
    assert epilogue_of(calls) == ["bias", *(["residual add"] if residual else []), "requantise"]
