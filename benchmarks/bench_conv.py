"""accel.build on ResNet-style int8 conv2d layers: roofline share and run time vs numpy.

Layers (batch 1, 56x56, stride 1, topi ``conv2d_nhwc`` or ``conv2d_nchw``, int32 out):
- 3x3, 64 -> 64 channels, padding 1 (im2col gather by strided LOADs);
- 1x1, 256 -> 64 channels (a strided view of the input: the LOADs read it directly).

For each layer the same run measures, with medians over repeats:
- cycles of the cycle model vs ``roofline_cycles`` (``roofline_cycles / cycles``);
- wall time of the compiled module on the simulator (CPU steps included; the session
  replays the stream it built on the first call) vs numpy computing the same convolution
  as a sum over kernel taps of int32 matrix products (target: ratio <= 1), and vs the same
  sum in float64 BLAS, exact for int8 data of these sizes and so the practical limit
  (moonshot: <= 2).

BLAS runs single-threaded on both sides (set before numpy loads; override with
OPENBLAS_NUM_THREADS): a multi-threaded OpenBLAS slows down by an order of magnitude when
another process competes for the cores, which made every ratio depend on unrelated load.

    python benchmarks/bench_conv.py [--layouts NHWC NCHW] [--repeats 5]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import te, topi  # noqa: E402

import accel  # noqa: E402
from accel.compiler.schedule import schedule  # noqa: E402
from timing import median_times  # noqa: E402

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


def numpy_conv(layout: str, x: np.ndarray, w: np.ndarray, pad: int, dtype=np.int32) -> np.ndarray:
    """The reference: channels-last taps, one matrix product per kernel tap, in ``dtype``
    (int32: numpy's own loops; float64: BLAS), as int32."""
    if layout == "NCHW":
        x, w = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)
    xp = np.pad(x.astype(dtype), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    kh, kw, c, f = w.shape
    out = np.zeros((x.shape[0], SIZE, SIZE, f), dtype)
    wd = w.astype(dtype)
    for i in range(kh):
        for j in range(kw):
            out += (xp[:, i:i + SIZE, j:j + SIZE, :].reshape(-1, c) @ wd[i, j]).reshape(out.shape)
    out = out.transpose(0, 3, 1, 2) if layout == "NCHW" else out
    return out.astype(np.int32)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layouts", choices=["NHWC", "NCHW"], nargs="+", default=["NHWC", "NCHW"])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"conv2d, batch 1, {SIZE}x{SIZE}, medians of {args.repeats}, "
          f"BLAS threads {os.environ['OPENBLAS_NUM_THREADS']}")
    print(f"{'layer':>12} {'layout':>6} | {'cycles':>9} {'roofline':>9} {'share':>6} | {'run ms':>8} "
          f"{'numpy ms':>9} {'BLAS ms':>8} | {'/numpy':>6} {'/BLAS':>6} | gather")
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

        run()  # the first call builds the stream; the timed ones replay it
        run_s, np_s, blas_s = median_times(
            [run, lambda: numpy_conv(layout, x, w, pad), lambda: numpy_conv(layout, x, w, pad, np.float64)],
            args.repeats)
        want = numpy_conv(layout, x, w, pad)
        assert np.array_equal(tout.numpy(), want) and np.array_equal(numpy_conv(layout, x, w, pad, np.float64), want)
        check = accel.Session(record=False)
        with check:
            ex(tx, tw, tout)
        st = check.stats
        gather = schedule(func, accel.Config())[1].offloaded[0].gather     # the scheduler's choice, in words
        print(f"{name:>12} {layout:>6} | {st.cycles:9d} {st.roofline_cycles:9d} {st.roofline_cycles / st.cycles:6.1%} | "
              f"{run_s * 1e3:8.1f} {np_s * 1e3:9.1f} {blas_s * 1e3:8.1f} | {run_s / np_s:6.2f} {run_s / blas_s:6.2f} | "
              f"{gather}")


if __name__ == "__main__":
    main()
