"""Opt-in (``pytest -m realmodels``): PaddleOCR's classifier quantised by onnxruntime's
*default* ``quantize_static`` (uint8 activations with zero points; without
``quant_pre_process``, its weights, Paddle's ``Constant`` nodes, quantised as uint8 activations
too) compiles for ``accel, llvm`` with every convolution and matmul integerised (no site left
in float for a zero point), and puts at least as many MACs on accel as ``tirpat quantize``'s
symmetric form (the weight zero points' window sums add MACs of their own).

The model is read from ``$TIRPAT_REALMODELS`` or ``~/.cache/tirpat-realmodels``; without it
the test is skipped, saying so."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.realmodels

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME, SHAPE = "ppocr_v2_cls", [1, 3, 48, 192]


def tirpat(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    result = subprocess.run([sys.executable, "-m", "tirpat", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=3600)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def test_onnxruntime_default_quantize_static_offloads_as_tirpat_quantize(tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    source = pathlib.Path(os.environ.get("TIRPAT_REALMODELS") or pathlib.Path.home() / ".cache" / "tirpat-realmodels")
    source = source / f"{NAME}.onnx"
    if not source.is_file():
        pytest.skip(f"{source} not found: fetch the models with ../shared/realmodels/fetch.sh")
    data = np.random.default_rng(0).uniform(-1, 1, (8, *SHAPE)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=data)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"x": d} for d in data)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(source), str(tmp_path / "ort.onnx"), Reader(), quant_format=QuantFormat.QDQ)
    tirpat("quantize", source, "-o", "tp.onnx", "--calibration", "calib.npz", cwd=tmp_path)
    macs = {}
    for form in ("ort", "tp"):
        result = tirpat("compile", f"{form}.onnx", "-t", "accel, llvm", "--input-shapes", f"x:{SHAPE}",
                        "--report", f"{form}.json", cwd=tmp_path)
        # the float operators left are those with no integer rule (softmax) or whose result the
        # model leaves unquantised (hardsigmoid's divide, read by a max pool in float), never a
        # convolution or matmul declined for its zero points
        integerized = [line for line in result.stderr.splitlines() if "tp.integerize left" in line]
        assert not any(f"; {op}: " in line or f"declined: {op}: " in line
                       for line in integerized for op in ("conv2d", "matmul")), result.stderr
        macs[form] = json.loads((tmp_path / f"{form}.json").read_text())["macs"]["accel"]
    assert macs["ort"] >= macs["tp"] > 0, macs
