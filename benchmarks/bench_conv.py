"""accel.build on ResNet-style int8 conv2d layers: roofline share and run time vs numpy.

Layers (batch 1, 56x56, stride 1, topi ``conv2d_nhwc`` or ``conv2d_nchw``, int32 out):
- 3x3, 64 -> 64 channels, padding 1 (im2col gather by strided LOADs);
- 1x1, 256 -> 64 channels (a strided view of the input: the LOADs read it directly).

For each layer the same run measures, with medians over repeats:
- cycles of the cycle model vs ``roofline_cycles`` (``roofline_cycles / cycles``);
- wall time of the compiled module on the simulator (CPU steps included) vs numpy computing
  the same convolution as a sum over kernel taps of int32 matrix products.

    python benchmarks/bench_conv.py [--layouts NHWC NCHW] [--repeats 5]
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm import te, topi

import accel
from timing import median_time

LAYERS = [("3x3 64->64", 64, 64, 3, 1), ("1x1 256->64", 256, 64, 1, 0)]
SIZE = 56


def conv(layout: str, c: int, f: int, k: int, pad: int):
    """The topi workload: ``(prim_func, input shape, weight shape)``."""
    if layout == "NCHW":
        X = te.placeholder((1, c, SIZE, SIZE), "int8", name="X")
        W = te.placeholder((f, c, k, k), "int8", name="W")
        out = topi.nn.conv2d_nchw(X, W, 1, pad, 1, out_dtype="int32")
    else:
        X = te.placeholder((1, SIZE, SIZE, c), "int8", name="X")
        W = te.placeholder((k, k, c, f), "int8", name="W")
        out = topi.nn.conv2d_nhwc(X, W, 1, pad, 1, out_dtype="int32")
    shape = lambda t: tuple(int(d) for d in t.shape)  # noqa: E731
    return te.create_prim_func([X, W, out]), shape(X), shape(W), shape(out)


def numpy_conv(layout: str, x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """The reference: channels-last taps, one int32 matrix product per kernel tap."""
    if layout == "NCHW":
        x, w = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)
    xp = np.pad(x.astype(np.int32), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    kh, kw, c, f = w.shape
    out = np.zeros((x.shape[0], SIZE, SIZE, f), np.int32)
    w32 = w.astype(np.int32)
    for i in range(kh):
        for j in range(kw):
            out += (xp[:, i:i + SIZE, j:j + SIZE, :].reshape(-1, c) @ w32[i, j]).reshape(out.shape)
    return out.transpose(0, 3, 1, 2) if layout == "NCHW" else out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layouts", choices=["NHWC", "NCHW"], nargs="+", default=["NHWC", "NCHW"])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"conv2d, batch 1, {SIZE}x{SIZE}, medians of {args.repeats}")
    print(f"{'layer':>12} {'layout':>6} | {'cycles':>9} {'roofline':>9} {'share':>6} | {'run ms':>8} {'numpy ms':>9} "
          f"{'ratio':>6} | gather")
    for (name, c, f, k, pad), layout in ((layer, layout) for layer in LAYERS for layout in args.layouts):
        func, x_shape, w_shape, out_shape = conv(layout, c, f, k, pad)
        ex = accel.build(func)
        rng = np.random.default_rng(c * k)
        x = rng.integers(-128, 128, x_shape, dtype=np.int8)
        w = rng.integers(-128, 128, w_shape, dtype=np.int8)
        tx, tw = tvm.runtime.tensor(x), tvm.runtime.tensor(w)
        tout = tvm.runtime.tensor(np.zeros(out_shape, np.int32))
        session = accel.Session(record=False)

        def run():
            with session:
                ex(tx, tw, tout)

        run_s = median_time(run, args.repeats)
        np_s = median_time(lambda: numpy_conv(layout, x, w, pad), args.repeats)
        assert np.array_equal(tout.numpy(), numpy_conv(layout, x, w, pad))
        check = accel.Session(record=False)
        with check:
            ex(tx, tw, tout)
        st = check.stats
        gather = ex.report.offloaded[0].gather
        print(f"{name:>12} {layout:>6} | {st.cycles:9d} {st.roofline_cycles:9d} {st.roofline_cycles / st.cycles:6.1%} | "
              f"{run_s * 1e3:8.1f} {np_s * 1e3:9.1f} {run_s / np_s:6.2f} | {gather}")


if __name__ == "__main__":
    main()
