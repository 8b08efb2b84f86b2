"""Accuracy of tp.quantize + tp.integerize on small CNNs, against onnxruntime.

For each model (``tirpat.testing.onnx_cnn``: conv_relu, strided, residual), each repeat
builds it with another weight seed, quantises it with ``tp.quantize`` (per tensor, or
``--per-channel``) and runs, on the same random inputs, onnxruntime's exact QDQ execution of
the QDQ model (the reference: ``tirpat.testing.ort_session.exact_session``, graph
optimisation at ``ORT_ENABLE_BASIC``), the integerised Relax module compiled by
``tvm.compile`` for llvm, the QDQ model built by ``tp.build(..., "accel, llvm")`` (accel
integerises it itself) on the simulator, and onnxruntime's default session, which fuses the
QDQ groups into its int8 kernels (a speed reference only: on x86 CPUs without VNNI those
kernels saturate, so its values depend on the CPU). It reports medians over the repeats of:

- the largest and the mean difference in output quantisation steps vs onnxruntime's exact
  QDQ execution, and the share of output elements within one step (targets: max <= 2,
  >= 99% within one);
- top-1 agreement with the float model: ours, onnxruntime's exact QDQ execution (the
  reference, same run), and the ratio;
- the share of the model's MACs on accel (target >= 90%) and whether accel's outputs equal
  llvm's bit for bit on every input;
- onnxruntime's time per input, exact QDQ and fused int8, and how far the fused kernels land
  from the exact QDQ result on this CPU (max steps), both labelled as the speed reference.

    python benchmarks/bench_quantize.py [--repeats 5] [--inputs 200] [--per-channel]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import warnings

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from timing import median_times  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.testing import onnx_cnn  # noqa: E402
from tirpat.testing.ort_session import exact_session, fused_session  # noqa: E402


def measure(name: str, seed: int, inputs: int, per_channel: bool) -> dict:
    model = onnx_cnn.MODELS[name](seed=seed)
    qdq = tp.quantize(model, onnx_cnn.calibration(model, 32, seed=seed + 100), per_channel=per_channel)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tp.IntegerizeWarning)   # nothing may stay float
        mod = tp.integerize()(from_onnx(qdq, keep_params_in_input=False))
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)     # the report says what stays on the host
        on_accel = tp.build(from_onnx(qdq, keep_params_in_input=False), "accel, llvm")
    macs = on_accel.report.to_json()
    reference, fused, float_model = exact_session(qdq), fused_session(qdq), exact_session(model)
    step = onnx_cnn.output_scale(qdq)
    xs = onnx_cnn.calibration(model, inputs, seed=seed + 200)["x"]
    steps, fused_steps, ours_top1, ref_top1, exact = [], [], 0, 0, True
    for x in xs:
        ours = vm["main"](tvm.runtime.tensor(x)).numpy()
        exact &= bool(np.array_equal(on_accel(x), ours))
        ref = reference.run(None, {"x": x})[0]
        label = float_model.run(None, {"x": x})[0].argmax()
        steps.append(np.round(np.abs(ours.astype(np.float64) - ref) / step).ravel())
        fused_steps.append(np.round(np.abs(fused.run(None, {"x": x})[0].astype(np.float64) - ref) / step).ravel())
        ours_top1 += int(ours.argmax() == label)
        ref_top1 += int(ref.argmax() == label)
    steps = np.concatenate(steps)
    # interleaved over the inputs, so that load from other processes hits both sessions alike
    exact_s, fused_s = median_times([lambda: [reference.run(None, {"x": x}) for x in xs],
                                     lambda: [fused.run(None, {"x": x}) for x in xs]], repeats=3)
    return {"max": steps.max(), "mean": steps.mean(), "within1": np.mean(steps <= 1),
            "top1": ours_top1 / inputs, "ref_top1": ref_top1 / inputs,
            "accel": macs["macs"].get("accel", 0) / macs["total_macs"], "exact": exact,
            "ort_ms": 1e3 * exact_s / inputs, "fused_ms": 1e3 * fused_s / inputs,
            "fused_max": np.concatenate(fused_steps).max()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="weight seeds per model (medians are quoted)")
    ap.add_argument("--inputs", type=int, default=200, help="random inputs per seed")
    ap.add_argument("--per-channel", action="store_true", help="per-output-channel weight scales")
    args = ap.parse_args()
    mode = "per channel" if args.per_channel else "per tensor"
    print(f"int8 ({mode}) vs onnxruntime's exact QDQ execution (ORT_ENABLE_BASIC), "
          f"medians over {args.repeats} seeds x {args.inputs} inputs")
    print(f"{'model':>10} | {'max steps':>9} {'mean steps':>10} {'<=1 step':>8} | "
          f"{'top-1 ours':>10} {'top-1 ort':>9} {'ratio':>6} | {'MACs on accel':>13} {'accel == llvm':>13} | "
          f"{'ort exact ms':>12} {'ort fused ms':>12} {'fused max steps':>15}")
    for name in onnx_cnn.MODELS:
        runs = [measure(name, seed, args.inputs, args.per_channel) for seed in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "exact"}
        worst = max(r["max"] for r in runs)
        exact = "yes" if all(r["exact"] for r in runs) else "NO"
        print(f"{name:>10} | {med['max']:>5.0f} ({worst:.0f}) {med['mean']:>10.4f} {med['within1']:>8.2%} | "
              f"{med['top1']:>10.1%} {med['ref_top1']:>9.1%} {med['top1'] / med['ref_top1']:>6.3f} | "
              f"{med['accel']:>13.1%} {exact:>13} | "
              f"{med['ort_ms']:>12.3f} {med['fused_ms']:>12.3f} {med['fused_max']:>15.0f}")
    print("max steps: median (worst) over seeds")
    print("ort fused: onnxruntime's default session (QDQ fused into its int8 kernels), a speed reference "
          "only: its values depend on the CPU (int16 saturation without VNNI); 'fused max steps' is its "
          "distance from the exact QDQ result here")


if __name__ == "__main__":
    main()
