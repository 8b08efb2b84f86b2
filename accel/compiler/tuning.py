"""accel's tuning space: the scheduler's knobs (:class:`accel.compiler.schedule.Knobs`) as a
meta_schedule design space for ``tp.tune``.

For each GEMM block the space offers:

- ``bm``, ``bn``, ``bk``: tiles per block along M, N and K, powers of two and the whole
  dimension, up to 32, 8 and 32 tiles (the scheduler shrinks a block that would overflow a
  scratchpad);
- ``weights``: streamed or resident;
- for a convolution, ``gather`` (direct LOADs or the CPU's im2col) and ``pixels`` (M over
  one output row or the whole image);

and for each depthwise convolution, ``bm`` and ``bn``: its block of output tiles (pixels x
channels, divisors of the tiles up to 16 each; the heuristic's is one tile), each step of its
epilogue one ALU instruction over the block (the issue cost of an instruction is paid per block,
not per tile: 5-9% fewer cycles on the PaddleOCR classifier's depthwise layers), the largest
likeliest (the scheduler makes a block that does not fit ACC smaller).

The heuristic's choice of every knob is the design space's decision, so the heuristic's
schedule is always a candidate. The priors (``tp.Knob(prior=)``) favour larger M blocks,
resident weights, and for a convolution whose output rows pad to whole tiles more than its
whole image does (and whose image is one block of M), the im2col gather with M over the
image: the heuristic takes one row of tiles per block and streams weights that
more than half fill WGT, and on the PaddleOCR classifier's convolutions the best of a search
(64 trials) took larger M blocks on 12 of 16 tasks and resident weights on 12 (the scheduler
shrinks a block that does not fit: a large choice is made smaller, not refused). The
post-processor is the scheduler itself (:func:`accel.compiler.schedule.schedule_in`),
reading the knobs back from the annotations, which is what the accel Backend's
``schedule`` does with a tuning record's annotations.

>>> space = tuning_space(te.create_prim_func([A, W, C]), accel.Config())   # doctest: +SKIP
"""

from __future__ import annotations

from tvm import ir, s_tir, tirx

import tirpat as tp
from accel.compiler.depthwise import Depthwise
from accel.compiler.schedule import (
    ANNOTATION, BK_LIMIT, BN_LIMIT, GATHERS, PIXELS, WEIGHTS, depthwise_blocks, gemm_blocks, schedule_in,
)
from accel.hw.config import Config

#: The most tiles per block along M the space offers.
BM_LIMIT = 32


def _sizes(tiles: int, limit: int, heuristic: int) -> tuple:
    """Block sizes for a dimension of ``tiles`` tiles: powers of two and the whole dimension
    up to ``limit``, and the heuristic's."""
    sizes = {1 << n for n in range(limit.bit_length()) if (1 << n) <= min(tiles, limit)}
    if tiles <= limit:
        sizes.add(tiles)
    sizes.add(heuristic)
    return tuple(sorted(sizes))


def _rising(count: int) -> tuple:
    """A prior that favours the later (larger) of ``count`` sizes: weights 1, 2, ..., count.

    >>> _rising(3)
    (1, 2, 3)
    """
    return tuple(range(1, count + 1))


def knobs(sch: s_tir.Schedule, config: Config) -> list:
    """The knobs (``tp.Knob``) of every GEMM block of ``sch``'s ``main``, each defaulting to
    the heuristic's choice (found by scheduling a copy of ``sch``)."""
    blocks = gemm_blocks(sch, with_depthwise=True)
    if not blocks:
        return []
    chosen = {plan.block: plan for plan in schedule_in(sch.copy(), config).offloaded}
    t = config.tile
    out = []
    for name, conv in blocks:
        plan = chosen.get(name)
        if plan is None:        # not offloaded (it does not fit): nothing to choose
            continue
        k = plan.knobs
        if isinstance(conv, Depthwise):
            # blocks of output tiles (pixels x channels), the largest likeliest (the scheduler
            # makes a block that does not fit ACC smaller)
            for key, size, default in (("bm", plan.m, k.bm), ("bn", plan.n, k.bn)):
                sizes = depthwise_blocks(-(-size // t))
                out.append(tp.Knob(name, ANNOTATION + key, sizes, default, prior=_rising(len(sizes))))
            continue
        if conv is None:
            m, kk = plan.m, plan.k
        else:       # the largest M and K over the gathers and pixel groupings
            m = max(plan.m, conv.ext["y"] * conv.ext["x"])
            kk = conv.ext["ry"] * conv.ext["rx"] * conv.ext["c"]
        bm = _sizes(-(-m // t), BM_LIMIT, k.bm)
        out += [tp.Knob(name, ANNOTATION + "bm", bm, k.bm, prior=_rising(len(bm))),
                tp.Knob(name, ANNOTATION + "bn", _sizes(-(-plan.n // t), BN_LIMIT, k.bn), k.bn),
                tp.Knob(name, ANNOTATION + "bk", _sizes(-(-kk // t), BK_LIMIT, k.bk), k.bk),
                tp.Knob(name, ANNOTATION + "weights", tuple(range(len(WEIGHTS))), WEIGHTS.index(k.weights),
                        prior=tuple(2.0 if w == "resident" else 1.0 for w in WEIGHTS))]
        if conv is not None:
            image = _image_pays(conv.ext["y"], conv.ext["x"], t)
            out += [tp.Knob(name, ANNOTATION + "gather", tuple(range(len(GATHERS))), GATHERS.index(k.gather),
                            prior=_favour(GATHERS, "im2col") if image else None),
                    tp.Knob(name, ANNOTATION + "pixels", tuple(range(len(PIXELS))), PIXELS.index(k.pixels),
                            prior=_favour(PIXELS, "image") if image else None)]
    return out


def _image_pays(height: int, width: int, t: int) -> bool:
    """Whether M over a whole image of ``height`` x ``width`` output pixels pads less than M
    over its rows, and the image is one block of M the space offers (``BM_LIMIT`` tiles at
    most): then the likeliest candidate gathers by im2col and runs M over the image (on
    ppocrv6_det_small's 20 x 20 outputs, rows of 20 pixels padded to 32, it took 16-34% fewer
    cycles than the other knobs' likeliest values alone).

    >>> _image_pays(20, 20, 16), _image_pays(40, 40, 16), _image_pays(8, 32, 16)
    (True, False, False)
    """
    image = -(-height * width // t)
    return image <= BM_LIMIT and image * t < height * -(-width // t) * t


def _favour(choices: tuple, choice: str) -> tuple:
    """A prior that makes ``choice`` of ``choices`` the likeliest (twice as likely as each other).

    >>> _favour(("direct", "im2col"), "im2col")
    (1.0, 2.0)
    """
    return tuple(2.0 if c == choice else 1.0 for c in choices)


def tuning_space(func: tirx.PrimFunc, config: Config):
    """The design space of ``func`` (a ``tp.knob_space``), or None when it has no GEMM or
    depthwise block."""
    if not gemm_blocks(s_tir.Schedule(ir.IRModule({"main": func})), with_depthwise=True):
        return None
    return tp.knob_space(lambda sch: knobs(sch, config), lambda sch: schedule_in(sch, config))


def work(func: tirx.PrimFunc, config: Config) -> float | None:
    """An estimate of ``func``'s device cycles under the heuristic's schedule (the sum of its
    blocks' :func:`accel.compiler.schedule.estimate_cycles`), by which ``tp.tune`` ranks the
    tasks for its budget (a depthwise convolution takes 16 times the cycles a GEMM of its
    MACs takes: counting operations would rank it low); None when it has no offloaded block."""
    plans = schedule_in(s_tir.Schedule(ir.IRModule({"main": func})), config).offloaded
    return float(sum(p.cycles for p in plans)) if plans else None
