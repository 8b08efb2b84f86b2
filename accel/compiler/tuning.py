"""accel's tuning space: the scheduler's knobs (:class:`accel.compiler.schedule.Knobs`) as a
meta_schedule design space for ``tp.tune``.

For each GEMM block the space offers:

- ``bm``, ``bn``, ``bk``: tiles per block along M, N and K, the dimension's divisors (no
  padding to whole blocks), powers of two and the whole dimension, up to 32, 8 and 32 tiles
  (the scheduler shrinks a block that would overflow a scratchpad);
- ``weights``: streamed or resident;
- for a convolution, ``gather`` (direct LOADs or the CPU's im2col) and, where its output
  has more than one row and column (:func:`accel.compiler.conv.has_image`), ``pixels`` (M
  over one output row or the whole image);

and for each depthwise convolution, ``bm`` and ``bn``: its block of output tiles (pixels x
channels, divisors of the tiles up to 16 each; the heuristic's the pixels' block of the fewest
cycles by :func:`accel.compiler.schedule.dwmac_cycles`), each step of its
epilogue ALU chains over the block (the issue cost of an instruction is paid per block,
not per tile: 5-9% fewer cycles on the PaddleOCR classifier's depthwise layers; the
scheduler makes a block that does not fit ACC smaller); and ``pixels``, along each output
row (padded to whole tiles) or over the image (rows of a virtual width, blocks of whole
rows: :func:`accel.compiler.depthwise.flatten`), where the image has such a layout;

and for either, where its epilogue forks after steps its branches share (integerize's precise
requantise after a bias and clamp reads the accumulator twice), ``fork``: those steps once, in
place on the accumulator (the heuristic), or on each branch
(:data:`accel.compiler.schedule.FORKS`: once takes 14-32% fewer cycles on the PaddleOCR
classifier's convolutions with the cheapest blocks).

The heuristic's choice of every knob is the design space's decision, so the heuristic's
schedule is always a candidate. Where the heuristic's gather and pixels are likeliest, the
blocks are: those the plan's estimate (:func:`accel.compiler.schedule.block_cycles`: the
compute queue's cycles, issue overhead and padding to whole blocks included; a GEMM's with
the first LOAD and last STORE, :func:`accel.compiler.schedule.fill_and_drain`; a depthwise
convolution's :func:`accel.compiler.schedule.dwmac_cycles`) finds cheapest
(:func:`_cheapest`), and shared steps are likeliest run once. Otherwise the priors
(``tp.Knob(prior=)``) favour larger M blocks,
resident weights, and for a convolution whose output rows pad to whole tiles more than its
whole image does (and whose image is one block of M), the im2col gather with M over the
image: the heuristic streams weights that more than half fill WGT and takes the M block of
the fewest estimated cycles among those that keep one row of tiles' N and K blocks
(:func:`accel.compiler.schedule.least_cycles`; before, one row of tiles a block, the best
of a search of 64 trials on the PaddleOCR classifier's convolutions took larger M blocks on
12 of 16 tasks and resident weights on 12; the scheduler
shrinks a block that does not fit: a large choice is made smaller, not refused). The
post-processor is the scheduler itself (:func:`accel.compiler.schedule.schedule_in`),
reading the knobs back from the annotations, which is what the accel Backend's
``schedule`` does with a tuning record's annotations.

``tp.tune`` measures the heuristic first, then the candidates :func:`ranked` finds
cheapest by the estimate over the whole space (the accel Backend's ``tune_candidates``),
and gives a small budget to the tasks they save most on (:func:`work` is the heuristic's
estimate): on the PaddleOCR classifier's 30 largest tasks the cheapest was the best
measured on 29.

>>> space = tuning_space(te.create_prim_func([A, W, C]), accel.Config())   # doctest: +SKIP
"""

from __future__ import annotations

import itertools

from tvm import ir, s_tir, tirx

import tirpat as tp
from accel.compiler.conv import has_image
from accel.compiler.depthwise import Depthwise, flat_layouts
from accel.compiler.depthwise import pixels as pixel_dim
from accel.compiler.schedule import (
    ANNOTATION, BK_LIMIT, BM_LIMIT, BN_LIMIT, DW_BLOCK_LIMIT, FORKS, GATHERS, PIXELS, WEIGHTS, block_sizes,
    depthwise_blocks, gemm_blocks, schedule_in,
)
from accel.hw.config import Config

def _sizes(tiles: int, limit: int, heuristic: int) -> tuple:
    """Block sizes for a dimension of ``tiles`` tiles up to ``limit``: its divisors (no
    padding to whole blocks), the powers of two and the whole dimension
    (:func:`~accel.compiler.schedule.block_sizes`), and the heuristic's.

    >>> _sizes(30, 8, 6)
    (1, 2, 3, 4, 5, 6, 8)
    """
    return tuple(sorted(set(block_sizes(tiles, limit)) | {heuristic}))


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
            # blocks of output tiles (pixels x channels), the cheapest by the plan's estimate
            # likeliest (else the largest: the scheduler makes a block that does not fit ACC
            # smaller); the pixels along each row or over the image where it has a layout (its
            # blocks whole virtual rows), the heuristic's (the estimate's cheaper) likeliest
            flat = flat_layouts(conv, t, DW_BLOCK_LIMIT)
            along = set(depthwise_blocks(-(-conv.ext[pixel_dim(conv)] // t))) | {k.bm}
            for layout in flat:
                along |= set(depthwise_blocks(layout.tiles(t), DW_BLOCK_LIMIT, layout.tiles_per_block(t)))
            sizes = [tuple(sorted(along)), depthwise_blocks(-(-plan.n // t))]
            priors = _cheapest(plan, sizes + [(1,)], [_rising(len(s)) for s in sizes] + [None])
            out += [tp.Knob(name, ANNOTATION + key, values, default, prior=prior)
                    for key, values, default, prior in zip(("bm", "bn"), sizes, (k.bm, k.bn), priors)]
            if flat:
                out.append(tp.Knob(name, ANNOTATION + "pixels", tuple(range(len(PIXELS))), PIXELS.index(k.pixels)))
            out += _fork(name, plan)
            continue
        if conv is None:
            m, kk = plan.m, plan.k
        else:       # the largest M and K over the gathers and pixel groupings
            m = max(plan.m, conv.ext["y"] * conv.ext["x"])
            kk = conv.ext["ry"] * conv.ext["rx"] * conv.ext["c"]
        image = conv is not None and _image_pays(conv.ext["y"], conv.ext["x"], t)
        sizes = [_sizes(-(-m // t), BM_LIMIT, k.bm), _sizes(-(-plan.n // t), BN_LIMIT, k.bn),
                 _sizes(-(-kk // t), BK_LIMIT, k.bk)]
        priors = [_rising(len(sizes[0])), None, None]
        if not image or k.pixels == "image":
            # the likeliest gather and pixels are the heuristic's, whose blocks the plan estimates
            priors = _cheapest(plan, sizes, priors)
        out += [tp.Knob(name, ANNOTATION + key, values, default, prior=prior)
                for key, values, default, prior in zip(("bm", "bn", "bk"), sizes, (k.bm, k.bn, k.bk), priors)]
        out.append(tp.Knob(name, ANNOTATION + "weights", tuple(range(len(WEIGHTS))), WEIGHTS.index(k.weights),
                           prior=tuple(2.0 if w == "resident" else 1.0 for w in WEIGHTS)))
        out += _fork(name, plan)
        if conv is not None:
            out.append(tp.Knob(name, ANNOTATION + "gather", tuple(range(len(GATHERS))), GATHERS.index(k.gather),
                               prior=_favour(GATHERS, "im2col") if image else None))
        if conv is not None and has_image(conv):
            # (an output of one row or column has no image of its own: the scheduler runs it by
            # rows whatever the knob says, so the value would only repeat a candidate)
            out.append(tp.Knob(name, ANNOTATION + "pixels", tuple(range(len(PIXELS))), PIXELS.index(k.pixels),
                               prior=_favour(PIXELS, "image") if image else None))
    return out


def _fork(name: str, plan) -> list:
    """The ``fork`` knob of a block whose epilogue forks after steps its branches share
    (``plan.shared``), running them once likeliest (fewer ALU instructions, the same
    operations on the same values: 27% fewer cycles with larger blocks on the PaddleOCR
    classifier's largest 1x1 convolution, against 14% without; the heuristic's too); none otherwise."""
    if not plan.shared:
        return []
    return [tp.Knob(name, ANNOTATION + "fork", tuple(range(len(FORKS))), FORKS.index(plan.knobs.fork),
                    prior=_favour(FORKS, "once"))]


def _cheapest(plan, sizes: list, priors: list) -> list:
    """``priors`` (one per knob of ``sizes``: the block sizes along M, N and K) made to favour
    the blocks ``plan.estimate`` finds cheapest (the largest of equals): each value of those
    blocks weighs one more than the heaviest other, so the likeliest candidate takes them
    (on the PaddleOCR classifier the largest M block with blocks of 2 tiles of N padded 13
    tiles of channels to 14 and an ALU-bound epilogue with them: the cheapest took 14% fewer
    cycles, the largest blocks 9%). ``priors`` as they are when nothing is estimated.

    >>> class Plan: estimate = staticmethod(lambda bm, bn, bk: 100 * bn + bm)
    >>> _cheapest(Plan, [(1, 2), (1, 2), (1,)], [(1, 2), None, None])
    [(3.0, 2.0), (2.0, 1.0), (1.0,)]
    """
    if plan.estimate is None:
        return priors
    costs = {}
    for bm in sizes[0]:
        for bn in sizes[1]:
            for bk in sizes[2]:
                cost = plan.estimate(bm, bn, bk)
                if cost is not None:
                    costs[bm, bn, bk] = (cost, -bm * bn * bk)
    if not costs:
        return priors
    best = min(costs, key=costs.get)
    out = []
    for values, prior, chosen in zip(sizes, priors, best):
        weights = tuple(float(w) for w in (prior or (1.0,) * len(values)))
        top = max(w for v, w in zip(values, weights) if v != chosen) if len(values) > 1 else 0.0
        out.append(tuple(top + 1.0 if v == chosen else w for v, w in zip(values, weights)))
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


def ranked(sch: s_tir.Schedule, config: Config, limit: int = 16) -> list:
    """Up to ``limit`` candidates of ``sch``'s knob space, the cheapest by the plan's estimate
    first (:func:`accel.compiler.schedule.block_cycles`: the compute queue's cycles; a depthwise
    convolution's :func:`accel.compiler.schedule.dwmac_cycles`), each
    ``(estimated cycles, {(block, annotation): value})`` (every knob's value; the cycles of
    the whole function, as :func:`work` estimates the heuristic's): what ``tp.tune``
    measures after the heuristic, instead of random samples (on the PaddleOCR classifier's
    and det_small's tasks the estimate came within 2% of the simulated cycles, the fork
    knob's and the image's choices included).

    Per block, one schedule per combination of the choices the estimate tells apart other
    than the block sizes (the fork; the pixels, with the gather an image needs), then the
    plan's estimate over every block size; the weights' residency and a row's gather (the
    DMA's work, beside the compute queue) stay the heuristic's. Candidates the estimate
    cannot tell apart (the same cycles, fork and pixels: blocks the scheduler fitted to the
    same sizes) are one, the one nearest the heuristic kept; so is one the same as the
    heuristic's. With several blocks, each block's candidates come with the other blocks
    at their heuristic's choices, each block's cheapest at once first. ``sch`` is left as
    it is.

    >>> ranked(s_tir.Schedule(mod), accel.Config())[0]      # doctest: +SKIP
    (19006, {('conv2d_nchw', 'accel.bm'): 6, ('conv2d_nchw', 'accel.bn'): 1, ...})
    """
    all_knobs = knobs(sch, config)
    default = {(k.block, k.key): k.default for k in all_knobs}
    sizes = tuple(ANNOTATION + key for key in ("bm", "bn", "bk"))
    per_block: dict = {}
    for block in dict.fromkeys(k.block for k in all_knobs):
        own = [k for k in all_knobs if k.block == block]
        # the estimate is the compute queue's: it tells apart the epilogue's fork and the
        # pixels a block runs over (whose gather is the CPU's im2col), not the weights'
        # residency or the gather of a row (the DMA's work), left at the heuristic's
        choices = [k for k in own if k.key in (ANNOTATION + "fork", ANNOTATION + "pixels") and len(k.values) > 1]
        if any(k.key == ANNOTATION + "pixels" for k in choices):
            choices += [k for k in own if k.key == ANNOTATION + "gather"]
        blocks = {k.key: k for k in own if k.key in sizes}
        found: dict = {}
        # the heuristic's choices first, then those that differ from it in fewer knobs: of
        # candidates the estimate cannot tell apart, the nearest the heuristic is kept
        combos = sorted((vs for vs in itertools.product(*[k.values for k in choices]) if _consistent(choices, vs)),
                        key=lambda vs: sum(v != k.default for v, k in zip(vs, choices)))
        heuristic = None
        for values in combos:
            trial = sch.copy()
            for k, v in zip(choices, values):
                trial.annotate(trial.get_sblock(block), k.key, v)
            try:
                plan = next(p for p in schedule_in(trial, config).offloaded if p.block == block)
            except Exception:  # noqa: BLE001 - a combination the scheduler refuses: not a candidate
                continue
            if plan.estimate is None:
                continue
            if heuristic is None:
                heuristic = (plan.estimate(plan.knobs.bm, plan.knobs.bn, plan.knobs.bk), plan.knobs.fork,
                             plan.knobs.pixels)
                found[heuristic] = None         # the heuristic itself: measured first anyway
            picked = dict(zip(((block, k.key) for k in choices), values))
            for bm, bn, bk in itertools.product(*[blocks[ANNOTATION + key].values if ANNOTATION + key in blocks
                                                  else (getattr(plan.knobs, key),) for key in ("bm", "bn", "bk")]):
                cost = plan.estimate(bm, bn, bk)
                key = (cost, plan.knobs.fork, plan.knobs.pixels)
                if cost is None or key in found:
                    continue
                found[key] = {**picked, **{(block, ANNOTATION + n): v for n, v in zip(("bm", "bn", "bk"), (bm, bn, bk))
                                           if ANNOTATION + n in blocks}}
        if heuristic is not None:
            per_block[block] = (heuristic[0], sorted(((key[0], c) for key, c in found.items() if c is not None),
                                                     key=lambda r: r[0]))
    total = sum(_estimated(p) for p in schedule_in(sch.copy(), config).offloaded)
    out = []
    if len(per_block) > 1:      # each block's cheapest at once
        out.append((total + sum(cands[0][0] - base for base, cands in per_block.values() if cands),
                    {**default, **{k: v for _, cands in per_block.values() if cands for k, v in cands[0][1].items()}}))
    out += sorted(((total + cost - base, {**default, **c}) for base, cands in per_block.values() for cost, c in cands),
                  key=lambda r: r[0])
    return out[:limit]


def _consistent(choices: list, values: tuple) -> bool:
    """Whether ``values`` of the knobs ``choices`` pair the pixels with their gather: a row's
    by the heuristic's gather, an image's by im2col (which it needs)."""
    picked = {k.key[len(ANNOTATION):]: (v, k.default) for k, v in zip(choices, values)}
    if "pixels" not in picked or "gather" not in picked:      # a depthwise block's pixels need no gather
        return True
    (pixels, _), (gather, default) = picked["pixels"], picked["gather"]
    return gather == (GATHERS.index("im2col") if PIXELS[pixels] == "image" else default)


def tuning_space(func: tirx.PrimFunc, config: Config):
    """The design space of ``func`` (a ``tp.knob_space``), or None when it has no GEMM or
    depthwise block."""
    if not gemm_blocks(tp.Schedule(ir.IRModule({"main": func})), with_depthwise=True):
        return None
    return tp.knob_space(lambda sch: knobs(sch, config), lambda sch: schedule_in(sch, config))


def work(func: tirx.PrimFunc, config: Config) -> float | None:
    """An estimate of ``func``'s device cycles under the heuristic's schedule (the sum of its
    blocks' :func:`_estimated`), by which ``tp.tune`` shares a budget that searches every
    task and weighs what a candidate saves (a depthwise convolution takes 16 times the
    cycles a GEMM of its MACs takes: counting operations would rank it low); None when it
    has no offloaded block."""
    plans = schedule_in(tp.Schedule(ir.IRModule({"main": func})), config).offloaded
    return float(sum(_estimated(p) for p in plans)) if plans else None


def _estimated(plan) -> int:
    """The plan's cycles by its blocks' estimate (:func:`accel.compiler.schedule.block_cycles`
    or :func:`accel.compiler.schedule.dwmac_cycles`,
    within a few percent of the measured on the PaddleOCR classifier's tasks), else by its
    MACs and epilogue alone (``plan.cycles``)."""
    cost = plan.estimate(plan.knobs.bm, plan.knobs.bn, plan.knobs.bk) if plan.estimate is not None else None
    return plan.cycles if cost is None else cost
