"""The console script on ONNX models as other frameworks export them (Paddle's ``-1`` batch, a
Reshape whose new shape the graph computes, BatchNormalization, opset 11): ``compile`` + ``run``
give onnxruntime's result, ``--no-preprocess`` fails in one line naming the file and the node,
``quantize`` takes the ``-1`` batch, writes per-channel models onnxruntime loads and keeps the
nodes asked for in float."""

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx  # noqa: E402

from tirpat.testing.onnx_exported import exported  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402

SHAPE = [2, 3, 8, 8]
SHAPES = "x:[2,3,8,8]"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("exported")
    onnx.save(exported(11), str(path / "m.onnx"))
    np.savez(path / "calib.npz", x=np.random.default_rng(0).standard_normal((4, 1, *SHAPE[1:])).astype(np.float32))
    return path


def onnxruntime_basic(path, x):
    return exact_session(path).run(None, {"x": x})[0]


def test_compile_and_run_give_onnxruntimes_result(tirpat, model_dir):
    compiled = tirpat("compile", "m.onnx", "-t", "llvm", "--input-shapes", SHAPES, "-o", "m.tirpat", cwd=model_dir)
    assert compiled.returncode == 0, compiled.stderr
    assert "warning" not in compiled.stderr, compiled.stderr
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    np.savez(model_dir / "in.npz", x=x)
    ran = tirpat("run", "m.tirpat", "--inputs", "in.npz", "-o", "out.npz", cwd=model_dir)
    assert ran.returncode == 0, ran.stderr
    with np.load(model_dir / "out.npz") as out:
        np.testing.assert_allclose(out["output_0"], onnxruntime_basic(model_dir / "m.onnx", x), rtol=1e-4, atol=1e-5)


def test_without_preprocessing_the_error_names_the_file_and_the_node(tirpat_inline, error_line, model_dir):
    """TVM's C++ log ("BlockBuilder destroyed with remaining blocks!") used to follow the error."""
    result = tirpat_inline("compile", "m.onnx", "-t", "llvm", "--input-shapes", SHAPES, "--no-preprocess", "-o", "np.tirpat",
                    cwd=model_dir)
    error_line(result, "tirpat compile: error: m.onnx: TVM's ONNX frontend failed at node 'flatten' (Reshape): ",
               "pre-processing was off")
    assert result.stdout == ""


def test_quantize_takes_the_minus_one_batch_and_per_channel_on_opset_11(tirpat, model_dir):
    result = tirpat("quantize", "m.onnx", "-o", "q.onnx", "--calibration", "calib.npz", "--per-channel", cwd=model_dir)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    x = np.random.default_rng(2).standard_normal([1, *SHAPE[1:]]).astype(np.float32)
    assert onnxruntime_basic(model_dir / "q.onnx", x).shape == (1, 5)     # loads: the model was upgraded to opset 13


def test_quantize_keeps_excluded_nodes_in_float(tirpat_inline, model_dir):
    result = tirpat_inline("quantize", "m.onnx", "-o", "kept.onnx", "--calibration", "calib.npz", "--exclude", "conv",
                    "--float-outputs", "y", cwd=model_dir)
    assert result.returncode == 0, result.stderr
    q = onnx.load(str(model_dir / "kept.onnx"))
    producers = {out: n.op_type for n in q.graph.node for out in n.output}
    conv = next(n for n in q.graph.node if n.name == "conv")
    assert conv.input[1] not in producers, "conv's weight stays a float initializer"
    assert producers["y"] == "Add"
    assert any(n.op_type == "DequantizeLinear" for n in q.graph.node), "the rest is quantised"


def test_quantize_names_a_node_the_model_lacks(tirpat_inline, error_line, model_dir):
    error_line(tirpat_inline("quantize", "m.onnx", "-o", "bad.onnx", "--calibration", "calib.npz", "--exclude", "nope",
                      cwd=model_dir),
               "tirpat quantize: error: no node named 'nope' in the model")
    assert not (model_dir / "bad.onnx").exists()
