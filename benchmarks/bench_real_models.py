"""Real int8 models (PaddleOCR, ``../shared/realmodels/fetch.sh``): compile time and call wall
time of tirpat against TVM and onnxruntime, and the simulated device's cycles.

Each model is quantised per tensor by ``tp.quantize`` on a few structured calibration
images (dark text-like bars and boxes on a light background, normalised as the model's own
pre-processing does; random noise calibrates badly), imported once (``import_onnx``), then:

- compile: ``tp.build(mod, "accel, llvm")`` (which links the model's machine code, makes its VM
  and records the device's streams and their batched plans, running the model once on zeros: its
  time counts them all) against ``tvm.compile(tp.integerize()(mod), "llvm")`` (``tvm s``: the
  module tp.build compiles for the host once accel's ``PRE_PARTITION`` phase has integerised
  it), the reference's VM creation listed apart, and against ``tvm.compile(mod, "llvm")`` of
  the module as imported (``mod s``: its float QDQ form, fewer operators to compile);
- calls: the first call (which replays the streams the build recorded), the median of the later
  calls that follow it, and the median after those (``steady``), of
  the compiled model against onnxruntime's default session on the int8 model with one thread
  (``intra_op_num_threads=1``; the speed reference: what a CPU does with the same int8
  model), each with its ratio;
- device: simulated cycles, the roofline share of the model's own MACs on accel (the cycles
  those MACs take at the GEMM array's peak over the cycles simulated) and the share of the
  model's MACs on accel; ``diff``: the largest absolute difference of the outputs (all of a
  model's several) from the ``tvm.compile`` reference's; ``steps``: the largest difference from
  onnxruntime's exact QDQ run (``ORT_ENABLE_BASIC``, the accuracy reference) in each output's
  quantisation steps (over the outputs a DequantizeLinear produces);
- ``--tune``: the cycles after ``tp.tune`` with 64 trials (slow: off by default).

Models are read from ``$TIRPAT_REALMODELS`` or ``~/.cache/tirpat-realmodels``; a model that is
not there is skipped with a message. Any other float ONNX model with one NCHW image input is
measured the same way with ``--onnx PATH`` (its static input shape, or ``--shape`` for dynamic
dimensions; inputs normalised to [-1, 1]). Compile times are of one build each (a real model takes
tens of seconds); call times are medians of at least ``--repeats`` calls, and of more while they add up to under
a second.

    python benchmarks/bench_real_models.py [--models ppocr_v2_cls ppocrv5_det ...] [--repeats 5] [--tune]
    python benchmarks/bench_real_models.py --models --onnx yolo.onnx --shape 1x3x320x320
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np
import tvm
from tvm import relax

import tirpat as tp
from tirpat.model.onnx_import import import_onnx
from tirpat.model.quantize import quantised_operators
from tirpat.testing.onnx_cnn import output_scale
from tirpat.testing.ort_session import exact_session, fused_session

#: model -> its input's shape here (detectors at H = W = 320, recognisers at W = 320) and its normalisation
MODELS = {
    "ppocr_v2_cls": ([1, 3, 48, 192], "half"),
    "ppocrv5_cls": ([1, 3, 48, 192], "half"),
    "ppocrv6_det_small": ([1, 3, 320, 320], "imagenet"),
    "ppocrv5_det": ([1, 3, 320, 320], "imagenet"),
    "ppocrv6_rec_small": ([1, 3, 48, 320], "half"),
    "ppocrv5_rec": ([1, 3, 48, 320], "half"),
}
SAMPLES = 4
TUNE_TRIALS = 64
_MEAN = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
_STD = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)


def models_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("TIRPAT_REALMODELS") or pathlib.Path.home() / ".cache" / "tirpat-realmodels")


def image(shape, norm: str, rng: np.random.Generator) -> np.ndarray:
    """One structured input of ``shape`` (NCHW; N pictures for a batch of N): a light background
    with dark bars (lines of 'text', broken into words) and a box, in RGB / 255, normalised as
    the model's pre-processing does."""
    n, c, h, w = shape
    return np.concatenate([_picture(c, h, w, norm, rng) for _ in range(n)])


def _picture(c: int, h: int, w: int, norm: str, rng: np.random.Generator) -> np.ndarray:
    img = np.full((h, w, c), rng.uniform(0.75, 1.0, c), np.float32)
    img += np.linspace(0, rng.uniform(-0.15, 0.15), w, dtype=np.float32)[None, :, None]       # uneven lighting
    lines = max(1, h // 24)
    for line in range(lines):
        top = line * h // lines + rng.integers(2, max(3, h // lines // 4))
        height = max(2, h // lines // 2)
        x = int(rng.integers(0, w // 10))
        while x < w - 8:
            word = int(rng.integers(w // 20 + 2, w // 5 + 3))
            img[top:top + height, x:min(w, x + word)] = rng.uniform(0.0, 0.3, c)
            x += word + int(rng.integers(3, w // 20 + 4))
    y0, x0 = int(rng.integers(0, h // 2)), int(rng.integers(0, w // 2))
    img[y0:y0 + h // 4, x0:x0 + 2] = img[y0:y0 + h // 4, x0 + w // 4:x0 + w // 4 + 2] = 0.1        # a box's sides
    img = np.clip(img + rng.normal(0, 0.02, img.shape).astype(np.float32), 0, 1)
    x = img.transpose(2, 0, 1)[None]
    x = (x - 0.5) / 0.5 if norm == "half" else (x - _MEAN) / _STD
    return np.ascontiguousarray(x, np.float32)


#: calls are timed until they add up to this (see median_wall), up to MOST_CALLS of them
LEAST_SECONDS, MOST_CALLS = 1.0, 200


def median_wall(fn, repeats: int) -> float:
    """The median wall time of at least ``repeats`` calls of ``fn``, and of more while the calls
    so far took under ``LEAST_SECONDS`` (a few ms call measured 3 times is at the mercy of one
    preemption; the median of a second's worth is not)."""
    times = []
    while len(times) < repeats or (sum(times) < LEAST_SECONDS and len(times) < MOST_CALLS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def file_shape(path: pathlib.Path, given) -> list:
    """The input shape of a model given by file: its static shape, or ``given`` (``--shape``)
    where the model's dimensions are dynamic; SystemExit naming the problem otherwise."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    graph = proto.graph
    quantised = quantised_operators(proto)
    if quantised:   # else tp.quantize refuses it with a traceback, after the other models' minutes
        raise SystemExit(f"{path}: already quantised (it has {', '.join(sorted(quantised))}); this benchmark "
                         "quantises a float model itself: give the float model")
    inits = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise SystemExit(f"{path}: {len(inputs)} inputs; this benchmark feeds models with one image input")
    # a dimension named (dim_param) or written as -1 is dynamic
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in inputs[0].type.tensor_type.shape.dim]
    if given is not None:
        if len(given) != len(dims) or any(d is not None and d != g for d, g in zip(dims, given)):
            raise SystemExit(f"{path}: --shape {'x'.join(map(str, given))} does not fit the input's shape {dims}")
        return list(given)
    if len(dims) != 4 or None in dims:
        raise SystemExit(f"{path}: the input's shape {dims} is not a static NCHW image shape; give --shape NxCxHxW")
    return dims


def shape_arg(text: str) -> list:
    try:
        dims = [int(d) for d in text.lower().split("x")]
    except ValueError:
        dims = []
    if len(dims) != 4 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape NxCxHxW of positive integers")
    return dims


def arrays(out) -> list:
    """A model's outputs as arrays: one, or each of several (a detector's boxes and scores)."""
    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, np.ndarray):
        return [out]
    return [a for o in out for a in arrays(o)]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def measure(name: str, path: pathlib.Path, shape, norm: str, repeats: int, tune: bool, work: pathlib.Path) -> dict:
    import onnx

    rng = np.random.default_rng(0)
    input_name = onnx.load(str(path), load_external_data=False).graph.input[0].name
    calib = np.stack([image(shape, norm, rng) for _ in range(SAMPLES)])
    x = image(shape, norm, np.random.default_rng(1))
    qpath = work / f"{name}_int8.onnx"
    onnx.save(tp.quantize(path, {input_name: calib}), str(qpath))
    mod = import_onnx(qpath, {input_name: shape})
    row = {"model": name}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)      # a real model leaves operators on the host
        model, row["build"] = timed(lambda: tp.build(mod, "accel, llvm"))
        integer = tp.integerize()(mod)
        ex, row["tvm"] = timed(lambda: tvm.compile(integer, "llvm"))
        # the issue's own reference: the module tp.build was given, as imported (its float QDQ form)
        _, row["tvm_mod"] = timed(lambda: tvm.compile(mod, "llvm"))
    vm, row["vm"] = timed(lambda: relax.VirtualMachine(ex, tvm.cpu()))
    ref = arrays(vm["main"](tvm.runtime.tensor(x)))

    out, row["first"] = timed(lambda: model(x))
    row["later"] = median_wall(lambda: model(x), repeats)      # replayed from the plans the build recorded
    row["steady"] = median_wall(lambda: model(x), repeats)
    out = arrays(model(x))
    row["diff"] = max(float(np.max(np.abs(o.astype(np.float64) - r))) for o, r in zip(out, ref))
    # accuracy: onnxruntime's exact QDQ run of the int8 model, in each output's quantisation steps
    qdq = onnx.load(str(qpath))
    exact = exact_session(qdq).run(None, {input_name: x})
    row["steps"] = None         # a float output (no DequantizeLinear produces it) has no step to count in
    for i, (o, e) in enumerate(zip(out, exact)):
        try:
            steps = float(np.max(np.abs(o.astype(np.float64) - e)) / output_scale(qdq, i))
        except ValueError:
            continue
        row["steps"] = max(steps, row["steps"] or 0.0)
    stats = model.stats["accel"]
    row["cycles"] = stats.cycles
    accel_macs = model.report.macs.get("accel", 0)
    row["roofline"] = stats.mac_bound_cycles(accel_macs) / max(stats.cycles, 1)
    row["on_accel"] = accel_macs / max(model.report.total_macs, 1)
    row["macs"] = model.report.total_macs

    session = fused_session(qpath, threads=1)      # onnxruntime's int8 kernels: the speed reference
    _, row["ort_first"] = timed(lambda: session.run(None, {input_name: x}))
    row["ort_later"] = median_wall(lambda: session.run(None, {input_name: x}), repeats)

    if tune:
        records = work / f"{name}_records"
        tp.tune(mod, "accel, llvm", trials=TUNE_TRIALS, records=str(records))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tp.OffloadWarning)
            tuned = tp.build(mod, "accel, llvm", records=str(records))
        tuned(x)
        row["tuned"] = tuned.stats["accel"].cycles
    return row


def table(rows: list, tune: bool) -> str:
    head = (f"{'model':<18} {'MACs':>6} {'build s':>8} {'tvm s':>7} {'+VM s':>6} {'ratio':>6} {'mod s':>6} {'ratio':>6} "
            f"{'1st ms':>8} {'ort 1st':>8} {'ratio':>6} {'later ms':>9} {'steady':>7} {'ort ms':>7} {'later':>6} {'steady':>6} "
            f"{'cycles':>10} {'roofl':>6} {'accel':>6} {'diff':>8} {'steps':>6}" + (f" {'tuned gain':>10}" if tune else ""))
    lines = [head]
    for r in rows:
        # a small model's MACs with a decimal (an unseen model of 0.4 M MACs is not "0M")
        macs = f"{r['macs'] / 1e6:>5.1f}M" if r["macs"] < 10e6 else f"{r['macs'] / 1e6:>5.0f}M"
        line = (f"{r['model']:<18} {macs} {r['build']:>8.1f} {r['tvm']:>7.1f} {r['vm']:>6.1f} "
                f"{r['build'] / r['tvm']:>5.1f}x {r['tvm_mod']:>6.1f} {r['build'] / r['tvm_mod']:>5.1f}x "
                f"{r['first'] * 1e3:>8.0f} {r['ort_first'] * 1e3:>8.1f} "
                f"{r['first'] / r['ort_first']:>5.0f}x {r['later'] * 1e3:>9.0f} {r['steady'] * 1e3:>7.0f} "
                f"{r['ort_later'] * 1e3:>7.1f} {r['later'] / r['ort_later']:>5.1f}x {r['steady'] / r['ort_later']:>5.1f}x "
                f"{r['cycles']:>10,} {100 * r['roofline']:>5.0f}% "
                f"{100 * r['on_accel']:>5.0f}% {r['diff']:>8.2g} "
                + (f"{r['steps']:>6.0f}" if r["steps"] is not None else f"{'-':>6}"))
        if tune:
            line += f" {100 * (1 - r['tuned'] / r['cycles']):>9.1f}%"
        lines.append(line)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", choices=list(MODELS), default=list(MODELS), metavar="NAME",
                    help=f"models to measure (default all: {', '.join(MODELS)}; none with --models alone)")
    ap.add_argument("--onnx", nargs="+", default=[], type=pathlib.Path, metavar="PATH",
                    help="other float ONNX models with one NCHW image input, measured the same way")
    ap.add_argument("--shape", type=shape_arg, help="the input shape NxCxHxW of --onnx models with dynamic dimensions")
    ap.add_argument("--repeats", type=int, default=5, help="calls measured after the first, at least (median; more while they take under "
                         f"{LEAST_SECONDS:g} s; default 5)")
    ap.add_argument("--tune", action="store_true", help=f"also tune with {TUNE_TRIALS} trials and report the gain")
    args = ap.parse_args(argv)

    shapes = {}
    for path in args.onnx:      # every file checked before the first measurement (minutes each)
        if not path.is_file():
            raise SystemExit(f"{path}: no such file")
        shapes[path] = file_shape(path, args.shape)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        for name in args.models:
            path = models_dir() / f"{name}.onnx"
            if not path.is_file():
                print(f"{name}: skipped, {path} not found (fetch the models with ../shared/realmodels/fetch.sh DIR "
                      "and set TIRPAT_REALMODELS=DIR)", file=sys.stderr)
                continue
            shape, norm = MODELS[name]
            rows.append(measure(name, path, shape, norm, args.repeats, args.tune, pathlib.Path(tmp)))
            print(f"{name}: done", file=sys.stderr, flush=True)
        for path, shape in shapes.items():
            rows.append(measure(path.stem, path, shape, "half", args.repeats, args.tune,
                                pathlib.Path(tmp)))
            print(f"{path.stem}: done", file=sys.stderr, flush=True)
    if not rows:
        print("no model found: nothing measured", file=sys.stderr)
        return 1
    print(f"int8 per-tensor models; compile: one build each (tp.build(mod, \"accel, llvm\") vs "
          f"tvm.compile(integerised mod, \"llvm\"), its VM creation apart, and vs tvm.compile(mod, \"llvm\") "
          f"of the module as imported: mod s);\ncalls: first, and median of "
          f">= {args.repeats} later (and >= {LEAST_SECONDS:g} s of them), then of as many steady (replayed) ones, vs onnxruntime int8 default session, 1 thread (the speed reference; "
          "the ratios: later and steady over ort ms); "
          "roofl: roofline share of the model's MACs on accel; diff: max |output - tvm.compile's|;\n"
          "steps: max |output - onnxruntime's exact QDQ run (ORT_ENABLE_BASIC)| in output quantisation steps\n")
    print(table(rows, args.tune))
    return 0


if __name__ == "__main__":
    sys.exit(main())
