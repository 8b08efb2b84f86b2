"""tp.integerize() on asymmetric activations: onnxruntime's *default* ``quantize_static``
output (uint8 activations with zero points, int8 weights) and int8 activations with
``ActivationSymmetric=False``, integerised exactly: within a step of onnxruntime's exact QDQ
run, no int32 overflow by interval analysis, bit-exact on accel against llvm, and as many
MACs on accel as the symmetric form (``tp.quantize``'s) puts there."""

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tvm  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.model.integerize import IntegerizeWarning, calls  # noqa: E402
from tirpat.testing import onnx_cnn  # noqa: E402
from tirpat.testing.int_ranges import int32_overflows  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402


def _graph(nodes, inits, in_shape, out_shape, name):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def pooled(seed: int = 0):
    """Padded Conv + ReLU, a padded overlapping MaxPool and AveragePool (count_include_pad),
    Concat of the two, a 1x1 Conv, Flatten, MatMul with a bias Add."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.4, (6, 3, 3, 3)), "b1": rng.normal(0, 0.2, 6),
             "w2": rng.normal(0, 0.4, (4, 12, 1, 1)), "m": rng.normal(0, 0.1, (4 * 4 * 4, 10)),
             "c": rng.normal(0, 0.1, 10)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4),
             helper.make_node("AveragePool", ["a"], ["q"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4,
                              count_include_pad=1),
             helper.make_node("Concat", ["p", "q"], ["k"], axis=1),
             helper.make_node("Conv", ["k", "w2"], ["e"], kernel_shape=[1, 1]),
             helper.make_node("Flatten", ["e"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["g"]), helper.make_node("Add", ["g", "c"], ["y"])]
    return _graph(nodes, inits, (1, 3, 8, 8), (1, 10), "pooled")


def depthwise(seed: int = 0):
    """Conv + ReLU, a strided 3x3 depthwise Conv (padded) + ReLU, a 1x1 Conv."""
    rng = np.random.default_rng(seed)
    inits = {"w1": rng.normal(0, 0.4, (8, 3, 3, 3)), "w2": rng.normal(0, 0.4, (8, 1, 3, 3)),
             "b2": rng.normal(0, 0.2, 8), "w3": rng.normal(0, 0.4, (4, 8, 1, 1))}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["d"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2],
                              group=8),
             helper.make_node("Relu", ["d"], ["s"]),
             helper.make_node("Conv", ["s", "w3"], ["y"], kernel_shape=[1, 1])]
    return _graph(nodes, inits, (1, 3, 8, 8), (1, 4, 4, 4), "depthwise")


MODELS = {**onnx_cnn.MODELS, "pooled": pooled, "depthwise": depthwise}
#: onnxruntime's default (uint8 activations) and asymmetric int8 activations
FORMS = {"uint8": (QuantType.QUInt8, {}), "int8-asymmetric": (QuantType.QInt8, {"ActivationSymmetric": False})}


def ort_quantize(model, data: np.ndarray, activation_type, extra_options: dict, tmp: str,
                 weight_type=QuantType.QInt8):
    """onnxruntime's ``quantize_static`` with its defaults but for ``activation_type`` (QDQ,
    per tensor, int8 weights unless ``weight_type`` says otherwise, MinMax calibration)."""

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": d} for d in data)

        def get_next(self):
            return next(self.it, None)

    onnx.save(model, f"{tmp}/f.onnx")
    quantize_static(f"{tmp}/f.onnx", f"{tmp}/q.onnx", Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=activation_type, weight_type=weight_type, extra_options=extra_options)
    return onnx.load(f"{tmp}/q.onnx")


def accel_macs(mod) -> tuple[int, int, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)
        compiled = tp.build(mod, "accel, llvm")
    report = compiled.report.to_json()
    return report["macs"]["accel"], report["total_macs"], compiled


@pytest.fixture(scope="module", params=[(m, f) for m in sorted(MODELS) for f in FORMS], ids="-".join)
def asymmetric(request, tmp_path_factory):
    name, form = request.param
    model = MODELS[name](seed=3)
    calibration = onnx_cnn.calibration(model, 16)
    qdq = ort_quantize(model, calibration["x"], *FORMS[form], str(tmp_path_factory.mktemp(name)))
    mod = from_onnx(qdq, keep_params_in_input=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        integer = tp.integerize()(mod)
    vm = relax.VirtualMachine(tvm.compile(integer, "llvm"), tvm.cpu())
    return SimpleNamespace(name=name, model=model, calibration=calibration, qdq=qdq, mod=mod, integer=integer,
                           warnings=caught, vm=vm)


@pytest.fixture(scope="module")
def symmetric_macs():
    """``symmetric_macs(key, model, calibration)``: (MACs on accel, total) of ``tp.quantize``'s
    symmetric form, built once per key."""
    made = {}

    def get(key, model, calibration):
        if key not in made:
            made[key] = accel_macs(from_onnx(tp.quantize(model, calibration), keep_params_in_input=False))[:2]
        return made[key]

    return get


def test_integer_arithmetic_without_a_warning(asymmetric):
    qdq, integer, caught = asymmetric.qdq, asymmetric.integer, asymmetric.warnings
    assert not [str(w.message) for w in caught if issubclass(w.category, IntegerizeWarning)]
    ops = [str(c.op.name) for c in calls(integer["main"])]
    # the input's quantize and the output's dequantize stay; everything between is integer
    assert ops.count("relax.quantize") == 1 and ops.count("relax.dequantize") == 1, ops
    for call in calls(integer["main"]):
        if str(call.op.name) in ("relax.nn.conv2d", "relax.matmul"):
            assert [str(a.ty.dtype) for a in call.args] == ["int8", "int8"]
    zero_points = [i for i in qdq.graph.initializer if "zero_point" in i.name]
    assert any(numpy_helper.to_array(z).any() for z in zero_points)      # the test means something


def test_within_one_step_of_onnxruntime(asymmetric):
    model, qdq, vm = asymmetric.model, asymmetric.qdq, asymmetric.vm
    session, step = exact_session(qdq), onnx_cnn.output_scale(qdq)
    steps = []
    for x in onnx_cnn.calibration(model, 12, seed=7)["x"]:
        ours = vm["main"](tvm.runtime.tensor(x)).numpy().astype(np.float64)
        steps.append(np.round(np.abs(ours - session.run(None, {"x": x})[0]) / step).ravel())
    steps = np.concatenate(steps)
    assert steps.max() <= 2 and np.mean(steps <= 1) >= 0.99, (steps.max(), np.mean(steps <= 1))


def test_no_int32_overflow(asymmetric):
    assert int32_overflows(asymmetric.integer["main"]) == []


def test_accel_bit_exact_and_as_many_macs_as_the_symmetric_form(asymmetric, symmetric_macs):
    on_accel, total, compiled = accel_macs(asymmetric.mod)
    for x in onnx_cnn.calibration(asymmetric.model, 3, seed=5)["x"]:
        assert np.array_equal(compiled(x), asymmetric.vm["main"](tvm.runtime.tensor(x)).numpy())
    sym_accel, sym_total = symmetric_macs(asymmetric.name, asymmetric.model, asymmetric.calibration)
    assert total == sym_total and on_accel == sym_accel > 0, (on_accel, sym_accel, total)


@pytest.mark.parametrize("pad", [0, 1, 2])
def test_padded_convolution_reads_the_zero_point_at_its_borders(pad, tmp_path):
    """A conv whose input is all positive (zero point far from 0 in the integers) with wide
    padding: every border position is exact, as onnxruntime pads the float tensor with 0.0."""
    rng = np.random.default_rng(pad)
    model = _graph([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[pad] * 4)],
                   {"w": rng.normal(0, 0.5, (5, 2, 3, 3))}, (1, 2, 5, 5), (1, 5, 3 + 2 * pad, 3 + 2 * pad), "conv")
    data = rng.uniform(1, 3, (10, 1, 2, 5, 5)).astype(np.float32)
    qdq = ort_quantize(model, data[:6], QuantType.QUInt8, {}, str(tmp_path))
    integer = tp.integerize()(from_onnx(qdq, keep_params_in_input=False))
    convs = [c for c in calls(integer["main"]) if str(c.op.name) == "relax.nn.conv2d"]
    assert [str(a.ty.dtype) for a in convs[0].args] == ["int8", "int8"]
    pads = [c for c in calls(integer["main"]) if str(c.op.name) == "relax.nn.pad"]
    assert len(pads) == (1 if pad else 0) and all(float(p.attrs.pad_value) == -128 for p in pads)
    assert int32_overflows(integer["main"]) == []
    vm = relax.VirtualMachine(tvm.compile(integer, "llvm"), tvm.cpu())
    session, step = exact_session(qdq), onnx_cnn.output_scale(qdq)
    for x in data[6:]:
        diff = np.abs(vm["main"](tvm.runtime.tensor(x)).numpy() - session.run(None, {"x": x})[0]) / step
        assert np.round(diff).max() <= 1, np.round(diff)


@pytest.mark.parametrize("name", ["conv_relu", "pooled", "depthwise"])
def test_weight_zero_points_are_exact(name, tmp_path, symmetric_macs):
    """uint8 weights have zero points (as have weights onnxruntime's default finds in
    ``Constant`` nodes and quantises as activations, Paddle's export): the ``- z_w * sum x``
    term is an all-ones convolution (a sum for a matmul), exact and within int32."""
    model = MODELS[name](seed=5)
    data = onnx_cnn.calibration(model, 14, seed=2)["x"]
    qdq = ort_quantize(model, data[:8], QuantType.QUInt8, {}, str(tmp_path), weight_type=QuantType.QUInt8)
    weights = [numpy_helper.to_array(i) for i in qdq.graph.initializer if i.name.endswith("_zero_point")]
    assert any(z.dtype == np.uint8 and z.any() for z in weights)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        integer = tp.integerize()(from_onnx(qdq, keep_params_in_input=False))
    assert not [str(w.message) for w in caught if issubclass(w.category, IntegerizeWarning)]
    assert int32_overflows(integer["main"]) == []
    # the weight zero points' window sums: more reductions than the model's own
    ops = [str(c.op.name) for c in calls(integer["main"])]
    own = sum(n.op_type in ("Conv", "MatMul", "Gemm", "AveragePool") for n in model.graph.node)
    assert ops.count("relax.nn.conv2d") + ops.count("relax.sum") > own
    vm = relax.VirtualMachine(tvm.compile(integer, "llvm"), tvm.cpu())
    session, step = exact_session(qdq), onnx_cnn.output_scale(qdq)
    on_accel, total, compiled = accel_macs(from_onnx(qdq, keep_params_in_input=False))
    sym_accel, sym_total = symmetric_macs((name, 5), model, {"x": data[:8]})
    # the window sums add MACs (the all-ones convolutions); the model's own are all on accel
    assert total > sym_total and on_accel >= sym_accel, (on_accel, sym_accel, total, sym_total)
    for x in data[8:]:
        ours = vm["main"](tvm.runtime.tensor(x)).numpy()
        assert np.array_equal(compiled(x), ours)
        diff = np.abs(ours - session.run(None, {"x": x})[0]) / step
        assert np.round(diff).max() <= 1, np.round(diff).max()
