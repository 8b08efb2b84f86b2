"""tp.quantize: onnxruntime's quantize_static in tirpat's form (QDQ, int8, symmetric)."""

import doctest
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tirpat as tp  # noqa: E402
from tirpat.model import npz as npz_module  # noqa: E402
from tirpat.model import quantize as quantize_module  # noqa: E402
from tirpat.model.quantize import CalibrationError  # noqa: E402
from tirpat.testing import onnx_cnn  # noqa: E402


@pytest.fixture(scope="module")
def float_model():
    return onnx_cnn.conv_relu(seed=3, channels=8)


def initialisers(model) -> dict:
    return {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}


def dequantize_nodes(model):
    return [n for n in model.graph.node if n.op_type == "DequantizeLinear"]


@pytest.mark.parametrize("module", [quantize_module, npz_module, onnx_cnn])
def test_docstring_examples(module):
    assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0


def test_qdq_int8_symmetric(float_model):
    q = tp.quantize(float_model, onnx_cnn.calibration(float_model, 8))
    ops = {n.op_type for n in q.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm"} <= ops
    values = initialisers(q)
    for node in q.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            zero_point = values[node.input[2]]
            assert np.all(zero_point == 0), node.name            # symmetric
            assert zero_point.dtype in (np.int8, np.int32)       # int8 tensors, int32 biases
    weights = [values[n.input[0]] for n in dequantize_nodes(q) if n.input[0] in values]
    assert any(w.dtype == np.int8 and w.ndim == 4 for w in weights)
    assert all(values[n.input[1]].size == 1 for n in dequantize_nodes(q))   # per tensor by default


def test_per_channel_weight_scales(float_model):
    q = tp.quantize(float_model, onnx_cnn.calibration(float_model, 8), per_channel=True)
    values = initialisers(q)
    conv_weights = [n for n in dequantize_nodes(q) if values.get(n.input[0], np.zeros(0)).ndim == 4]
    assert conv_weights
    for node in conv_weights:
        assert values[node.input[1]].shape == (values[node.input[0]].shape[0],)   # one scale per output channel


def input_scale(q) -> float:
    node = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    return float(initialisers(q)[node.input[1]])


def test_calibration_sets_the_scales(float_model, tmp_path):
    data = onnx_cnn.calibration(float_model, 4)
    small = tp.quantize(float_model, data)
    path = tmp_path / "calib.npz"
    np.savez(path, x=data["x"] * 10)
    large = tp.quantize(float_model, path)
    # symmetric MinMax: the input scale is max|x| / 127
    assert input_scale(small) == pytest.approx(np.abs(data["x"]).max() / 127, rel=1e-6)
    assert input_scale(large) == pytest.approx(10 * input_scale(small), rel=1e-5)


def test_no_calibration_warns_and_is_seeded(float_model):
    with pytest.warns(UserWarning, match="meaningless"):
        a = tp.quantize(float_model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = tp.quantize(float_model)
    assert input_scale(a) == input_scale(b)


def test_input_model_unchanged_and_path_accepted(float_model, tmp_path):
    before = float_model.SerializeToString()
    path = tmp_path / "float.onnx"
    onnx.save(float_model, str(path))
    q = tp.quantize(str(path), onnx_cnn.calibration(float_model, 2))
    assert float_model.SerializeToString() == before
    assert any(n.op_type == "QuantizeLinear" for n in q.graph.node)


@pytest.mark.parametrize("calibration, message", [
    ({"y": np.zeros((2, 1, 3, 16, 16), np.float32)}, "no array for input 'x'"),
    ({"x": np.zeros((2, 1, 3, 16, 16), np.float32), "z": np.zeros(2)}, "unknown inputs 'z'"),
    ({"x": np.zeros((1, 3, 16, 16), np.float32)}, r"shape \[1, 3, 16, 16\]; the input needs \[samples, 1, 3, 16, 16\]"),
    ({"x": np.zeros((0, 1, 3, 16, 16), np.float32)}, "no samples"),
    ({"x": np.zeros((2, 1, 3, 16, 16), np.complex64)}, "complex64"),
    ({"x": np.ones((2, 1, 3, 16, 16), np.int8)}, "'x' is int8; the input is float32"),       # no silent conversion
    ({"x": np.full((2, 1, 3, 16, 16), 1e300)}, r"'x' has 1536 infinite values"),   # float64 out of float32's range
    ({"x": np.full((2, 1, 3, 16, 16), np.nan, np.float32)}, r"'x' has 1536 NaN values \(of 1536\)"),
    ({"x": np.ones((2, 1, 3, 16, 16), np.float32) * np.array([np.nan, -np.inf] + [1] * 14, np.float32)},
     r"'x' has 96 NaN and 96 infinite values \(of 1536\)"),
])
def test_bad_calibration(float_model, calibration, message):
    with pytest.raises(CalibrationError, match=message):
        tp.quantize(float_model, calibration)


def test_float64_calibration_serves_a_float32_input(float_model):
    x = np.random.default_rng(0).standard_normal((4, 1, 3, 16, 16))
    assert tp.quantize(float_model, {"x": x}).SerializeToString() == \
        tp.quantize(float_model, {"x": x.astype(np.float32)}).SerializeToString()


def test_zero_calibration_warns(float_model):
    with pytest.warns(UserWarning, match="calibration data for input 'x' is zero on every sample"):
        tp.quantize(float_model, {"x": np.zeros((2, 1, 3, 16, 16), np.float32)})


def test_refuses_a_quantised_model(float_model):
    """Quantising again would wrap the QDQ pairs in more: onnxruntime writes duplicate node names."""
    q = tp.quantize(float_model, onnx_cnn.calibration(float_model, 2))
    with pytest.raises(ValueError, match=r"already quantised: it has DequantizeLinear \(e.g. '.*'\), QuantizeLinear"):
        tp.quantize(q, onnx_cnn.calibration(float_model, 2))
    conv = onnx.helper.make_node("QLinearConv", list("abcdefgh"), ["y"], name="qc")
    integer_only = onnx.helper.make_model(onnx.helper.make_graph([conv], "g", [], []))
    with pytest.raises(ValueError, match=r"it has QLinearConv \(e.g. 'qc'\)"):
        tp.quantize(integer_only)


def test_bad_arguments(float_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="no model file"):
        tp.quantize(tmp_path / "missing.onnx")
    with pytest.raises(FileNotFoundError, match="no calibration file"):
        tp.quantize(float_model, tmp_path / "missing.npz")
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="not an ONNX model"):
        tp.quantize(tmp_path / "junk.onnx")
    (tmp_path / "junk.npz").write_bytes(b"not an npz")
    with pytest.raises(CalibrationError, match=r"'.*junk.npz': not an .npz of arrays \(neither a zip archive of "
                                               r"\.npy arrays nor an \.npy file\); calibration data is an \.npz"
                                               " keyed by input name") as raised:
        tp.quantize(float_model, tmp_path / "junk.npz")
    assert "pickle" not in str(raised.value)
    np.save(tmp_path / "one.npy", np.zeros((2, 1, 3, 16, 16), np.float32))
    with pytest.raises(CalibrationError, match=r"a single \.npy array of shape \[2, 1, 3, 16, 16\], not an \.npz"):
        tp.quantize(float_model, tmp_path / "one.npy")
    with pytest.raises(ValueError, match="unknown calibration method 'best'"):
        tp.quantize(float_model, method="best")
    with pytest.raises(TypeError, match="the model must be a path"):
        tp.quantize(42)


def test_samples_must_agree():
    inputs = {"a": ((2,), np.dtype("float32")), "b": ((2,), np.dtype("float32"))}
    with pytest.raises(CalibrationError, match=r"different numbers of samples: \[2, 3\]"):
        quantize_module.calibration_samples({"a": np.ones((2, 2), np.float32), "b": np.ones((3, 2), np.float32)}, inputs)


def boxes_and_scores():
    """A detector's head in small: box coordinates (0 to ~600) and sigmoid scores (0 to 1)
    concatenated, then flattened into the output."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((4, 4), 150.0, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["boxes"]), helper.make_node("Sigmoid", ["x"], ["scores"]),
         helper.make_node("Concat", ["boxes", "scores"], ["cat"], axis=1, name="head"),
         helper.make_node("Flatten", ["cat"], ["out"], name="flat")], "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_concat_that_zeroes_an_input_warns_with_the_nodes_to_keep_in_float():
    """A Concat whose values are quantised at a scale that holds one input in under a step (a
    detector's scores beside its boxes: every score 0) is warned of, naming it and the element
    moves after it (YOLOv5's Reshape) to keep in float; kept so, there is no warning."""
    model, calib = boxes_and_scores(), {"x": np.linspace(0, 1, 16, dtype=np.float32).reshape(4, 1, 4)}
    with pytest.warns(UserWarning, match=r"the input 'scores' of Concat 'head' \(up to 0.7.*: 0.1. steps of 4.2.*keep them "
                                         r"in float: exclude=\['head', 'flat'\] \(tirpat quantize --exclude head flat\)"):
        tp.quantize(model, calib)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tp.quantize(model, calib, exclude=["head", "flat"])
