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
difference in steps. ``--single`` integerises with ``tp.integerize(precise=False)`` (each
requantise one int32 product, not the default's two: see ``tirpat.model.integerize.fixed_point``).

``--layers MODEL ...`` finds where the integerised module departs from onnxruntime, layer by
layer: every int8 tensor of the QDQ model (each QuantizeLinear's output) becomes an output,
and its consumers read it from a new input instead, fed with onnxruntime's value of it. Each
layer then computes from onnxruntime's own inputs, and a difference is that layer's, not one
carried from an earlier layer and amplified. Printed: the layers whose int8 result differs,
with the operator, the share of elements and the largest difference in steps.

    python benchmarks/bench_integer_ops.py [--models ppocr_v2_cls ...] [--agreement ppocr_v2_cls ppocrv5_det]
                                           [--layers ppocr_v2_cls] [--images 8] [--single]
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
from onnx import TensorProto, helper
from tvm import relax

import tirpat as tp
from bench_real_models import MODELS, image, models_dir
from tirpat.model.onnx_import import import_onnx, preprocess_onnx
from tirpat.model.report import operator_share
from tirpat.testing import onnx_cnn
from tirpat.testing.ort_session import exact_session

CALIBRATION = 4


def integerised(name: str, work: pathlib.Path, precise: bool = True) -> tuple[pathlib.Path, tvm.IRModule, list]:
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
        mod = tp.integerize(precise)(mod)
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


def layers(name: str, qpath: pathlib.Path, images: int, precise: bool) -> list[tuple[str, str, float, int]]:
    """``(tensor, operator, share of elements that differ, largest difference in steps)`` for each
    int8 tensor of the QDQ model that the integerised module computes differently from
    onnxruntime given onnxruntime's inputs of that layer (the module docstring), in graph order."""
    shape, norm = MODELS[name]
    q = onnx.load(str(qpath))
    input_name = q.graph.input[0].name
    outputs = {o.name for o in q.graph.output}
    tensors = [n.output[0] for n in q.graph.node if n.op_type == "QuantizeLinear" and n.output[0] not in outputs]
    taps = onnx.load(str(qpath))
    taps.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.INT8, None) for t in tensors)
    session = exact_session(taps)
    xs = [image(shape, norm, np.random.default_rng(seed)) for seed in range(1, images + 1)]
    refs = [dict(zip([o.name for o in taps.graph.output], session.run(None, {input_name: x}))) for x in xs]
    # each consumer reads its int8 input from a new graph input: the layers come apart
    cut = onnx.load(str(qpath))
    for node in cut.graph.node:
        if node.op_type != "QuantizeLinear":
            for i, v in enumerate(node.input):
                if v in tensors:
                    node.input[i] = f"{v}__in"
    shapes = {input_name: shape}
    for t in tensors:
        shapes[f"{t}__in"] = list(refs[0][t].shape)
        cut.graph.input.append(helper.make_tensor_value_info(f"{t}__in", TensorProto.INT8, shapes[f"{t}__in"]))
        cut.graph.output.append(helper.make_tensor_value_info(t, TensorProto.INT8, None))
    path = qpath.with_name(f"{qpath.stem}_cut.onnx")
    onnx.save(cut, str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.IntegerizeWarning)
        mod = tp.integerize(precise)(import_onnx(path, shapes))
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    feeds = [i.name for i in cut.graph.input if i.name in shapes]      # the graph inputs, in order
    names = [o.name for o in cut.graph.output]
    diffs: dict = {t: [] for t in tensors}
    for x, ref in zip(xs, refs):
        values = {input_name: x, **{f"{t}__in": ref[t] for t in tensors}}
        ours = vm["main"](*[tvm.runtime.tensor(values[f]) for f in feeds])
        for i, o in enumerate(names):
            if o in diffs:
                diffs[o].append(np.abs(ours[i].numpy().astype(np.int64) - ref[o].astype(np.int64)).ravel())
    producer = {o: n for n in q.graph.node for o in n.output}
    out = []
    for t in tensors:
        d = np.concatenate(diffs[t])
        if d.max() > 0:
            op = producer.get(producer[t].input[0])
            out.append((t, op.op_type if op is not None else "input", float(np.mean(d > 0)), int(d.max())))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS), metavar="NAME")
    ap.add_argument("--agreement", nargs="*", choices=list(MODELS), default=[], metavar="NAME",
                    help="models also compared with onnxruntime's exact QDQ run (compiles them for llvm)")
    ap.add_argument("--layers", nargs="*", choices=list(MODELS), default=[], metavar="NAME",
                    help="models whose layers are each compared with onnxruntime given onnxruntime's inputs")
    ap.add_argument("--images", type=int, default=8, help="images per agreement (default 8)")
    ap.add_argument("--single", action="store_true",
                    help="integerise with tp.integerize(precise=False): one int32 product per requantise")
    args = ap.parse_args(argv)
    found = False
    with tempfile.TemporaryDirectory(prefix="bench-intops-") as tmp:
        for name in args.models:
            if not (models_dir() / f"{name}.onnx").is_file():
                print(f"{name}: skipped, not in {models_dir()} (fetch with ../shared/realmodels/fetch.sh)",
                      file=sys.stderr)
                continue
            found = True
            qpath, mod, said = integerised(name, pathlib.Path(tmp), not args.single)
            print(f"{name}: {operator_share(mod)}")
            for message in said:
                print(f"    {message}")
            if name in args.agreement:
                within, exact, worst = agreement(name, qpath, mod, args.images)
                print(f"    output vs onnxruntime exact QDQ, {args.images} images: {100 * within:.2f}% within one "
                      f"step, {100 * exact:.2f}% equal, largest {worst:.0f} steps")
            if name in args.layers:
                departing = layers(name, qpath, args.images, not args.single)
                print(f"    layers that depart from onnxruntime given its inputs, {args.images} images: "
                      f"{len(departing)}")
                for tensor, op, share, worst in departing:
                    print(f"        {tensor} ({op}): {100 * share:.3f}% of elements, largest {worst} steps")
            sys.stdout.flush()
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
