"""The default demo: a small int8 MLP from topi, compiled for accel, run on the simulator.

``python -m accel`` (or the ``accel-demo`` console script) builds the MLP with
:func:`accel.build`, runs it in a :class:`accel.Session`, checks it bit for bit against a
numpy reference and prints the offload report, cycles, the roofline share and the timeline.

>>> main(["--layers", "1", "--batch", "16", "--hidden", "32"])   # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import numpy as np
from tvm import te, topi

import accel


def mlp(batch: int, hidden: Sequence[int], shift: int = 7):
    """An int8 MLP: per layer dense + bias + ReLU + requantise ``clip((x + 2^(s-1)) >> s)``.

    Returns ``(prim_func, reference)``; the func takes ``x, w0, b0, w1, b1, ..., out``.
    """
    x = te.placeholder((batch, hidden[0]), "int8", name="x")
    params, layer = [x], x
    for n, (k, m) in enumerate(zip(hidden[:-1], hidden[1:])):
        w = te.placeholder((m, k), "int8", name=f"w{n}")
        b = te.placeholder((m,), "int32", name=f"b{n}")
        acc = topi.nn.relu(topi.add(topi.nn.dense(layer, w, out_dtype="int32"), b))
        layer = _requantise(acc, shift, f"requant{n}")
        params += [w, b]

    def reference(x_v, *wb):
        h = x_v
        for w_v, b_v in zip(wb[0::2], wb[1::2]):
            acc = np.maximum(h.astype(np.int64) @ w_v.astype(np.int64).T + b_v, 0)
            h = np.clip((acc + (1 << (shift - 1))) >> shift, -128, 127).astype(np.int8)
        return h

    return te.create_prim_func(params + [layer]), reference


def _requantise(acc, shift, name):
    return te.compute(acc.shape, lambda i, j: te.max(te.min(
        (acc[i, j] + (1 << (shift - 1))) >> shift, 127), -128).astype("int8"), name=name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns 0 when the accelerator's result equals numpy's."""
    ap = argparse.ArgumentParser(prog="python -m accel", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64, help="rows of the input (default 64)")
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 512, 256, 128],
                    help="layer widths, input first (default 256 512 256 128)")
    ap.add_argument("--timeline", metavar="PNG", help="also write the timeline as a PNG (needs matplotlib)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    func, reference = mlp(args.batch, args.hidden)
    t0 = time.perf_counter()
    ex = accel.build(func)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(args.seed)
    x = rng.integers(-128, 128, (args.batch, args.hidden[0]), dtype=np.int8)
    wb = []
    for k, m in zip(args.hidden[:-1], args.hidden[1:]):
        wb += [rng.integers(-128, 128, (m, k), dtype=np.int8), rng.integers(-4096, 4096, (m,), dtype=np.int32)]
    out = np.zeros((args.batch, args.hidden[-1]), np.int8)
    with accel.Session() as session:
        t0 = time.perf_counter()
        ex(x, *wb, out)
        run_s = time.perf_counter() - t0
    stats = session.stats
    exact = np.array_equal(out, reference(x, *wb))

    layers = " -> ".join(map(str, args.hidden))
    print(f"int8 MLP, batch {args.batch}, widths {layers}: dense + bias + ReLU + requantise per layer")
    print(ex.report)
    print(f"compiled in {compile_s:.2f} s, ran in {run_s * 1e3:.1f} ms on the simulator")
    print(f"cycles {stats.cycles}, roofline {stats.roofline_cycles} "
          f"({100 * stats.roofline_cycles / max(stats.cycles, 1):.1f}% of the roofline), "
          f"{stats.macs} MACs, instructions {dict(stats.instructions)}")
    print("utilisation: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in stats.utilization.items()))
    print(stats.timeline.text())
    if args.timeline:
        print(f"timeline written to {stats.timeline.save_png(args.timeline)}")
    print("bit-exact vs numpy:", "yes" if exact else "NO")
    return 0 if exact else 1
