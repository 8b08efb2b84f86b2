"""The default demo: a small int8 CNN from topi, compiled for accel, run on the simulator.

``python -m accel`` (or the ``accel-demo`` console script) builds the CNN with
:func:`accel.build`, runs it in a :class:`accel.Session`, checks it bit for bit against a
numpy reference and prints the offload report, cycles, the roofline share and the timeline.

>>> main(["--batch", "1", "--size", "8", "--channels", "8", "16"])   # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import numpy as np
from tvm import te, topi

import accel


def _requantise(acc, shift, name):
    """``clip((acc + 2^(s-1)) >> s, -128, 127)`` as int8: rounding back to the int8 range."""
    return te.compute(acc.shape, lambda *i: te.max(te.min(
        (acc(*i) + (1 << (shift - 1))) >> shift, 127), -128).astype("int8"), name=name)


def _bias_add(conv, b, fdim: int, name: str):
    """``conv + b`` with the bias indexed by the channel dimension ``fdim``."""
    return te.compute(conv.shape, lambda *i: conv(*i) + b[i[fdim]], name=name)


def conv_np(x, w, stride: int, pad: int):
    """int64 conv2d of channels-last ``x`` [N, H, W, C] with ``w`` [F, C, KH, KW] (as numpy
    computes it, for the reference)."""
    w = w.transpose(2, 3, 1, 0)     # -> [KH, KW, C, F]
    kh, kw = w.shape[:2]
    xp = np.pad(x.astype(np.int64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh = (xp.shape[1] - kh) // stride + 1
    ow = (xp.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]), np.int64)
    for i in range(kh):
        for j in range(kw):
            out += xp[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride] @ w[i, j].astype(np.int64)
    return out


def cnn(batch: int, size: int, channels: Sequence[int], classes: int = 10, layout: str = "NHWC", shift: int = 8):
    """An int8 CNN: per channel step a 3x3 conv2d (stride 1 for the first layer, then 2,
    padding 1) + bias + ReLU + requantise, then a flatten and a dense head with bias giving
    int32 logits. ``channels`` starts with the input channels.

    Returns ``(prim_func, make_inputs, reference)``; the func takes
    ``x, w0, b0, w1, b1, ..., wd, bd, logits``; weights are [F, C, 3, 3] (OIHW) for NCHW and
    [3, 3, C, F] (HWIO) for NHWC.

    >>> func, inputs, reference = cnn(1, 8, [3, 16])      # doctest: +SKIP
    """
    nchw = layout == "NCHW"
    shape = (batch, channels[0], size, size) if nchw else (batch, size, size, channels[0])
    x = te.placeholder(shape, "int8", name="x")
    params, act, strides = [x], x, []
    for n, (c, f) in enumerate(zip(channels[:-1], channels[1:])):
        stride = 1 if n == 0 else 2
        strides.append(stride)
        w = te.placeholder((f, c, 3, 3) if nchw else (3, 3, c, f), "int8", name=f"w{n}")
        b = te.placeholder((f,), "int32", name=f"b{n}")
        conv = (topi.nn.conv2d_nchw if nchw else topi.nn.conv2d_nhwc)(act, w, stride, 1, 1, out_dtype="int32")
        acc = topi.nn.relu(_bias_add(conv, b, 1 if nchw else 3, f"bias{n}"))
        act = _requantise(acc, shift, f"requant{n}")
        params += [w, b]
    flat_len = int(np.prod([int(d) for d in act.shape[1:]]))
    flat = topi.reshape(act, (batch, flat_len))
    wd = te.placeholder((classes, flat_len), "int8", name="wd")
    bd = te.placeholder((classes,), "int32", name="bd")
    logits = topi.add(topi.nn.dense(flat, wd, out_dtype="int32"), bd)
    params += [wd, bd]

    def inputs(rng):
        args = [rng.integers(-128, 128, [int(d) for d in p.shape], dtype=np.int8) if p.dtype == "int8"
                else rng.integers(-2000, 2000, [int(d) for d in p.shape], dtype=np.int32) for p in params]
        return args, np.zeros((batch, classes), np.int32)

    def reference(x_v, *wb):
        h = x_v.transpose(0, 2, 3, 1) if nchw else x_v
        layers = wb[:-2]
        for w_v, b_v, stride in zip(layers[0::2], layers[1::2], strides):
            w_oihw = w_v if nchw else w_v.transpose(3, 2, 0, 1)
            acc = np.maximum(conv_np(h, w_oihw, stride, 1) + b_v, 0)
            h = np.clip((acc + (1 << (shift - 1))) >> shift, -128, 127).astype(np.int8)
        flat_v = (h.transpose(0, 3, 1, 2) if nchw else h).reshape(batch, -1).astype(np.int64)
        out = flat_v @ wb[-2].astype(np.int64).T + wb[-1]
        return ((out + 2**31) % 2**32 - 2**31).astype(np.int32)

    return te.create_prim_func(params + [logits]), inputs, reference


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns 0 when the accelerator's result equals numpy's."""
    ap = argparse.ArgumentParser(prog="python -m accel", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=2, help="images per batch (default 2)")
    ap.add_argument("--size", type=int, default=32, help="image height and width (default 32)")
    ap.add_argument("--channels", type=int, nargs="+", default=[3, 16, 32, 64],
                    help="channels per layer, input first (default 3 16 32 64)")
    ap.add_argument("--classes", type=int, default=10, help="outputs of the dense head (default 10)")
    ap.add_argument("--layout", choices=["NHWC", "NCHW"], default="NHWC", help="activation layout (default NHWC)")
    ap.add_argument("--timeline", metavar="PNG", help="also write the timeline as a PNG (needs matplotlib)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    func, inputs, reference = cnn(args.batch, args.size, args.channels, args.classes, args.layout)
    t0 = time.perf_counter()
    ex = accel.build(func)
    compile_s = time.perf_counter() - t0
    params, out = inputs(np.random.default_rng(args.seed))
    with accel.Session() as session:
        t0 = time.perf_counter()
        ex(*params, out)
        run_s = time.perf_counter() - t0
    stats = session.stats
    exact = np.array_equal(out, reference(*params))

    convs = " -> ".join(map(str, args.channels))
    print(f"int8 CNN, batch {args.batch}, {args.size}x{args.size} {args.layout}, channels {convs}: "
          f"3x3 conv2d + bias + ReLU + requantise per layer, dense head to {args.classes} logits")
    print(ex.report)
    print(f"compiled in {compile_s:.2f} s, ran in {run_s * 1e3:.1f} ms on the simulator")
    print(f"cycles {stats.cycles}, roofline {stats.roofline_cycles} "
          f"({100 * stats.roofline_cycles / max(stats.cycles, 1):.1f}% of the roofline), "
          f"{stats.macs} MACs, instructions {dict(stats.instructions)}")
    print("utilisation: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in stats.utilization.items()))
    print(f"GEMM and the ALU epilogues share the compute queue: {stats.busy['gemm'] + stats.busy['alu']} of "
          f"{stats.cycles} cycles (the roofline counts MACs and DMA bytes only)")
    print(stats.timeline.text())
    if args.timeline:
        print(f"timeline written to {stats.timeline.save_png(args.timeline)}")
    print("bit-exact vs numpy:", "yes" if exact else "NO")
    return 0 if exact else 1
