"""Opt-in (``pytest -m realmodels``): the six PaddleOCR models of ``../shared/realmodels/``, as
fetched, through the README's commands with no manual step: ``tirpat compile`` (float),
``tirpat quantize`` (per tensor and per channel, calibration data of the input's shape stacked
on a leading axis), then ``tirpat compile`` + ``tirpat run`` of each int8 model.

The models are read from ``$TIRPAT_REALMODELS`` or ``~/.cache/tirpat-realmodels``; a test whose
model is missing there is skipped, saying so. The default run deselects the marker
(pyproject's ``addopts``); ``-m realmodels`` on the command line selects it. Each step runs
the console script, and a real model takes minutes: this is a benchmark of the flow, not CI.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.realmodels

TARGET = "accel, llvm"
TIMEOUT = 3600
#: model -> its input's shape for these runs (detectors at H = W = 320, recognisers at W = 320)
MODELS = {
    "ppocr_v2_cls": [1, 3, 48, 192],
    "ppocrv5_cls": [1, 3, 48, 192],
    "ppocrv6_rec_small": [1, 3, 48, 320],
    "ppocrv6_det_small": [1, 3, 320, 320],
    "ppocrv5_det": [1, 3, 320, 320],
    "ppocrv5_rec": [1, 3, 48, 320],
}
SCALES = {"per-tensor": [], "per-channel": ["--per-channel"]}
SAMPLES = 4


ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_tirpat(*args, cwd, timeout):
    """``python -m tirpat ARGS`` in ``cwd`` with this checkout first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, "-m", "tirpat", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def models_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("TIRPAT_REALMODELS") or pathlib.Path.home() / ".cache" / "tirpat-realmodels")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("realmodels")


def model(name: str, work: pathlib.Path) -> pathlib.Path:
    """``name``.onnx linked into ``work`` (outputs go next to it), or a skip saying where it was sought."""
    source = models_dir() / f"{name}.onnx"
    if not source.is_file():
        pytest.skip(f"{source} not found: fetch the models with ../shared/realmodels/fetch.sh DIR and set "
                    "TIRPAT_REALMODELS=DIR (default ~/.cache/tirpat-realmodels)")
    link = work / source.name
    if not link.exists():
        link.symlink_to(source)
    return link


def shapes(name: str) -> str:
    return f"x:[{','.join(map(str, MODELS[name]))}]"


def succeeded(result) -> None:
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("name", MODELS)
def test_compile_float(name, work):
    path = model(name, work)
    succeeded(run_tirpat("compile", path.name, "-t", TARGET, "--input-shapes", shapes(name), "-o",
                         f"{name}_float.tirpat", cwd=work, timeout=TIMEOUT))


def quantized(name: str, scales: str, work: pathlib.Path) -> pathlib.Path:
    out = work / f"{name}_{scales}.onnx"
    if not out.exists():
        path = model(name, work)
        calib = work / f"{name}_calib.npz"
        rng = np.random.default_rng(0)
        np.savez(calib, x=rng.uniform(-1, 1, (SAMPLES, *MODELS[name])).astype(np.float32))
        succeeded(run_tirpat("quantize", path.name, "-o", out.name, "--calibration", calib.name, *SCALES[scales],
                             cwd=work, timeout=TIMEOUT))
    return out


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("name", MODELS)
def test_quantize(name, scales, work):
    import onnxruntime as ort

    out = quantized(name, scales, work)
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])       # onnxruntime loads what was written


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("name", MODELS)
def test_compile_and_run_int8(name, scales, work):
    q = quantized(name, scales, work)
    compiled = q.with_suffix(".tirpat")
    succeeded(run_tirpat("compile", q.name, "-t", TARGET, "--input-shapes", shapes(name), "-o", compiled.name,
                         cwd=work, timeout=TIMEOUT))
    succeeded(run_tirpat("run", compiled.name, "-o", f"{compiled.stem}_out.npz", cwd=work, timeout=TIMEOUT))
