"""Integer operators in the integerised real models (PaddleOCR, ``../shared/realmodels/fetch.sh``),
and their outputs against onnxruntime's exact QDQ execution.

Each model is given its input's static shape and pre-processed as ``tirpat compile`` does
(``preprocess_onnx``), quantised per tensor by ``tp.quantize`` on a few structured images
(:mod:`bench_real_models`' ``image``), imported and integerised (``tp.integerize``). Printed per
model: the operator calls of the integerised module and the share that is integer arithmetic
(``tirpat.model.report.operator_share``: an integer result from integer tensors only), the
operators that are not, and ``tp.integerize``'s warning (what stayed in float, and why). With
``--agreement MODEL ...`` it also compiles those models for llvm and compares the output with
``exact_session`` (ORT_ENABLE_BASIC) on ``--images`` other images: the fraction of output
elements within one quantisation step of the output's scale, exactly equal, and the largest
difference in steps.

    python benchmarks/bench_integer_ops.py [--models ppocr_v2_cls ...] [--agreement ppocr_v2_cls ppocrv5_det]
                                           [--images 8]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import warnings

import numpy as np
import onnx
import tvm
from tvm import relax

import tirpat as tp
from bench_real_models import MODELS, image, models_dir
from tirpat.model.onnx_import import import_onnx, preprocess_onnx
from tirpat.model.report import operator_share
from tirpat.testing import onnx_cnn
from tirpat.testing.ort_session import exact_session

CALIBRATION = 4


def integerised(name: str, work: pathlib.Path) -> tuple[pathlib.Path, tvm.IRModule, list]:
    """The quantised model's path, its integerised module and integerize's warnings."""
    shape, norm = MODELS[name]
    path = models_dir() / f"{name}.onnx"
    model = onnx.load(str(path))
    input_name = model.graph.input[0].name
    fixed = work / f"{name}_fixed.onnx"
    onnx.save(preprocess_onnx(model, {input_name: shape}, source=str(path)), str(fixed))
    rng = np.random.default_rng(0)
    calib = np.stack([image(shape, norm, rng) for _ in range(CALIBRATION)])
    qpath = work / f"{name}_int8.onnx"
    onnx.save(tp.quantize(str(fixed), {input_name: calib}), str(qpath))
    mod = import_onnx(qpath, {input_name: shape})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = tp.integerize()(mod)
    return qpath, mod, [str(w.message) for w in caught if issubclass(w.category, tp.IntegerizeWarning)]


def agreement(name: str, qpath: pathlib.Path, mod: tvm.IRModule, images: int) -> tuple[float, float, float]:
    """(within one step, exact, largest difference in steps) of the output against onnxruntime."""
    shape, norm = MODELS[name]
    q = onnx.load(str(qpath))
    session, scale = exact_session(q), onnx_cnn.output_scale(q)
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    steps = []
    for seed in range(1, images + 1):
        x = image(shape, norm, np.random.default_rng(seed))
        ours = vm["main"](tvm.runtime.tensor(x)).numpy()
        ref = session.run(None, {q.graph.input[0].name: x})[0]
        steps.append(np.round(np.abs(ours.astype(np.float64) - ref) / scale).ravel())
    d = np.concatenate(steps)
    return float(np.mean(d <= 1)), float(np.mean(d == 0)), float(d.max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS), metavar="NAME")
    ap.add_argument("--agreement", nargs="*", choices=list(MODELS), default=[], metavar="NAME",
                    help="models also compared with onnxruntime's exact QDQ run (compiles them for llvm)")
    ap.add_argument("--images", type=int, default=8, help="images per agreement (default 8)")
    args = ap.parse_args(argv)
    found = False
    with tempfile.TemporaryDirectory(prefix="bench-intops-") as tmp:
        for name in args.models:
            if not (models_dir() / f"{name}.onnx").is_file():
                print(f"{name}: skipped, not in {models_dir()} (fetch with ../shared/realmodels/fetch.sh)",
                      file=sys.stderr)
                continue
            found = True
            qpath, mod, said = integerised(name, pathlib.Path(tmp))
            print(f"{name}: {operator_share(mod)}")
            for message in said:
                print(f"    {message}")
            if name in args.agreement:
                within, exact, worst = agreement(name, qpath, mod, args.images)
                print(f"    output vs onnxruntime exact QDQ, {args.images} images: {100 * within:.2f}% within one "
                      f"step, {100 * exact:.2f}% equal, largest {worst:.0f} steps")
            sys.stdout.flush()
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
