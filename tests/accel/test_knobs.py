"""The scheduler's knobs (block sizes, weight residency, gather, pixels per block): every
choice compiles to a program bit-exact with the same workload compiled by TVM for llvm,
and leaving every knob unset is exactly the heuristic."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import ir, s_tir, te, topi

import accel
from accel.compiler.schedule import GATHERS, PIXELS, WEIGHTS, Knobs, ScheduleError, gemm_blocks, schedule


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


def accel_run(func, args):
    """The output and cycles of ``func`` built by accel.build, and the scheduler's notes (the
    knobs it chose for each GEMM)."""
    ex = accel.build(func)
    args = [a.copy() for a in args]
    with accel.Session() as s:
        ex(*args)
    return args[-1], s.stats.cycles, schedule(func, accel.Config())[1]


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
    want = llvm_result(func, args)
    row, row_cycles, _ = accel_run(with_knobs(func, Knobs(gather="im2col", pixels="row")), args)
    image, image_cycles, report = accel_run(with_knobs(func, Knobs(gather="im2col", pixels="image")), args)
    np.testing.assert_array_equal(row, want)
    np.testing.assert_array_equal(image, want)
    assert report.offloaded[0].knobs.pixels == "image"
    assert image_cycles < 0.75 * row_cycles


def test_knob_annotations_are_checked():
    with pytest.raises(ValueError, match="Knobs.bm must be a positive int"):
        Knobs(bm=0)
    with pytest.raises(ValueError, match="Knobs.gather must be one of"):
        Knobs(gather="strided")
    with pytest.raises(ScheduleError, match="accel.weights = 7 is not an index"):
        Knobs.from_annotations({"accel.weights": 7})
