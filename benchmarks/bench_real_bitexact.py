"""Whole real models on accel against llvm, bit for bit (PaddleOCR, from ../shared/realmodels).

For one float ONNX model fetched by ``fetch.sh`` (default ``ppocr_v2_cls.onnx``), this
fixes its input dimensions, lets onnxruntime's basic graph optimisation fold the computed
Reshape shapes TVM's ONNX frontend cannot import, quantises it with ``tp.quantize`` (per
tensor) on drawn text-line images (shapes and text, normalised as the model expects), then
builds the integerised module twice: ``tvm.compile(tp.integerize()(mod), "llvm")`` and
``tp.build(mod, "accel, llvm")``. It prints what runs where (operators in accel's partitions
and on the host, the table lookups each side, the MAC share), per image whether the two
outputs are equal and the largest difference, then how many images agree bit for bit and
accel's cycles per image.

    python benchmarks/bench_real_bitexact.py [--model ppocrv5_det] [--size 160] [--images 20]

Needs onnx, onnxruntime and pillow; the models are not part of the project.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import tvm
from tvm import relax

import tirpat as tp
from tirpat.cli.model_file import load_model
from tirpat.model.onnx_import import preprocess_onnx

CACHE = Path(os.environ.get("TIRPAT_REALMODELS", Path.home() / ".cache" / "tirpat-realmodels"))
#: per model: the input's height and width by default, and its normalisation (mean, std)
MODELS = {"cls": ((48, 192), (0.5, 0.5)), "det": ((160, 160), ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))),
          "rec": ((48, 320), (0.5, 0.5))}


def kind(name: str) -> str:
    return next(k for k in MODELS if k in name)


def fixed_dims(src: Path, shape: tuple, out: Path) -> None:
    """``src`` with input ``shape``, pre-processed as ``tirpat compile`` does, saved to ``out``."""
    m = onnx.load(str(src))
    onnx.save(preprocess_onnx(m, {m.graph.input[0].name: shape}, source=str(src)), str(out))


def images(n: int, hw: tuple, norm: tuple, seed: int) -> np.ndarray:
    """``n`` drawn images [n, 1, 3, H, W]: light backgrounds, bars, dark text, half rotated."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    h, w = hw
    mean, std = (np.asarray(v, np.float32) for v in norm)
    font = ImageFont.load_default()
    out = []
    for k in range(n):
        img = Image.new("RGB", (w, h), tuple(int(c) for c in rng.integers(180, 256, 3)))
        draw = ImageDraw.Draw(img)
        for _ in range(3):
            x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 4))
            draw.rectangle([x0, y0, x0 + int(rng.integers(2, 30)), y0 + int(rng.integers(2, 8))],
                           fill=tuple(int(c) for c in rng.integers(100, 220, 3)))
        for _ in range(max(1, h // 40)):
            draw.text((int(rng.integers(0, max(1, w - 80))), int(rng.integers(0, max(1, h - 14)))),
                      f"text {int(rng.integers(1000))}", fill=tuple(int(c) for c in rng.integers(0, 80, 3)), font=font)
        if k % 2:
            img = img.rotate(180)
        a = (np.asarray(img, np.float32) / 255.0 - mean) / std
        out.append(a.transpose(2, 0, 1)[None])
    return np.stack(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ppocr_v2_cls", help="a model name in the cache (without .onnx)")
    ap.add_argument("--size", type=int, nargs=2, metavar=("H", "W"), help="input height and width")
    ap.add_argument("--images", type=int, default=20)
    ap.add_argument("--calibration", type=int, default=16, help="calibration images")
    args = ap.parse_args()
    hw, norm = MODELS[kind(args.model)]
    hw = tuple(args.size) if args.size else hw
    with tempfile.TemporaryDirectory() as tmp:
        fixed = Path(tmp) / "fixed.onnx"
        fixed_dims(CACHE / f"{args.model}.onnx", (1, 3, *hw), fixed)
        calib = Path(tmp) / "calib.npz"
        np.savez(calib, **{onnx.load(str(fixed)).graph.input[0].name: images(args.calibration, hw, norm, 0)})
        quantised = Path(tmp) / "int8.onnx"
        onnx.save(tp.quantize(str(fixed), str(calib)), str(quantised))
        mod = load_model(quantised)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.time()
        vm = relax.VirtualMachine(tvm.compile(tp.integerize()(mod), "llvm"), tvm.cpu())
        print(f"llvm build {time.time() - t:.0f} s", flush=True)
        t = time.time()
        model = tp.build(mod, "accel, llvm")
        print(f"accel build {time.time() - t:.0f} s", flush=True)
    print(placement(model.report.to_json()), flush=True)
    same = cycles = 0
    for k, x in enumerate(images(args.images, hw, norm, 1)):
        want = vm["main"](tvm.runtime.tensor(x)).numpy()
        got = model(x)
        cycles += model.stats["accel"].cycles      # the last call's
        ok = bool(np.array_equal(want, got))
        same += ok
        print(f"image {k}: {'bit-exact' if ok else 'differs'}, max |accel - llvm| {float(np.abs(want - got).max()):.4g}",
              flush=True)
    print(f"{args.model}: {same} of {args.images} images bit-exact with llvm; accel "
          f"{cycles / args.images:,.0f} cycles an image")


def placement(report: dict) -> str:
    """What runs where, from a model's build report: operators in accel's partitions and on
    the host, table lookups (``relax.take``) each side, and accel's share of the MACs."""
    on_accel = [op for p in report["partitions"] if p["backend"] == "accel" for op in p["ops"]]
    host = [h["op"] for h in report["on_host"]]
    macs = report["macs"]
    total = sum(macs.values()) or 1
    return (f"operators: {len(on_accel)} in accel partitions ({on_accel.count('relax.take')} table lookups), "
            f"{len(host)} on the host ({host.count('relax.take')} table lookups); "
            f"MACs on accel {macs.get('accel', 0):,} of {total:,} ({macs.get('accel', 0) / total:.1%})")


if __name__ == "__main__":
    main()
