"""The demos: int8 CNNs compiled for accel and run on its simulator.

``python -m accel`` (or the ``accel-demo`` console script) builds a small CNN from topi with
:func:`accel.build`, runs it in a :class:`accel.Session`, checks it bit for bit against a
numpy reference and prints the offload report, cycles, the roofline share and the timeline.

``python -m accel --model`` does the same for a whole model: a ResNet-style int8 CNN written
as a Relax module (:func:`resnet_model`, weights as constants) goes through ``tp.build`` for
the target ``"accel, llvm"``, is checked against the same module compiled by TVM for llvm
alone, and prints the model report, each layer's cycles and a timeline labelled by layer.

>>> main(["--batch", "1", "--size", "8", "--channels", "8", "16"])   # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
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


def resnet_model(size: int = 16, channels: int = 16, blocks: int = 2, classes: int = 10,
                 layout: str = "NHWC", shift: int = 10, seed: int = 0):
    """A ResNet-style int8 CNN as a Relax module with its weights as constants: a 3x3 stem
    conv, ``blocks`` residual blocks (two 3x3 convs, the block's input added to the second),
    each conv with a bias, ReLU and a requantise to int8, then the classifier: one dense layer
    applied to every pixel (a [pixels, channels] x [channels, classes] matmul, which accel
    runs in whole tiles; a flattened image is one row, padded to a tile's height) and the
    logits summed over the pixels on the host (global sum pooling: the sum of the pixels'
    logits is the logits of the pooled features), giving [1, classes] int32.

    >>> mod = resnet_model(8, 16, 1)            # doctest: +SKIP
    """
    from tvm import relax
    from tvm.script import relax as R

    nchw = layout == "NCHW"
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 3, size, size) if nchw else (1, size, size, 3), "int8"))

    def const(shape, dtype, lo, hi):
        return relax.const(rng.integers(lo, hi, shape).astype(dtype))

    def conv(h, c_in, residual=None):
        w = const((channels, c_in, 3, 3) if nchw else (3, 3, c_in, channels), "int8", -128, 128)
        b = const((1, channels, 1, 1) if nchw else (1, 1, 1, channels), "int32", -4000, 4000)
        acc = bb.emit(relax.op.add(relax.op.nn.conv2d(h, w, padding=1, data_layout=layout,
                                                      kernel_layout="OIHW" if nchw else "HWIO",
                                                      out_dtype="int32"), b))
        if residual is not None:
            acc = bb.emit(relax.op.add(acc, relax.op.astype(residual, "int32")))
        shifted = relax.op.right_shift(relax.op.add(acc, relax.const(1 << (shift - 1), "int32")),
                                       relax.const(shift, "int32"))
        return bb.emit(relax.op.astype(relax.op.clip(shifted, 0, 127), "int8"))   # ReLU in the clip

    with bb.function("main", [x]):
        with bb.dataflow():
            h = conv(x, 3)
            for _ in range(blocks):
                h = conv(conv(h, channels), channels, residual=h)
            if nchw:
                h = bb.emit(relax.op.permute_dims(h, [0, 2, 3, 1]))
            pixels = bb.emit(relax.op.reshape(h, (size * size, channels)))
            wd = const((channels, classes), "int8", -128, 128)
            per_pixel = bb.emit(relax.op.matmul(pixels, wd, out_dtype="int32"))
            out = bb.emit_output(relax.op.sum(per_pixel, axis=[0], keepdims=True))
        bb.emit_func_output(out)
    return bb.get()


def layer_timeline(layers, width: int = 64) -> str:
    """A ruler for :meth:`accel.Timeline.text`: which layer ran in each column, and a key."""
    total = max((l.end for l in layers), default=0) or 1
    marks = "123456789abcdefghijklmnopqrstuvwxyz"
    row = [" "] * width
    for n, l in enumerate(layers):
        for col in range(int(l.start * width / total), max(int(l.start * width / total) + 1, int(l.end * width / total))):
            row[min(col, width - 1)] = marks[n % len(marks)]
    lines = [f"layer |{''.join(row)}|"]
    lines += [f"  {marks[n % len(marks)]}  {l.cycles:8d} cycles  {l.what}" for n, l in enumerate(layers)]
    return "\n".join(lines)


def model_demo(args) -> int:
    """``python -m accel --model``: a Relax CNN through ``tp.build`` (see the module docstring)."""
    import tvm
    from tvm import relax

    import tirpat as tp

    mod = resnet_model(args.size, args.channels[-1], args.blocks, args.classes, args.layout)
    t0 = time.perf_counter()
    model = tp.build(mod, "accel, llvm")
    compile_s = time.perf_counter() - t0
    x = np.random.default_rng(args.seed).integers(-128, 128, [int(d) for d in mod["main"].params[0].ty.shape.values],
                                                   dtype=np.int8)
    t0 = time.perf_counter()
    out = model(x)
    run_s = time.perf_counter() - t0
    want = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    exact = np.array_equal(out, want)
    stats = model.stats["accel"]
    print(f"ResNet-style int8 CNN as a Relax module: {args.size}x{args.size} {args.layout}, a stem conv and "
          f"{args.blocks} residual blocks of {args.channels[-1]} channels, a per-pixel dense head to {args.classes} "
          "logits summed over the pixels")
    print(model.report)
    print(f"compiled by tp.build in {compile_s:.2f} s, ran in {run_s * 1e3:.1f} ms on the simulator")
    print(stats.summary())
    print(stats.timeline.text())
    print(layer_timeline(model.layers))
    if args.timeline:
        print(f"timeline written to {stats.timeline.save_png(args.timeline, title='accel timeline by layer')}")
    print("bit-exact vs tvm.compile(mod, 'llvm'):", "yes" if exact else "NO")
    return 0 if exact else 1


def _at_least(least: int):
    """An argparse type: an integer of at least ``least`` (a batch, a size, a count)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {least}, got {text!r}")
        return value

    return parse


def _timeline_problem(path: Path) -> str | None:
    """Why a timeline PNG cannot be written at ``path``, or None.

    >>> _timeline_problem(Path("/no/such/dir/t.png"))
    "no such directory '/no/such/dir'"
    """
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return f"no such directory '{parent}'"
    if path.is_dir():
        return "is a directory"
    if importlib.util.find_spec("matplotlib") is None:
        return "drawing a PNG needs matplotlib: pip install 'tirpat[plot]'"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns 0 when the accelerator's result equals numpy's."""
    ap = argparse.ArgumentParser(prog="python -m accel", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=_at_least(1), default=2, help="images per batch (default 2)")
    ap.add_argument("--size", type=_at_least(1), default=32, help="image height and width (default 32)")
    ap.add_argument("--channels", type=_at_least(1), nargs="+", default=[3, 16, 32, 64],
                    help="channels per layer, input first (default 3 16 32 64)")
    ap.add_argument("--classes", type=_at_least(1), default=10, help="outputs of the dense head (default 10)")
    ap.add_argument("--layout", choices=["NHWC", "NCHW"], default="NHWC", help="activation layout (default NHWC)")
    ap.add_argument("--timeline", metavar="PNG", help="also write the timeline as a PNG (needs matplotlib)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights (default 0)")
    ap.add_argument("--model", action="store_true",
                    help="the model demo: a ResNet-style Relax CNN through tp.build (uses --size, the last "
                         "of --channels, --blocks, --classes, --layout)")
    ap.add_argument("--blocks", type=_at_least(0), default=2, help="residual blocks of the --model CNN (default 2)")
    args = ap.parse_args(argv)
    if args.timeline:       # checked before the compile, not found by matplotlib after it
        problem = _timeline_problem(Path(args.timeline))
        if problem:
            print(f"{ap.prog}: error: --timeline {args.timeline}: {problem}", file=sys.stderr)
            return 1
    if args.model:
        return model_demo(args)

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
    print(ex.report.text(verbose=True))        # every GEMM it offloaded and every step left on the CPU
    print(f"compiled in {compile_s:.2f} s, ran in {run_s * 1e3:.1f} ms on the simulator")
    print(f"cycles {stats.cycles}, roofline {stats.roofline_cycles} "
          f"({100 * stats.roofline_cycles / max(stats.cycles, 1):.1f}% of the roofline), "
          f"{stats.macs} MACs, instructions {dict(stats.instructions)}")
    print("utilisation: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in stats.utilization.items()))
    print(f"the GEMM array is busy {stats.busy['gemm']} cycles, the ALU's epilogues {stats.busy['alu']}: the compute "
          f"queue runs them at once where their accumulators differ (the roofline counts MACs and DMA bytes only)")
    print(stats.timeline.text())
    if args.timeline:
        print(f"timeline written to {stats.timeline.save_png(args.timeline)}")
    print("bit-exact vs numpy:", "yes" if exact else "NO")
    return 0 if exact else 1
