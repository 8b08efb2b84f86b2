"""The scheduler's knobs (block sizes, weight residency, gather, pixels per block): every
choice compiles to a program bit-exact with the same workload compiled by TVM for llvm,
and leaving every knob unset is exactly the heuristic."""

import functools
import math

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tvm import ir, s_tir, te, topi
from tvm.s_tir.schedule import _type_checker

import accel
import accel.compiler.conv
import accel.hw.isa
from accel.compiler.schedule import (BM_LIMIT, GATHERS, PIXELS, WEIGHTS, Knobs, ScheduleError, block_sizes,
                                     gemm_blocks, schedule, schedule_partition)


def conv(layout, n, size, c, f, k, stride, epilogue):
    """topi's conv2d (padding k // 2) with no epilogue or bias + ReLU + requantise."""
    if layout == "NHWC":
        x = te.placeholder((n, size, size, c), "int8", name="x")
        w = te.placeholder((k, k, c, f), "int8", name="w")
        out = topi.nn.conv2d_nhwc(x, w, stride, k // 2, 1, out_dtype="int32")
    else:
        x = te.placeholder((n, c, size, size), "int8", name="x")
        w = te.placeholder((f, c, k, k), "int8", name="w")
        out = topi.nn.conv2d_nchw(x, w, stride, k // 2, 1, out_dtype="int32")
    params = [x, w]
    if epilogue:
        b = te.placeholder((f,), "int32", name="b")
        fdim = 3 if layout == "NHWC" else 1
        acc = topi.nn.relu(te.compute(out.shape, lambda *i: out(*i) + b[i[fdim]], name="bias"))
        out = te.compute(acc.shape, lambda *i: te.max(te.min((acc(*i) + 32) >> 6, 127), -128).astype("int8"),
                         name="requant")
        params.append(b)
    return te.create_prim_func(params + [out])


def dense(m, n, k):
    a = te.placeholder((m, k), "int8", name="a")
    w = te.placeholder((n, k), "int8", name="w")
    b = te.placeholder((n,), "int32", name="b")
    return te.create_prim_func([a, w, b, topi.add(topi.nn.dense(a, w, out_dtype="int32"), b)])


def with_knobs(func, knobs):
    sch = s_tir.Schedule(ir.IRModule({"main": func}))
    for name, _ in gemm_blocks(sch):
        knobs.annotate(sch, sch.get_sblock(name))
    return sch.mod["main"]


def inputs(func, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(-128, 128, [int(d) for d in p.shape]).astype(str(p.dtype))
            for p in func.params if tvm.tirx.is_buffer_var(p)]


def llvm_result(func, args):
    tensors = [tvm.runtime.tensor(a) for a in args]
    tvm.compile(ir.IRModule({"main": func}), "llvm")["main"](*tensors)
    return tensors[-1].numpy()


def accel_run(func, args, stats=False):
    """The output and cycles (``stats``: the session's statistics) of ``func`` built by
    accel.build, and the scheduler's notes (the knobs it chose for each GEMM)."""
    ex = accel.build(func)
    args = [a.copy() for a in args]
    with accel.Session() as s:
        ex(*args)
    return args[-1], s.stats if stats else s.stats.cycles, schedule(func, accel.Config())[1]


def exact_runs(func, args, variants, stats=False):
    """:func:`accel_run` of each of ``variants`` (``func`` under several schedules), each
    output asserted equal to llvm's of ``func``."""
    want = llvm_result(func, args)
    runs = [accel_run(variant, args, stats) for variant in variants]
    for got, _, _ in runs:
        np.testing.assert_array_equal(got, want)
    return runs


KNOBS = st.builds(Knobs, bm=st.sampled_from([None, 1, 2, 4, 8]), bn=st.sampled_from([None, 1, 2, 3, 8]),
                  bk=st.sampled_from([None, 1, 2, 5, 32]), weights=st.sampled_from((None,) + WEIGHTS),
                  gather=st.sampled_from((None,) + GATHERS), pixels=st.sampled_from((None,) + PIXELS))


@settings(max_examples=12)
@given(st.sampled_from(["NHWC", "NCHW"]), st.sampled_from([(6, 3, 1), (8, 3, 2), (7, 1, 1), (12, 3, 1)]),
       st.sampled_from([(3, 16), (16, 24), (40, 8)]), st.booleans(), KNOBS)
def test_every_conv_knob_is_bit_exact(layout, shape, channels, epilogue, knobs):
    size, k, stride = shape
    func = conv(layout, 2, size, *channels, k, stride, epilogue)
    args = inputs(func)
    try:
        got, _, report = accel_run(with_knobs(func, knobs), args)
    except ScheduleError as err:
        # the one refusal: pixels of whole image rows that do not fit one block
        assert knobs.pixels == "image" and "pixels='row'" in str(err)
        return
    np.testing.assert_array_equal(got, llvm_result(func, args))
    used = report.offloaded[0].knobs
    for name in ("bm", "bn", "bk"):
        if getattr(knobs, name) is not None:
            assert getattr(used, name) <= getattr(knobs, name) or name == "bm" and used.pixels == "image"
    if knobs.gather is not None:
        assert used.gather == knobs.gather
    if knobs.pixels == "image" and used.gather == "im2col":
        assert used.pixels == "image"


@settings(max_examples=8)
@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 300), KNOBS)
def test_every_dense_knob_is_bit_exact(m, n, k, knobs):
    func = dense(m, n, k)
    args = inputs(func)
    got, _, report = accel_run(with_knobs(func, knobs), args)
    np.testing.assert_array_equal(got, llvm_result(func, args))
    assert report.offloaded[0].knobs.gather is None


@pytest.mark.parametrize("func", [conv("NHWC", 2, 16, 16, 32, 3, 2, True), dense(2, 10, 300)], ids=["conv", "dense"])
def test_unset_knobs_are_the_heuristic_and_its_choices_replay_it(func):
    args = inputs(func)
    _, cycles, report = accel_run(func, args)
    _, cycles_unset, _ = accel_run(with_knobs(func, Knobs()), args)
    _, cycles_replayed, _ = accel_run(with_knobs(func, report.offloaded[0].knobs), args)
    assert cycles == cycles_unset == cycles_replayed


def test_image_pixels_per_block_remove_the_padding_of_narrow_outputs():
    # an 8x8 output: a row of 8 pixels pads to a 16-row tile, an image of 64 does not
    func = conv("NHWC", 2, 16, 32, 64, 3, 2, True)
    args = inputs(func)
    (_, row_cycles, _), (_, image_cycles, report) = exact_runs(func, args, [
        with_knobs(func, Knobs(gather="im2col", pixels="row")),
        with_knobs(func, Knobs(gather="im2col", pixels="image"))])
    assert report.offloaded[0].knobs.pixels == "image"
    assert image_cycles < 0.75 * row_cycles


def nchw_conv(n, size, c, f, k, stride, epilogue):
    """topi's NCHW conv2d (padding k // 2) with no epilogue, bias + ReLU + requantise, or a
    residual (an operand in the result's own layout) + requantise."""
    x = te.placeholder((n, c, size, size), "int8", name="x")
    w = te.placeholder((f, c, k, k), "int8", name="w")
    out = topi.nn.conv2d_nchw(x, w, stride, k // 2, 1, out_dtype="int32")
    params = [x, w]
    if epilogue == "bias":
        b = te.placeholder((f,), "int32", name="b")
        out = topi.nn.relu(te.compute(out.shape, lambda *i: out(*i) + b[i[1]], name="bias"))
        params.append(b)
    elif epilogue == "residual":
        r = te.placeholder(out.shape, "int32", name="r")
        out = te.compute(out.shape, lambda *i: out(*i) + r(*i), name="residual")
        params.append(r)
    if epilogue is not None:
        acc = out
        out = te.compute(acc.shape, lambda *i: te.max(te.min((acc(*i) + 32) >> 6, 127), -128).astype("int8"),
                         name="requant")
    return te.create_prim_func(params + [out])


@settings(max_examples=8)
@given(st.integers(1, 2), st.sampled_from([5, 10, 20, 24]), st.sampled_from([(8, 24), (24, 40), (96, 16), (3, 8)]),
       st.sampled_from([(1, 1), (3, 1), (3, 2), (1, 2)]), st.sampled_from([None, "bias", "residual"]))
def test_the_heuristic_runs_m_over_the_image_where_rows_pad_more(n, size, channels, kernel, epilogue):
    # NCHW, as a model's layers are: the result goes through the CPU's transpose to NCHW, so
    # its channels-last intermediate is laid out by pixels and a block of them is one STORE
    c, f = channels
    k, stride = kernel
    func = nchw_conv(n, size, c, f, k, stride, epilogue)
    args = inputs(func)
    want = llvm_result(func, args)
    got, stats, report = accel_run(func, args, stats=True)
    np.testing.assert_array_equal(got, want)
    plan = report.offloaded[0]
    out = -(-size // stride)
    conv_ = accel.compiler.conv.Conv("c", None, None, {}, {"y": out, "x": out}, {}, {}, {}, {})
    direct = k == 1 or (-(-c // 16) * 16 - c) * 8 <= c
    image = accel.compiler.conv.image_pays(conv_, accel.Config()) and epilogue != "residual" and \
        (k == 1 or not direct)
    assert plan.knobs.pixels == ("image" if image else "row")
    if image:
        # the pixels of an image pad to whole tiles once, not once per output row
        assert plan.device_macs == n * -(-out * out // 16) * 16 * -(-f // 16) * 16 * (
            -(-c * k * k // 16) * 16 if k > 1 else -(-c // 16) * 16)
        rows, row_stats, row_report = accel_run(with_knobs(func, Knobs(pixels="row")), args, stats=True)
        np.testing.assert_array_equal(rows, want)
        assert plan.device_macs < row_report.offloaded[0].device_macs
        assert stats.busy["gemm"] < row_stats.busy["gemm"] and stats.cycles < row_stats.cycles


@pytest.mark.parametrize("size, c, f", [(1, 88, 22), (1, 8, 32), (2, 16, 16)], ids=["se-squeeze", "se-excite", "1x2"])
def test_an_output_of_one_row_or_column_runs_by_rows_whatever_the_pixels_knob_says(size, c, f):
    # the squeeze-excite 1x1 convolutions after a global pool (the PaddleOCR classifier's):
    # M over their "image" of one pixel computed wrong results, and the tuner measured it as
    # the cheapest candidate; now the knob space has no pixels knob there and the scheduler
    # runs such an output by rows
    from accel.compiler.tuning import knobs, ranked

    func = nchw_conv(1, size, c, f, 1, 2 if size == 2 else 1, "bias")    # 1x1 outputs
    args = inputs(func)
    want = llvm_result(func, args)
    got, _, report = accel_run(with_knobs(func, Knobs(gather="im2col", pixels="image")), args)
    np.testing.assert_array_equal(got, want)
    assert report.offloaded[0].knobs.pixels == "row"
    sch = s_tir.Schedule(ir.IRModule({"main": func}))
    assert not [k for k in knobs(sch, accel.Config()) if k.key == "accel.pixels"]
    assert all(key[1] != "accel.pixels" for _, choice in ranked(sch, accel.Config()) for key in choice)


def test_image_pixels_of_a_model_layer_store_a_block_at_once():
    # a 1x1 conv of a 20x20 NCHW image (ppocrv6_det_small's deepest stages): rows of 20 pixels
    # pad to 32, the image's 400 are 25 tiles; its blocks store as one run each
    func = nchw_conv(1, 20, 96, 192, 1, 1, "bias")
    args = inputs(func)
    (_, image_stats, report), (_, row_stats, _) = exact_runs(func, args, [func, with_knobs(func, Knobs(pixels="row"))],
                                                             stats=True)
    assert report.offloaded[0].knobs.pixels == "image" and report.offloaded[0].device_macs == 400 * 192 * 96
    assert image_stats.instructions["STORE"] < row_stats.instructions["STORE"]
    assert image_stats.cycles < 0.7 * row_stats.cycles


@settings(max_examples=8)
@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 100), st.sampled_from([None, 1, 2, 3]),
       st.sampled_from([None, 1, 2, 3, 8]))
def test_one_reset_zeroes_a_block_of_accumulator_tiles(m, n, k, bm, bn):
    func = dense(m, n, k)
    args = inputs(func)
    ex = accel.build(with_knobs(func, Knobs(bm=bm, bn=bn)))
    got = [a.copy() for a in args]
    with accel.Session() as s:
        ex(*got)
    np.testing.assert_array_equal(got[-1], llvm_result(func, args))
    used = schedule(with_knobs(func, Knobs(bm=bm, bn=bn)), accel.Config())[1].offloaded[0].knobs
    resets = [i for i in accel.hw.isa.decode(s.stream()) if isinstance(i, accel.hw.isa.Gemm) and i.reset]
    # one per block of bm x bn output tiles, each zeroing all of them
    assert len(resets) == -(-m // (16 * used.bm)) * -(-n // (16 * used.bn))
    assert all(r.ext_out * r.ext_in == used.bm * used.bn for r in resets)


def test_blocks_of_n_and_k_are_the_whole_dimension_when_it_is_small():
    # 48 input channels are 3 tiles of K, 96 output channels 6 of N: whole blocks (one GEMM
    # instruction per row of tiles), where powers of two would be 1 and 2 (three per K tile)
    func = nchw_conv(1, 16, 48, 96, 1, 1, "bias")
    args = inputs(func)
    (_, stats, report), (_, pow2_stats, _) = exact_runs(func, args, [func, with_knobs(func, Knobs(bn=2, bk=1))],
                                                        stats=True)
    used = report.offloaded[0].knobs
    assert (used.bn, used.bk) == (6, 3)
    assert stats.instructions["GEMM"] < pow2_stats.instructions["GEMM"] and stats.cycles < pow2_stats.cycles



@pytest.mark.parametrize("kind, m, n, k", [("dense", 20, 480, 16), ("conv", 2, 144, 48), ("conv", 2, 32, 576)],
                         ids=["dense-n30", "conv-n9", "conv-k36"])
def test_blocks_of_n_and_k_divide_them_where_a_power_of_two_would_pad(kind, m, n, k):
    # 480 channels are 30 tiles (blocks of 8 padded them to 32), 144 are 9 (blocks of 2: 10),
    # 576 are 36 (blocks of 8: 40): blocks of 6, 3 and 18 tiles pad nothing; M, N and K are
    # padded to whole tiles alone, and the result is bit-exact, with and without an epilogue
    func = dense(m, n, k) if kind == "dense" else nchw_conv(1, m, k, n, 1, 1, "bias")
    plan = schedule(func, accel.Config())[1].offloaded[0]
    assert plan.device_macs == plan.batch * math.prod(-(-d // 16) * 16 for d in (plan.m, plan.n, plan.k))
    assert (-(-plan.n // 16)) % plan.knobs.bn == 0 and (-(-plan.k // 16)) % plan.knobs.bk == 0
    args = inputs(func)
    got, _, _ = accel_run(func, args)
    np.testing.assert_array_equal(got, llvm_result(func, args))


@settings(max_examples=4)
@given(st.sampled_from(["NHWC", "NCHW"]), st.sampled_from([(6, 3, 1), (12, 3, 1), (16, 1, 2), (40, 1, 1), (24, 3, 2)]),
       st.sampled_from([(3, 8), (16, 24), (48, 96), (8, 200)]), st.booleans(), st.integers(1, 2))
def test_the_heuristic_takes_the_largest_m_block_of_the_fewest_estimated_cycles(layout, shape, channels, epilogue, n):
    # not one row of tiles a block: of the M blocks that keep one row's blocks of N and K (and
    # the weight's residency), the cheapest by the estimate, the largest of equals (its
    # reset, bias LOAD, epilogue chains and STORE one instruction each, not one per tile)
    size, k, stride = shape
    func = conv(layout, n, size, *channels, k, stride, epilogue)
    plan = schedule(func, accel.Config())[1].offloaded[0]
    h = plan.knobs
    row = schedule(with_knobs(func, Knobs(bm=1)), accel.Config())[1].offloaded[0].knobs
    m_tiles = -(-plan.m // 16)
    costs = {}
    for bm in block_sizes(m_tiles, BM_LIMIT):
        used = schedule(with_knobs(func, Knobs(bm=bm)), accel.Config())[1].offloaded[0].knobs
        if (used.bn, used.bk, used.weights, used.pixels) == (row.bn, row.bk, row.weights, row.pixels):
            costs[used.bm] = plan.estimate(used.bm, used.bn, used.bk)
    assert (h.bn, h.bk, h.weights) == (row.bn, row.bk, row.weights)
    assert h.bm == max(bm for bm, cost in costs.items() if cost == min(costs.values()))
    args = inputs(func)
    got, _, _ = accel_run(func, args)
    np.testing.assert_array_equal(got, llvm_result(func, args))


def requantised_conv(shape, f, k, stride, padding):
    """topi's NCHW conv2d of an int8 input of ``shape`` to ``f`` channels, a bias, ReLU and
    requantise."""
    x = te.placeholder(shape, "int8", name="x")
    w = te.placeholder((f, shape[1], k, k), "int8", name="w")
    b = te.placeholder((f,), "int32", name="b")
    out = topi.nn.conv2d_nchw(x, w, stride, padding, 1, out_dtype="int32")
    acc = topi.nn.relu(te.compute(out.shape, lambda *i: out(*i) + b[i[1]], name="bias"))
    out = te.compute(acc.shape, lambda *i: te.max(te.min((acc(*i) + 32) >> 6, 127), -128).astype("int8"),
                     name="requant")
    return te.create_prim_func([x, w, b, out])


def stem():
    """The PaddleOCR classifier's first convolution: 3 channels of 48 x 192 pixels, a 3 x 3
    kernel of stride 2 to 8 channels (rows of 96 pixels, 6 tiles), bias, ReLU and requantise."""
    return requantised_conv((1, 3, 48, 192), 8, 3, 2, 1)


@pytest.mark.parametrize("func, blocks, ratio", [(stem(), (6, 1, 2), 0.9),
                                                 (nchw_conv(1, 40, 48, 96, 1, 1, "bias"), (4, 6, 3), 1.01)],
                         ids=["stem-row", "1x1-40x40"])
def test_a_block_of_several_tiles_of_m_runs_fewer_instructions_in_as_many_cycles_or_fewer(func, blocks, ratio):
    # the stem: a whole row of 6 tiles a block, 11% fewer cycles than a tile a block (7,227
    # against 8,097: the issue overhead and the epilogue's passes paid per block); the 1x1
    # convolution of a 40 x 40 image (ppocrv5_det's): 4 tiles, its 6 tiles of N and 3 of K kept
    # (20 tiles with 1 of each were estimated 2% cheaper and simulated 10% dearer, INP reloaded
    # per tile of N), as many cycles within the estimate's resolution (0.2% more: 39,395
    # against 39,335), a third of the instructions
    args = inputs(func)
    (_, stats, report), (_, one_stats, _) = exact_runs(func, args, [func, with_knobs(func, Knobs(bm=1))],
                                                       stats=True)
    used, plan = report.offloaded[0].knobs, report.offloaded[0]
    assert (used.bm, used.bn, used.bk) == blocks
    assert stats.cycles <= ratio * one_stats.cycles
    assert sum(stats.instructions.values()) < 0.5 * sum(one_stats.instructions.values())
    for name in ("STORE", "ALU_CHAIN"):
        assert stats.instructions[name] * used.bm <= one_stats.instructions[name]
    # the estimate the choice rests on holds in the new region
    assert abs(plan.estimate(used.bm, used.bn, used.bk) - stats.cycles) <= 0.05 * stats.cycles


def test_knob_annotations_are_checked():
    with pytest.raises(ValueError, match="Knobs.bm must be a positive int"):
        Knobs(bm=0)
    with pytest.raises(ValueError, match="Knobs.gather must be one of"):
        Knobs(gather="strided")
    with pytest.raises(ScheduleError, match="accel.weights = 7 is not an index"):
        Knobs.from_annotations({"accel.weights": 7})


# --------------------------------------------------------------------------- depthwise blocks
def depthwise(size, c, k, stride, epilogue):
    """topi's depthwise conv2d (NCHW, padding k // 2, ``groups`` = channels) with no
    epilogue or bias + ReLU + requantise."""
    x = te.placeholder((1, c, size, size), "int8", name="x")
    w = te.placeholder((c, 1, k, k), "int8", name="w")
    out = topi.nn.group_conv2d_nchw(x, w, stride, k // 2, 1, c, out_dtype="int32")
    params = [x, w]
    if epilogue:
        b = te.placeholder((c,), "int32", name="b")
        acc = topi.nn.relu(te.compute(out.shape, lambda *i: out(*i) + b[i[1]], name="bias"))
        out = te.compute(acc.shape, lambda *i: te.max(te.min((acc(*i) + 32) >> 6, 127), -128).astype("int8"),
                         name="requant")
        params.append(b)
    return te.create_prim_func(params + [out])


def with_depthwise_knobs(func, knobs):
    sch = s_tir.Schedule(ir.IRModule({"main": func}))
    [(name, _)] = gemm_blocks(sch, with_depthwise=True)
    knobs.annotate(sch, sch.get_sblock(name))
    return sch.mod["main"]


def flat_layouts(out: int, padded: int) -> list:
    """The depthwise layouts over the image for a square output of ``out`` pixels a side and
    an input ``padded`` pixels wide: per virtual width (``padded`` to ``padded + 15``),
    ``(tiles of pixels, tiles a block of its fewest whole rows holds)`` (a whole number of
    tiles, at most 16; the rows padded to whole blocks)."""
    out_ = []
    for width in range(padded, padded + 16):
        rows = 16 // math.gcd(width, 16)
        if rows * width // 16 <= 16 and out > 1:
            out_.append((-(-out // rows) * rows * width // 16, rows * width // 16))
    return out_


@settings(max_examples=12)
@given(st.sampled_from([(20, 3, 1), (34, 3, 2), (33, 5, 1), (9, 3, 1), (12, 3, 1)]), st.sampled_from([8, 24, 48, 64]),
       st.booleans(), st.sampled_from([None, 1, 2, 3, 4, 6]), st.sampled_from([None, 1, 2, 3, 4, 16]),
       st.sampled_from([None, "row", "image"]))
def test_every_depthwise_block_is_bit_exact_or_refused_when_it_does_not_divide_the_tiles(shape, c, epilogue, bm, bn,
                                                                                         pixels):
    """Blocks along a row's tiles, or over the image's pixels (blocks of whole virtual rows),
    bit-exact with llvm, or refused when they do not divide the tiles (over the image: are not
    whole rows of any layout)."""
    size, k, stride = shape
    func = depthwise(size, c, k, stride, epilogue)
    args = inputs(func)
    out = (size - 1) // stride + 1
    channels = -(-c // 16)
    row = -(-out // 16)
    layouts = flat_layouts(out, size + 2 * (k // 2))

    def fits(mode, bm_, bn_):
        if channels % bn_:
            return False
        if mode == "row":
            return row % (bm_ or 1) == 0
        return any(tiles % (bm_ or least) == 0 and (bm_ or least) % least == 0 for tiles, least in layouts)

    try:
        got, _, report = accel_run(with_depthwise_knobs(func, Knobs(bm=bm, bn=bn, pixels=pixels)), args)
    except ScheduleError as err:
        assert not any(fits(mode, bm, bn or 1) for mode in ((pixels,) if pixels else ("row", "image")))
        assert "does not divide" in str(err) or "not whole rows" in str(err) or "one row high" in str(err)
        return
    np.testing.assert_array_equal(got, llvm_result(func, args))
    used = report.offloaded[0].knobs
    assert pixels in (None, used.pixels) and fits(used.pixels, used.bm, used.bn)
    assert used.bn == (bn or 1) and (bm is None or used.bm == bm)
    if bm is None:      # the heuristic's: one tile along a row, or a layout's fewest whole rows
        assert used.bm in ((1,) if used.pixels == "row" else {least for _, least in layouts})


def test_a_20_pixel_wide_depthwise_runs_over_the_image_in_fewer_cycles_than_row_by_row():
    """A 20 x 20 output (3 x 3, stride 1): row by row each row pads to 32 pixels (40 DWMACs a
    tile of channels); over the image, rows of a virtual width of 24 (the padded input's 22
    rounded to a whole tile every 2 rows), 30 DWMACs. The heuristic takes the image (its
    estimate is lower), the simulation confirms it (24% fewer cycles), and the estimate is
    within 5% of the simulated cycles either way."""
    func = depthwise(20, 32, 3, 1, True)
    args = inputs(func)
    want = llvm_result(func, args)
    runs = {}
    for pixels in ("row", "image", None):
        got, stats, notes = accel_run(with_depthwise_knobs(func, Knobs(pixels=pixels)), args, stats=True)
        np.testing.assert_array_equal(got, want)
        runs[pixels] = (stats, notes.offloaded[0])
    assert runs["row"][0].instructions["DWMAC"] == 20 * 2 * 2
    assert runs["image"][0].instructions["DWMAC"] == 20 * 24 // 16 * 2
    # the epilogue: one ALU chain a block of 2 rows x 20 pixels (its rows and their pixels an
    # instruction's two loops), not an instruction a step and row
    assert runs["image"][0].instructions["ALU_CHAIN"] == 10 * 2 and runs["image"][0].instructions["ALU"] == 0
    assert runs[None][1].knobs.pixels == "image" and runs[None][0].cycles == runs["image"][0].cycles
    assert runs["image"][0].cycles < 0.85 * runs["row"][0].cycles
    for stats, plan in runs.values():
        used = plan.knobs
        assert abs(plan.estimate(used.bm, used.bn, used.bk) - stats.cycles) <= 0.05 * stats.cycles


def test_a_depthwise_block_of_tiles_keeps_the_alu_less_busy_than_one_tile_at_a_time():
    """64 channels of a 32-pixel-wide output: 2 x 4 tiles a block, each epilogue step one ALU
    instruction over the block instead of one per tile (its issue overhead paid once), and
    one reset of the block; every DWMAC the same. The ALU runs beside the GEMM array (ISA.md
    section 6): both schedules take the DWMACs' cycles, within 1%."""
    func = depthwise(32, 64, 3, 1, True)
    args = inputs(func)
    (_, one_stats, one_report), (_, block_stats, report) = exact_runs(
        func, args, [with_depthwise_knobs(func, Knobs(bm=1, bn=1)), with_depthwise_knobs(func, Knobs(bm=2, bn=4))],
        stats=True)
    assert (one_report.offloaded[0].knobs.bm, one_report.offloaded[0].knobs.bn) == (1, 1)
    assert (report.offloaded[0].knobs.bm, report.offloaded[0].knobs.bn) == (2, 4)
    assert block_stats.busy["alu"] < 0.8 * one_stats.busy["alu"]
    assert block_stats.busy["gemm"] < one_stats.busy["gemm"]
    assert block_stats.instructions["GEMM"] * 8 == one_stats.instructions["GEMM"]      # a reset a block
    assert block_stats.instructions["DWMAC"] == one_stats.instructions["DWMAC"]
    for stats in (one_stats, block_stats):
        assert stats.cycles <= 1.01 * stats.busy["gemm"]


def test_the_heuristic_takes_the_depthwise_block_of_fewest_estimated_cycles_within_1_percent():
    """A 32 x 32 depthwise convolution (16 channels, 3 x 3, bias, ReLU, requantise): the
    heuristic's block is a row's 2 tiles (its reset, bias LOAD, epilogue chains and STORE one
    instruction each, not one a tile): fewer instructions and cycles than a tile a block, bit
    for bit llvm's; the estimate (dwmac_cycles) of either within 1% of the simulated cycles."""
    func = depthwise(32, 16, 3, 1, True)
    (_, block, report), (_, one, one_report) = exact_runs(
        func, inputs(func), [func, with_depthwise_knobs(func, Knobs(bm=1, bn=1))], stats=True)
    plan = report.offloaded[0]
    assert (plan.knobs.bm, plan.knobs.bn, plan.knobs.pixels) == (2, 1, "row")
    assert sum(block.instructions.values()) < 0.8 * sum(one.instructions.values())
    assert block.cycles < one.cycles
    for stats, used in ((block, plan), (one, one_report.offloaded[0])):
        assert abs(used.estimate(used.knobs.bm, used.knobs.bn, 1) - stats.cycles) <= 0.01 * stats.cycles


def test_a_depthwise_block_that_does_not_fit_acc_is_made_smaller():
    func = depthwise(32, 64, 3, 1, True)
    small = accel.Config(acc_bytes=16 * 1024)       # 16 tiles of int32: not 2 x 4 tiles, twice, in 3 regions
    _, notes = schedule(with_depthwise_knobs(func, Knobs(bm=2, bn=4)), small)
    used = notes.offloaded[0].knobs
    assert used.bm * used.bn < 8 and 2 % used.bm == 0 and 4 % used.bn == 0
    args = inputs(func)
    ex = accel.build(with_depthwise_knobs(func, Knobs(bm=2, bn=4)), config=small)
    with accel.Session(small):
        ex(*args)
    np.testing.assert_array_equal(args[-1], llvm_result(func, inputs(func)))


def test_the_priors_favour_the_image_when_rows_pad_more_and_depthwise_blocks_are_knobs():
    from accel.compiler.tuning import knobs

    def likeliest(func):
        sch = s_tir.Schedule(ir.IRModule({"main": func}))
        return {k.key.removeprefix("accel."): k.values[k.likely] for k in knobs(sch, accel.Config())}

    narrow = likeliest(conv("NHWC", 2, 16, 32, 64, 3, 2, True))     # rows of 8 pixels pad to 16, the image of 64 not
    assert (GATHERS[narrow["gather"]], PIXELS[narrow["pixels"]]) == ("im2col", "image")
    wide = conv("NHWC", 2, 16, 32, 64, 3, 1, True)                  # rows of 16: no padding to save
    assert (GATHERS[likeliest(wide)["gather"]], PIXELS[likeliest(wide)["pixels"]]) == ("direct", "row")
    # a depthwise convolution: its blocks of 2 x 4 tiles (the whole of each side) likeliest
    # and its pixels along the rows (32 wide: whole tiles; over the image, rows of 34 would pad more)
    assert {k: v for k, v in likeliest(depthwise(32, 64, 3, 1, True)).items()} == {"bm": 2, "bn": 4, "pixels": 0}


def likeliest_knobs(func) -> dict:
    """The annotations of the tuning space's likeliest candidate (each knob's likeliest value)."""
    from accel.compiler.tuning import knobs
    sch = s_tir.Schedule(ir.IRModule({"main": func}))
    return {(k.block, k.key): k.values[k.likely] for k in knobs(sch, accel.Config())}


def annotated(func, annotations: dict):
    sch = s_tir.Schedule(ir.IRModule({"main": func}))
    for (block, key), value in annotations.items():
        sch.annotate(sch.get_sblock(block), key, value)
    return sch.mod["main"]


@functools.cache
def _unpadded_channels():
    """200 channels (13 tiles) of a 1x1 convolution over two rows of 96 pixels with a bias,
    ReLU and requantise, under the heuristic's, the likeliest and the largest blocks: the
    plan, the likeliest knobs, and per candidate (the knobs used, simulated cycles)."""
    func = requantised_conv((1, 32, 2, 96), 200, 1, 1, 0)
    plan = schedule(func, accel.Config())[1].offloaded[0]
    likely = likeliest_knobs(func)
    chosen = Knobs.from_annotations({key: value for (_, key), value in likely.items()})
    args = inputs(func)
    want = llvm_result(func, args)
    runs = {}
    for label, knobs in (("heuristic", Knobs()), ("likeliest", chosen), ("largest", Knobs(bm=12, bn=8))):
        got, cycles, notes = accel_run(with_knobs(func, knobs), args)
        np.testing.assert_array_equal(got, want)
        runs[label] = (notes.offloaded[0].knobs, cycles)
    return plan, chosen, runs


def test_the_heuristic_and_likeliest_blocks_leave_channels_unpadded_when_the_epilogue_dominates():
    """Blocks of 2 tiles of channels would pad the 13 to 14 and every epilogue step pay for
    the padding; the heuristic (a divisor of the tiles where the power of two pads) and the
    likeliest candidate take one tile of channels a block (no padding), which the estimate
    ranks cheapest and the simulation confirms (fewer cycles than the largest blocks)."""
    plan, chosen, runs = _unpadded_channels()
    assert (plan.knobs.bn, chosen.bn) == (1, 1)
    cycles = {label: cycles for label, (_, cycles) in runs.items()}
    assert cycles["likeliest"] <= cycles["heuristic"] < cycles["largest"]


def test_the_block_estimate_is_within_5_percent_of_the_simulated_cycles():
    """block_cycles runs the next block's GEMMs beside a block's last ALU instructions, as
    the compute units do (accel/ISA.md, section 6): within 5% for each of the three
    candidates (the serial sum was 30-40% high)."""
    plan, _, runs = _unpadded_channels()
    for used, cycles in runs.values():
        assert abs(plan.estimate(used.bm, used.bn, used.bk) - cycles) <= 0.05 * cycles


@settings(max_examples=8)
@given(st.sampled_from(["NHWC", "NCHW"]), st.sampled_from([(6, 3, 1), (8, 1, 1), (12, 3, 1), (16, 1, 2)]),
       st.sampled_from([(16, 8), (16, 40), (32, 24), (8, 72)]), st.booleans())
def test_the_likeliest_candidate_is_bit_exact_and_estimated_no_dearer_than_the_heuristic(layout, shape, channels,
                                                                                       epilogue):
    size, k, stride = shape
    c, f = channels
    func = conv(layout, 1, size, c, f, k, stride, epilogue)
    plan = schedule(func, accel.Config())[1].offloaded[0]
    likely = likeliest_knobs(func)
    tuned = annotated(func, likely)
    used = schedule(tuned, accel.Config())[1].offloaded[0].knobs
    if (used.gather, used.pixels) == (plan.knobs.gather, plan.knobs.pixels):    # the estimate's gather and pixels
        h = plan.knobs
        assert plan.estimate(used.bm, used.bn, used.bk) <= plan.estimate(h.bm, h.bn, h.bk)
    args = inputs(func)
    got, _, _ = accel_run(tuned, args)
    np.testing.assert_array_equal(got, llvm_result(func, args))


@settings(max_examples=6)
@given(st.sampled_from([(20, 3, 1), (34, 3, 2), (33, 5, 1)]), st.sampled_from([8, 24, 48, 200]), st.booleans())
def test_the_likeliest_depthwise_block_is_the_cheapest_estimate_and_bit_exact(shape, c, epilogue):
    size, k, stride = shape
    func = depthwise(size, c, k, stride, epilogue)
    plan = schedule(func, accel.Config())[1].offloaded[0]
    likely = likeliest_knobs(func)
    chosen = Knobs.from_annotations({key: value for (_, key), value in likely.items()})
    from accel.compiler.tuning import knobs
    sizes = {k.key: k.values for k in knobs(s_tir.Schedule(ir.IRModule({"main": func})), accel.Config())}
    # the heuristic's pixels (row or image, the estimate's cheaper) likeliest, its cheapest blocks
    assert chosen.pixels in (None, plan.knobs.pixels)
    costs = [plan.estimate(bm, bn, 1) for bm in sizes["accel.bm"] for bn in sizes["accel.bn"]]
    assert plan.estimate(chosen.bm, chosen.bn, 1) == min(c for c in costs if c is not None)
    args = inputs(func)
    got, cycles, _ = accel_run(with_depthwise_knobs(func, chosen), args)
    np.testing.assert_array_equal(got, llvm_result(func, args))


def precise(out, b, fdim: int):
    """integerize's default requantise after a bias and a clamp: ``(p*H + ((p*L) >> 20) +
    2^18) >> 19`` of ``p = clip(acc + b)``, which reads ``p`` twice (the epilogue forks after
    the bias and the clamp, its three shared steps), each operation a block as Relax's
    legalized ops are."""
    def step(f, name, src):
        return te.compute(src.shape, lambda *i: f(src(*i)), name=name)

    biased = te.compute(out.shape, lambda *i: out(*i) + b[i[fdim]], name="bias")
    p = step(lambda v: te.min(v, 3000), "hi", step(lambda v: te.max(v, -3000), "lo", biased))
    high, low = step(lambda v: v * 1855, "high", p), step(lambda v: v * 51094, "low", p)
    low = step(lambda v: v >> 20, "shift", low)
    total = te.compute(out.shape, lambda *i: high(*i) + low(*i), name="sum")
    rounded = step(lambda v: v >> 19, "round", step(lambda v: v + 262144, "half", total))
    return step(lambda v: te.max(te.min(v, 127), -128).astype("int8"), "requant", rounded)


def forking(kind: str, size: int, c: int, f: int):
    """A convolution (NCHW or NHWC, 3x3), a dense layer or a depthwise convolution (3x3)
    with the :func:`precise` epilogue."""
    b = te.placeholder((f if kind != "depthwise" else c,), "int32", name="b")
    if kind == "dense":
        a, w = te.placeholder((size, c), "int8", name="a"), te.placeholder((f, c), "int8", name="w")
        return te.create_prim_func([a, w, b, precise(topi.nn.dense(a, w, out_dtype="int32"), b, 1)])
    if kind == "depthwise":
        x, w = te.placeholder((1, c, size, size), "int8", name="x"), te.placeholder((c, 1, 3, 3), "int8", name="w")
        out = topi.nn.group_conv2d_nchw(x, w, 1, 1, 1, c, out_dtype="int32")
        return te.create_prim_func([x, w, b, precise(out, b, 1)])
    if kind == "NHWC":
        x, w = te.placeholder((1, size, size, c), "int8", name="x"), te.placeholder((3, 3, c, f), "int8", name="w")
        out = topi.nn.conv2d_nhwc(x, w, 1, 1, 1, out_dtype="int32")
        return te.create_prim_func([x, w, b, precise(out, b, 3)])
    x, w = te.placeholder((1, c, size, size), "int8", name="x"), te.placeholder((f, c, 3, 3), "int8", name="w")
    out = topi.nn.conv2d_nchw(x, w, 1, 1, 1, out_dtype="int32")
    return te.create_prim_func([x, w, b, precise(out, b, 1)])


@settings(max_examples=7)
@given(st.sampled_from(["NCHW", "NHWC", "dense", "depthwise"]), st.sampled_from([6, 12, 20]),
       st.sampled_from([(8, 8), (16, 40), (24, 200)]), st.sampled_from([(None, None), (1, 1), (2, 1), (1, 2)]))
def test_a_forking_epilogue_runs_its_shared_steps_once_bit_exact_and_in_fewer_cycles(kind, size, channels, blocks):
    """``fork="once"`` (the heuristic's): the bias and clamp both branches of the precise
    requantise apply run once, in place on the accumulator, before the temporary copies it;
    the result is the same, bit for bit, as ``fork="each"`` (each branch applying them) and as llvm's, in fewer
    cycles, which the estimate a tuner ranks candidates by foresees."""
    c, f = channels
    func = forking(kind, size, c, f)
    bm, bn = blocks
    if kind == "depthwise":
        tiles = [-(-size // 16), -(-c // 16)]
        bm, bn = (bm if bm and tiles[0] % bm == 0 else None), (bn if bn and tiles[1] % bn == 0 else None)
    args = inputs(func)
    (_, each_cycles, each_notes), (_, once_cycles, notes) = exact_runs(func, args, [
        with_any_knobs(func, Knobs(bm=bm, bn=bn, fork="each")),
        with_any_knobs(func, Knobs(bm=bm, bn=bn))])     # the heuristic's
    plan, each_plan = notes.offloaded[0], each_notes.offloaded[0]
    assert (plan.shared, plan.knobs.fork, each_plan.knobs.fork) == (3, "once", "each")
    assert once_cycles < each_cycles
    used = plan.knobs
    assert plan.estimate(used.bm, used.bn, used.bk) < each_plan.estimate(used.bm, used.bn, used.bk)


def with_any_knobs(func, knobs):
    """``func`` with ``knobs`` on its GEMM or depthwise block."""
    sch = s_tir.Schedule(ir.IRModule({"main": func}))
    for name, _ in gemm_blocks(sch, with_depthwise=True):
        knobs.annotate(sch, sch.get_sblock(name))
    return sch.mod["main"]


def test_the_fork_knob_is_offered_where_the_epilogue_forks_and_running_once_is_likeliest():
    from accel.compiler.tuning import knobs
    funcs = {"forking": forking("NCHW", 8, 16, 16), "plain": conv("NCHW", 1, 8, 16, 16, 3, 1, True)}
    forks = {kind: [k for k in knobs(s_tir.Schedule(ir.IRModule({"main": func})), accel.Config())
                    if k.key == "accel.fork"]
             for kind, func in funcs.items()}
    assert forks["plain"] == []
    [fork] = forks["forking"]
    assert fork.values[fork.decision] == fork.values[fork.likely] == 1      # "once": the heuristic's and likeliest


@settings(max_examples=5, deadline=None)
@given(st.sampled_from(["NCHW", "NHWC", "dense", "depthwise"]), st.sampled_from([12, 20, 28]),
       st.sampled_from([(16, 40), (24, 200), (48, 64)]))
@example("dense", 20, (16, 40))     # a block of all of M's 20 rows: its ALU passes run over those alone
def test_the_ranked_candidates_are_bit_exact_and_their_estimate_foresees_the_cycles(kind, size, channels):
    """The tuner's candidates after the heuristic (:func:`accel.compiler.tuning.ranked`, the
    cheapest by the estimate over the whole knob space, a forking epilogue's ``each`` and
    ``once`` among them): each schedules bit-exact with llvm, they come cheapest first, and
    the estimate of each (and of the heuristic, :func:`~accel.compiler.tuning.work`) is within
    30% of its simulated cycles (the fork's chains counted as :mod:`accel.compiler.chains`
    forms them; a small layer's few blocks pipeline less than the estimate's steady state of
    the GEMM array beside the ALU; on the PaddleOCR classifier's layers within 6%)."""
    from accel.compiler.tuning import ranked, work
    c, f = channels
    func = forking(kind, size, c, f)
    found = ranked(s_tir.Schedule(ir.IRModule({"main": func})), accel.Config())
    assert found and [cost for cost, _ in found] == sorted(cost for cost, _ in found)
    args = inputs(func)
    want = llvm_result(func, args)
    _, heuristic, _ = accel_run(func, args)
    assert abs(work(func, accel.Config()) - heuristic) <= 0.3 * heuristic
    for cost, choice in found[:2]:
        got, cycles, _ = accel_run(annotated(func, choice), args)
        np.testing.assert_array_equal(got, want)
        assert abs(cost - cycles) <= 0.3 * cycles, (choice, cost, cycles)


def test_the_estimate_counts_a_chain_per_operand_a_run_reads():
    """A temporary's copy of the accumulator and a bias after it read two vector operands:
    two ALU chains (:mod:`accel.compiler.chains` cuts a chain where its operand changes),
    which is why running the shared bias once (``fork="once"``) pays."""
    from accel.compiler.schedule import _chains
    acc, bias = object(), object()
    assert _chains([None, acc, bias, None, None]) == [2, 3]
    assert _chains([None, acc, None, None]) == [4]
    assert _chains([bias] * 9) == [8, 1]                  # eight steps a chain
    assert _chains([None] * 7) == [6, 1]                  # six of them immediates


@pytest.mark.parametrize("func", [conv("NCHW", 1, 8, 16, 16, 3, 1, True), dense(2, 10, 40)], ids=["conv", "dense"])
def test_the_scheduler_skips_tvms_python_type_check(func, monkeypatch):
    """accel's scheduler works on ``tp.Schedule`` (thousands of primitives per model: TVM's
    Python check of their arguments was a sixth of scheduling time); its result is unchanged."""
    want = schedule_partition(func, accel.Config())

    def refuse(*_):
        raise AssertionError("TVM's Python type check ran")
    monkeypatch.setattr(_type_checker, "_type_check", refuse)
    got = schedule_partition(func, accel.Config())
    assert tvm_ffi.structural_equal(got, want)
