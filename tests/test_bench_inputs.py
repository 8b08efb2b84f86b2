"""benchmarks/bench_real_models.py checks the models given by --onnx before it measures any:
a quantised one is refused with a message, not with tp.quantize's traceback minutes later."""

import importlib.util
import pathlib

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_real_models.py"


def bench():
    spec = importlib.util.spec_from_file_location("bench_real_models", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_quantised_onnx_model_is_refused_before_measuring(tmp_path):
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s"], ["q"]), helper.make_node("DequantizeLinear", ["q", "s"], ["y"])],
        "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])], [scale])
    path = tmp_path / "m_int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(SystemExit, match="already quantised .*give the float model"):
        bench().main(["--models", "--onnx", str(path)])
