"""ONNX models as other frameworks export them (an open or ``-1`` batch, a Reshape whose shape
the graph computes, BatchNormalization, opsets 11 to 21) through ``tp.build`` and
``tp.quantize``: built and run like onnxruntime, quantised into models onnxruntime loads, with
the nodes asked for kept in float."""

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.model.onnx_import import OnnxImportError  # noqa: E402
from tirpat.testing.onnx_exported import exported  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402

SHAPE = (2, 3, 8, 8)


def reference(model, x):
    """onnxruntime's run of ``model`` at ORT_ENABLE_BASIC (the optimisation tirpat's pre-processing runs)."""
    return exact_session(model).run(None, {"x": x})[0]


def sample(seed=0):
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


@pytest.mark.parametrize("opset", [11, 21])
def test_build_runs_an_exported_model_like_onnxruntime(opset):
    """TVM's frontend alone fails on the computed Reshape shape; pre-processed, the model builds."""
    model = exported(opset)
    compiled = tp.build(model, "llvm", input_shapes={"x": list(SHAPE)})
    x = sample()
    np.testing.assert_allclose(np.asarray(compiled(x)), reference(model, x), rtol=1e-4, atol=1e-5)


def test_build_takes_a_path_and_a_named_batch(tmp_path):
    model = exported(13, batch="N")
    onnx.save(model, str(tmp_path / "m.onnx"))
    compiled = tp.build(tmp_path / "m.onnx", "llvm", input_shapes={"x": list(SHAPE)})
    x = sample(1)
    np.testing.assert_allclose(np.asarray(compiled(x)), reference(model, x), rtol=1e-4, atol=1e-5)


def test_without_preprocessing_the_frontend_error_names_the_model_and_the_node(tmp_path):
    onnx.save(exported(11), str(tmp_path / "m.onnx"))
    with pytest.raises(OnnxImportError) as caught:
        tp.build(str(tmp_path / "m.onnx"), "llvm", input_shapes={"x": list(SHAPE)}, preprocess=False)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'm.onnx'}: TVM's ONNX frontend failed at node "), message
    assert "(Reshape)" in message and "pre-processing was off" in message, message


def test_input_shapes_must_name_an_input():
    with pytest.raises(ValueError, match="input_shapes names 'y', but the model's inputs are 'x'"):
        tp.build(exported(13), "llvm", input_shapes={"y": [2, 5]})


def calibration(samples=4, batch=1):
    return {"x": np.random.default_rng(2).standard_normal((samples, batch, *SHAPE[1:])).astype(np.float32)}


def producers(model):
    return {out: n for n in model.graph.node for out in n.output}


def test_a_minus_one_batch_takes_the_calibration_size():
    """Paddle's ``dim_value: -1`` was read as a size of -1: calibration data was refused."""
    q = tp.quantize(exported(13), calibration(batch=2))
    x = sample(3)
    assert reference(q, x).shape == (2, 5)


def test_per_channel_on_opset_11_loads_in_onnxruntime():
    """DequantizeLinear's axis needs opset 13: the model is upgraded, not written invalid."""
    q = tp.quantize(exported(11), calibration(), per_channel=True)
    assert next(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) >= 13
    axes = [a for n in q.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute if a.name == "axis"]
    assert axes, "per-channel weights dequantise along an axis"
    x = np.random.default_rng(4).standard_normal((8, *SHAPE[1:])).astype(np.float32)
    float_y, int8_y = reference(exported(11), x), reference(q, x)
    assert np.corrcoef(float_y.ravel(), int8_y.ravel())[0, 1] > 0.95


def test_per_tensor_keeps_the_opset():
    q = tp.quantize(exported(11), calibration())
    assert next(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) == 11


@pytest.mark.parametrize("keep, node", [
    ({"exclude": ["conv"]}, "conv"),
    ({"exclude_op_types": ["MatMul"]}, "fc"),
])
def test_excluded_nodes_stay_in_float(keep, node):
    default, kept = tp.quantize(exported(13), calibration()), tp.quantize(exported(13), calibration(), **keep)
    weight = next(n.input[1] for n in default.graph.node if n.name == node)
    assert producers(default)[weight].op_type == "DequantizeLinear"
    weight = next(n.input[1] for n in kept.graph.node if n.name == node)
    assert weight not in producers(kept) and weight in {i.name for i in kept.graph.initializer}
    assert next(i for i in kept.graph.initializer if i.name == weight).data_type == onnx.TensorProto.FLOAT


def test_float_outputs_are_not_dequantised():
    default = tp.quantize(exported(13), calibration())
    kept = tp.quantize(exported(13), calibration(), float_outputs=["y"])
    assert producers(default)["y"].op_type == "DequantizeLinear"
    assert producers(kept)["y"].op_type == "Add"


@pytest.mark.parametrize("keep, message", [
    ({"exclude": ["nope"]}, "no node named 'nope' in the model"),
    ({"exclude": ["bn"]}, "no node named 'bn' in the model (after onnxruntime's pre-processing"),
    ({"exclude": ["fc1"]}, "did you mean 'fc'? its nodes are "),        # the README: an error lists what it has
    ({"exclude_op_types": ["LSTM"]}, "the model has no 'LSTM' node to keep in float"),
    ({"exclude_op_types": ["Cast"]}, "onnxruntime does not quantise 'Cast' nodes"),
    ({"float_outputs": ["z"]}, "'z' is not an output of the model (its outputs are 'y')"),
])
def test_what_to_keep_in_float_must_be_in_the_model(keep, message):
    with pytest.raises(ValueError) as caught:
        tp.quantize(exported(13), calibration(), **keep)
    assert message in str(caught.value)


@pytest.mark.parametrize("name", ["tirpat.model.onnx_import", "tirpat.testing.onnx_exported"])
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0


def test_a_model_onnxruntime_cannot_load_is_imported_as_it_is_with_a_warning(monkeypatch):
    """An operator onnxruntime lacks need not stop TVM: the step is skipped, and the user told."""
    from tirpat.model.onnx_import import import_onnx

    def refuse(*args, **kwargs):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : no kernel for Frobnicate")

    from tirpat.testing.onnx_cnn import residual

    monkeypatch.setattr(ort, "InferenceSession", refuse)
    model = residual(seed=0)          # no shapes computed in the graph: TVM's frontend takes it as it is
    with pytest.warns(UserWarning, match="the model: onnxruntime cannot load the model to pre-process it: "
                                         r"\[ONNXRuntimeError\] : 1 : FAIL : no kernel for Frobnicate; imported "
                                         "without pre-processing"):
        mod = import_onnx(model)
    assert "main" in [gv.name_hint for gv in mod.functions]


def test_a_gather_by_a_constant_index_reads_no_shape_at_run_time_and_prints_no_topi_warning(capfd):
    """PyTorch's ViT picks q, k and v by a Gather of a constant index: TVM's frontend fixes up a
    negative index with the data's shape read at run time (``shape_of``, left on the host) and
    gathers with a ``take`` of mode "fast", for which TOPI prints a segfault warning."""
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Gather", ["r", "i"], ["y"], axis=1)],
        "select", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(-1, np.int64), "i")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = tp.build(model, "llvm")
    x = sample()
    np.testing.assert_array_equal(np.asarray(compiled(x)), reference(model, x))
    host = compiled.report.text(verbose=True)
    assert "shape_of" not in host and "where" not in host, host
    assert "Fast mode" not in capfd.readouterr().err
