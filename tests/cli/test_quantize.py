"""``tirpat quantize``: the real console script on a float CNN; bad input is one line."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tirpat.cli import quantize as quantize_command  # noqa: E402
from tirpat.model.quantize import METHODS  # noqa: E402
from tirpat.testing import onnx_cnn  # noqa: E402


@pytest.fixture(scope="module")
def float_cnn(tmp_path_factory):
    """A float CNN and its calibration data, written to files."""
    where = tmp_path_factory.mktemp("float_cnn")
    model = onnx_cnn.strided(seed=2, channels=8)
    onnx.save(model, str(where / "cnn.onnx"))
    np.savez(where / "calib.npz", **onnx_cnn.calibration(model, 8))
    return where / "cnn.onnx", where / "calib.npz"


def test_quantize_with_calibration(tirpat, float_cnn, tmp_path):
    model, calib = float_cnn
    result = tirpat("quantize", model, "-o", "int8.onnx", "--calibration", calib, "--per-channel", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "wrote int8.onnx" in result.stdout and "per output channel" in result.stdout
    q = onnx.load(str(tmp_path / "int8.onnx"))
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "Gemm"} <= {n.op_type for n in q.graph.node}


def test_quantize_without_calibration_warns(tirpat_here, float_cnn, tmp_path):
    model, _ = float_cnn
    status, out, err = tirpat_here("quantize", model)
    assert status == 0
    assert err.startswith("tirpat quantize: warning: no calibration data") and "meaningless" in err
    assert len(err.strip().splitlines()) == 1
    assert (model.parent / "cnn_int8.onnx").exists()        # the default name, beside MODEL


def test_bad_input(tirpat, tirpat_inline, error_line, float_cnn, tmp_path):
    model, calib = float_cnn
    error_line(tirpat("quantize", "nope.onnx", cwd=tmp_path), "tirpat quantize: error: nope.onnx: no such file")
    (tmp_path / "m.py").write_text("x = 1")
    error_line(tirpat_inline("quantize", "m.py", cwd=tmp_path), "m.py: tirpat quantize takes a float .onnx model")
    np.savez(tmp_path / "wrong.npz", y=np.zeros((2, 1, 3, 16, 16), np.float32))
    error_line(tirpat_inline("quantize", model, "--calibration", "wrong.npz", "-o", "q.onnx", cwd=tmp_path),
               "calibration data has no array for input 'x' (it has 'y')")
    error_line(tirpat_inline("quantize", model, "--calibration", "missing.npz", "-o", "q.onnx", cwd=tmp_path),
               "no calibration file 'missing.npz'")
    error_line(tirpat_inline("quantize", model, "-o", "no/such/dir/q.onnx", "--calibration", calib, cwd=tmp_path),
               "no such directory 'no/such/dir'")


def test_quantize_never_replaces_its_input_or_another_kind_of_file(tirpat, tirpat_inline, error_line, float_cnn,
                                                                   tmp_path):
    """``tirpat quantize m.onnx -o m.onnx`` used to replace the float model by its QDQ form."""
    model, calib = float_cnn
    (tmp_path / "m.onnx").write_bytes(model.read_bytes())
    (tmp_path / "keep.json").write_text("{}")
    error_line(tirpat("quantize", "m.onnx", "-o", "m.onnx", "--calibration", calib, cwd=tmp_path),
               "tirpat quantize: error: m.onnx: -o names MODEL itself; choose another -o")
    error_line(tirpat_inline("quantize", "m.onnx", "-o", "keep.json", "--calibration", calib, cwd=tmp_path),
               "keep.json: exists and its name does not end in .onnx; not replacing it")
    error_line(tirpat_inline("quantize", "m.onnx", "-o", calib, "--calibration", calib, cwd=tmp_path),
               "-o names --calibration itself")
    assert (tmp_path / "m.onnx").read_bytes() == model.read_bytes()
    assert (tmp_path / "keep.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json", "m.onnx"]


def test_the_generator_says_what_it_wrote(tmp_path, script):
    import subprocess
    import sys

    _, env = script
    result = subprocess.run([sys.executable, "-m", "tirpat.testing.onnx_cnn", "residual", "cnn.onnx",
                             "--calibration", "calib"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "wrote cnn.onnx: the residual CNN, float32, seed 0",
        "wrote calib: calibration data for 'tirpat quantize --calibration'"]
    assert onnx.load(str(tmp_path / "cnn.onnx")).graph.node
    with np.load(tmp_path / "calib") as data:       # exactly the path given
        assert data.files


@pytest.mark.parametrize("args, problem", [(["nowhere/cnn.onnx"], "nowhere/cnn.onnx: no such directory 'nowhere'"),
                                           (["cnn.onnx", "--calibration", "nowhere/c.npz"],
                                            "nowhere/c.npz: no such directory 'nowhere'"),
                                           (["."], ".: is a directory")])
def test_the_generator_refuses_a_path_it_cannot_write_in_one_line(args, problem, tmp_path, monkeypatch, capsys):
    from tirpat.testing.onnx_cnn import main

    monkeypatch.chdir(tmp_path)
    assert main(["residual", *args]) == 1
    assert capsys.readouterr().err == f"python -m tirpat.testing.onnx_cnn: error: {problem}\n"
    assert list(tmp_path.iterdir()) == []        # refused before writing anything


def test_refuses_a_quantised_model(tirpat_inline, error_line, float_cnn, tmp_path):
    """Quantising a QDQ model again wrote an invalid ONNX (duplicate node names), exit 0."""
    import tirpat as tp

    model, calib = float_cnn
    onnx.save(tp.quantize(str(model), str(calib)), str(tmp_path / "q.onnx"))
    error_line(tirpat_inline("quantize", "q.onnx", "-o", "again.onnx", "--calibration", calib, cwd=tmp_path),
               "tirpat quantize: error: the model is already quantised: it has DequantizeLinear (e.g. '",
               "QuantizeLinear", "quantise the float model it came from")
    assert not (tmp_path / "again.onnx").exists()


def test_calibration_values_and_dtypes(tirpat, tirpat_inline, error_line, float_cnn, tmp_path):
    """NaN, infinite and integer calibration data are refused naming the input; data that is
    zero everywhere is quantised with a warning naming the input."""
    model, calib = float_cnn
    x = np.load(calib)["x"]
    cases = {"nan.npz": np.full_like(x, np.nan), "inf.npz": np.where(x > 2, np.inf, x),
             "int.npz": np.round(x).astype(np.int8)}
    for name, data in cases.items():
        np.savez(tmp_path / name, x=data)
    error_line(tirpat("quantize", model, "--calibration", "nan.npz", "-o", "q.onnx", cwd=tmp_path),
               f"calibration array 'x' has {x.size} NaN values (of {x.size}); calibration needs finite data")
    error_line(tirpat_inline("quantize", model, "--calibration", "inf.npz", "-o", "q.onnx", cwd=tmp_path),
               f"calibration array 'x' has {int((x > 2).sum())} infinite value")
    error_line(tirpat_inline("quantize", model, "--calibration", "int.npz", "-o", "q.onnx", cwd=tmp_path),
               "calibration array 'x' is int8; the input is float32")
    assert not (tmp_path / "q.onnx").exists()
    np.savez(tmp_path / "zero.npz", x=np.zeros_like(x))
    zero = tirpat("quantize", model, "--calibration", "zero.npz", "-o", "q.onnx", cwd=tmp_path)
    assert zero.returncode == 0, zero.stderr
    assert zero.stderr.startswith("tirpat quantize: warning: calibration data for input 'x' is zero on every sample")
    assert len(zero.stderr.strip().splitlines()) == 1


def test_usage_error(tirpat_inline, error_line, float_cnn, tmp_path):
    error_line(tirpat_inline("quantize", float_cnn[0], "--method", "best", cwd=tmp_path), "invalid choice: 'best'", status=2)


def test_methods_are_the_libraries():
    assert quantize_command._METHODS == METHODS


def test_readme_flow_quantize_compile_run(tirpat, float_cnn, tmp_path):
    """The README's flow: quantise a float CNN, compile it for accel (which integerises it),
    run it; the MACs go to accel and the output is the float model's shape."""
    import json

    model, calib = float_cnn
    assert tirpat("quantize", model, "-o", "q.onnx", "--calibration", calib, cwd=tmp_path).returncode == 0
    compiled = tirpat("compile", "q.onnx", "-t", "accel, llvm", "-o", "q.tirpat", "--report", "r.json", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["macs"]["accel"] >= 0.9 * report["total_macs"]
    ran = tirpat("run", "q.tirpat", "-o", "out.npz", "--profile", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert np.load(tmp_path / "out.npz")["output_0"].shape == (1, 10)
    assert "accel:" in ran.stdout and "cycles" in ran.stdout


def test_calibration_that_is_not_an_npz_never_suggests_unpickling(tirpat, tirpat_inline, error_line, float_cnn,
                                                                   tmp_path):
    """numpy's advice to pass allow_pickle= is not for a user who gave the wrong file."""
    model, _ = float_cnn
    (tmp_path / "bad.onnx").write_bytes(model.read_bytes())
    np.save(tmp_path / "one.npy", np.zeros((2, 1, 3, 16, 16), np.float32))
    np.savez(tmp_path / "objects.npz", x=np.array([{"a": 1}], dtype=object))
    for calibration, why in [("bad.onnx", "not an .npz of arrays (neither a zip archive of .npy arrays nor an .npy file)"),
                             ("one.npy", "a single .npy array of shape [2, 1, 3, 16, 16], not an .npz of named arrays"),
                             ("objects.npz", "not an .npz of arrays (it holds arrays of Python objects, which are "
                                             "not loaded)")]:
        run = tirpat if calibration == "bad.onnx" else tirpat_inline     # the console script once
        line = error_line(run("quantize", model, "--calibration", calibration, "-o", "q.onnx", cwd=tmp_path),
                          f"tirpat quantize: error: '{calibration}': {why}; calibration data is an .npz keyed by "
                          "input name")
        assert "pickle" not in line
    assert not (tmp_path / "q.onnx").exists()


def _unloadable_models() -> dict:
    """Float models onnxruntime cannot load: an operator of a domain it does not know, and
    an opset newer than it supports."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    custom = helper.make_graph([helper.make_node("FooBar", ["x", "w"], ["y"], domain="com.example")],
                               "g", [x], [y], [w])
    matmul = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    return {"custom.onnx": helper.make_model(custom, opset_imports=[helper.make_opsetid("", 17),
                                                                    helper.make_opsetid("com.example", 1)]),
            "future.onnx": helper.make_model(matmul, opset_imports=[helper.make_opsetid("", 99)])}


def test_a_model_onnxruntime_cannot_load_is_one_line(tirpat_inline, error_line, tmp_path):
    """onnxruntime's pre-processing printed a traceback for these (and went on)."""
    for name, model in _unloadable_models().items():
        onnx.save(model, str(tmp_path / name))
    error_line(tirpat_inline("quantize", "custom.onnx", "-o", "q.onnx", cwd=tmp_path),
               "tirpat quantize: error: onnxruntime, which quantises the model, cannot load it: ",
               "com.example:FooBar(-1) is not a registered function/op")
    line = error_line(tirpat_inline("quantize", "future.onnx", "-o", "q.onnx", cwd=tmp_path),
                      "cannot load it: ONNX Runtime only *guarantees* support", "Opset 99")
    assert "onnxruntime_src" not in line and "[ONNXRuntimeError]" not in line
    assert not (tmp_path / "q.onnx").exists()


def test_tp_quantize_says_onnxruntime_cannot_load_the_model_before_calibrating():
    """In Python a ValueError, and no warning about random calibration for a model that is
    refused anyway."""
    import warnings

    import tirpat as tp

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"cannot load it: Fatal error: com\.example:FooBar"):
            tp.quantize(_unloadable_models()["custom.onnx"])
