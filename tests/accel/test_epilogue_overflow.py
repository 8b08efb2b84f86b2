"""accel's epilogues compute what TVM's llvm code computes, bit for bit, int32 overflow
included: random chains of add, subtract, multiply, right shift, max/min, ReLU, clip and
requantise on an int8 matmul or conv2d, with any int32 immediates, per-channel constants
and residual inputs, built with ``tp.build(mod, "accel, llvm")`` and compared with
``tvm.compile(mod, "llvm")``. Each model must run whole on accel, epilogue included (on
the CPU the comparison would prove nothing about the ALU)."""

import numpy as np
import pytest
import tvm
from hypothesis import assume, given, reject, settings
from hypothesis import strategies as st
from tvm import relax

import tirpat as tp
from tirpat.testing.differential import llvm_reference, random_inputs

INT32 = st.integers(-2**31, 2**31 - 1)
#: Requantise-sized multipliers and offsets: products of accumulators with them overflow.
LARGE = st.one_of(st.integers(2**15, 2**31 - 1), st.integers(-2**31, -2**15))
SCALAR = st.one_of(INT32, LARGE, st.integers(-300, 300))
#: the inputs (int8 ones, int32 residuals) span their dtypes' whole ranges
WHOLE_RANGES: dict = {}

# (op, operand): operand is an int (a scalar constant), "channel" (an int32 constant per
# output channel), "residual" (an int32 input of the output's shape) or None (relu); clip
# takes a pair of bounds; right_shift an amount in [0, 31]
STEP = st.one_of(
    st.tuples(st.sampled_from(["add", "subtract", "multiply", "maximum", "minimum"]), SCALAR),
    st.tuples(st.sampled_from(["add", "multiply", "maximum", "minimum"]), st.just("channel")),
    st.tuples(st.sampled_from(["add", "multiply"]), st.just("residual")),
    st.tuples(st.just("right_shift"), st.integers(0, 31)),
    st.tuples(st.just("relu"), st.none()),
    st.tuples(st.integers(-2**31, 2**31 - 1), st.integers(-2**31, 2**31 - 1)).map(
        lambda b: ("clip", tuple(sorted(b)))),
)
# what ends the chain: nothing (int32 out), a plain cast (the STORE wraps), or a requantise
# (round, shift, clip to int8, cast: the STORE saturates)
TAIL = st.one_of(st.just(None), st.just("cast"), st.integers(1, 31).map(lambda s: ("requantise", s)))


def _model(kind, m, n, k, steps, tail, left, seed):
    """A Relax module: an int8 matmul ([m, k] x [n, k]^T) or 3x3 NHWC conv2d (an m x m image,
    k to n channels) into int32, then ``steps`` (commutative ones with the accumulator on
    the right where ``left``) and ``tail``."""
    rng = np.random.default_rng(seed)
    if kind == "matmul":
        x_shape, out_shape = (m, k), (m, n)
    else:
        x_shape, out_shape = (1, m, m, k), (1, m, m, n)
    params = [relax.Var("x", relax.TensorType(x_shape, "int8"))]
    if any(operand == "residual" for _, operand in steps):
        params.append(relax.Var("r", relax.TensorType(out_shape, "int32")))
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            if kind == "matmul":
                w = relax.const(rng.integers(-128, 128, (n, k), dtype=np.int8))
                y = bb.emit(relax.op.matmul(params[0], relax.op.permute_dims(w), out_dtype="int32"))
            else:
                w = relax.const(rng.integers(-128, 128, (3, 3, k, n), dtype=np.int8))
                y = bb.emit(relax.op.nn.conv2d(params[0], w, padding=1, data_layout="NHWC", kernel_layout="HWIO",
                                               out_dtype="int32"))
            for (op, operand), swap in zip(steps, left):
                if op == "relu":
                    y = bb.emit(relax.op.nn.relu(y))
                    continue
                if op == "clip":
                    y = bb.emit(relax.op.clip(y, *operand))
                    continue
                if operand == "channel":
                    lo, hi = (0, 32) if op == "right_shift" else (-2**31, 2**31)
                    other = relax.const(rng.integers(lo, hi, (n,), dtype=np.int64).astype(np.int32))
                elif operand == "residual":
                    other = params[1]
                else:
                    other = relax.const(np.int32(operand))
                call = getattr(relax.op, op)
                commutes = op in ("add", "multiply", "maximum", "minimum")
                y = bb.emit(call(other, y) if swap and commutes else call(y, other))
            if tail == "cast":
                y = bb.emit(relax.op.astype(y, "int8"))
            elif tail is not None:
                shift = tail[1]
                y = bb.emit(relax.op.add(y, relax.const(np.int32(1 << (shift - 1)))))
                y = bb.emit(relax.op.right_shift(y, relax.const(np.int32(shift))))
                y = bb.emit(relax.op.astype(relax.op.clip(y, -128, 127), "int8"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


#: Steps whose result is a constant whatever the accumulator: accel declines them (TVM
#: folds them away), see test_a_constant_result_is_declined_with_the_reason.
CONSTANT_RESULT = {("multiply", 0), ("minimum", -2**31), ("maximum", 2**31 - 1)}
#: Steps whose wrap-around TVM's llvm code does not compute (see
#: test_a_sum_llvm_does_not_wrap_is_declined_with_the_reason).
NOT_WRAPPED_BY_LLVM = {("add", -2**31), ("subtract", -2**31)}


def _declined(step) -> bool:
    """Whether accel declines ``step`` (tested on their own below)."""
    op, operand = step
    return step in CONSTANT_RESULT | NOT_WRAPPED_BY_LLVM or (op == "clip" and (operand[1] == -2**31
                                                                              or operand[0] == 2**31 - 1))


def _assert_bit_exact_on_accel(mod, seed=1):
    args = random_inputs(mod, seed, ranges=WHOLE_RANGES)
    try:
        expect = llvm_reference(mod)
    except Exception:       # TVM cannot compile it for the CPU either (a multiply by -2**31 can fail)
        reject()
    want = expect(*args)[0]
    model = tp.build(mod, "accel, llvm", strict=True)   # an operator accel's patterns cover left on the host raises
    report = model.report.to_json()
    assert report["macs"]["host"] == 0 and len(report["partitions"]) == 1, report
    part = report["partitions"][0]
    # the whole chain is in accel's partition, and the scheduler put it on the ALU
    chain = [b.value.op.name for b in mod["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and b.value.op.name != "relax.permute_dims"]
    assert part["backend"] == "accel" and part["ops"] == chain and part["fallback"] is None, part
    assert part["epilogue"] and not any("epilogue" in why for _, why in part["on_host"]), part
    np.testing.assert_array_equal(model(*args), want, strict=True)      # dtype included


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 20), st.integers(1, 20), st.integers(1, 40), st.lists(STEP, min_size=1, max_size=4),
       TAIL, st.lists(st.booleans(), min_size=4, max_size=4), st.integers(0, 2**16))
def test_matmul_epilogues_wrap_like_llvm(m, n, k, steps, tail, left, seed):
    assume(not any(_declined(step) for step in steps))
    _assert_bit_exact_on_accel(_model("matmul", m, n, k, steps, tail, left, seed))


@settings(max_examples=4, deadline=None)
@given(st.integers(2, 6), st.integers(1, 20), st.integers(1, 8), st.lists(STEP, min_size=1, max_size=4),
       TAIL, st.lists(st.booleans(), min_size=4, max_size=4), st.integers(0, 2**16))
def test_conv2d_epilogues_wrap_like_llvm(m, n, k, steps, tail, left, seed):
    assume(not any(_declined(step) for step in steps))
    _assert_bit_exact_on_accel(_model("conv2d", m, n, k, steps, tail, left, seed))


@pytest.mark.parametrize("steps", [
    # relu, then a product that wraps negative, then a max llvm keeps (the simplifier thought
    # the product non-negative and dropped it)
    [("relu", None), ("multiply", 861094), ("maximum", -772)],
    # (acc + c1) * c2 with c1 * c2 outside int32 (the simplifier folded it into one literal)
    [("add", -9755), ("multiply", -233730)],
    # subtracting int32's maximum from a negative accumulator wraps positive
    [("subtract", 2**31 - 1), ("multiply", 3)],
    # a bias added before a requantise multiply, then a product and sum that wrap
    [("add", "channel"), ("multiply", 2**30 + 7), ("add", 2**31 - 1)],
])
def test_epilogues_the_simplifier_would_change(steps):
    _assert_bit_exact_on_accel(_model("matmul", 16, 16, 32, steps, None, [False] * 4, 0))


def test_an_epilogue_the_alu_cannot_run_stays_on_the_cpu_as_llvm_computes_it():
    # a shift by a per-channel amount is no ALU step: the whole chain runs on the CPU,
    # unfused (fused into one loop, LLVM would drop the max after the wrapping product)
    steps = [("relu", None), ("multiply", 861094), ("maximum", -772), ("right_shift", "channel")]
    mod = _model("matmul", 16, 16, 32, steps, None, [False] * 4, 0)
    x = random_inputs(mod, 1, ranges=WHOLE_RANGES)
    want = llvm_reference(mod)(*x)[0]
    model = tp.build(mod, "accel, llvm", strict=True)
    part = model.report.to_json()["partitions"][0]
    assert part["backend"] == "accel" and any("epilogue" in why for _, why in part["on_host"]), part
    np.testing.assert_array_equal(model(*x), want)


def test_a_shift_outside_int32s_width_is_declined_with_the_reason():
    # a constant shift by 32 or -1: TVM refuses to build it for the CPU, and so does tp.build
    for amount in (32, -1):
        mod = _model("matmul", 16, 16, 32, [("right_shift", amount)], None, [False], 0)
        with pytest.raises(Exception, match="Shift amount must be non-negative and less than 32"):
            tvm.compile(mod, "llvm")
        with pytest.raises(Exception, match="Shift amount must be non-negative and less than 32"):
            tp.build(mod, "accel, llvm")
    # per-channel amounts, one of them 40: llvm's shift is undefined there, accel's SHR would
    # clip; accel declines the shift, which stays on the host (llvm's own code)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 32), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(np.ones((16, 32), np.int8))
            y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w), out_dtype="int32"))
            amounts = relax.const(np.array([40] + [3] * 15, np.int32))
            out = bb.emit_output(bb.emit(relax.op.right_shift(y, amounts)))
        bb.emit_func_output(out)
    with pytest.raises(tp.OffloadError, match=r"right_shift by 40; an int32 shift is defined for 0 to 31"):
        tp.build(bb.get(), "accel, llvm", strict=True)


@pytest.mark.parametrize("step", sorted(CONSTANT_RESULT) + [("clip", (-2**31, -2**31)),
                                                            ("clip", (2**31 - 1, 2**31 - 1))])
def test_a_constant_result_is_declined_with_the_reason(step):
    # TVM folds multiply(x, 0) and the like into a constant, which leaves the ALU no
    # accumulator: the step and what follows stay on the host, and the model is still right
    mod = _model("matmul", 16, 16, 32, [step, ("add", 3)], None, [False] * 2, 0)
    with pytest.raises(tp.OffloadError, match=r"is a constant whatever the accumulator x"):
        tp.build(mod, "accel, llvm", strict=True)
    x = random_inputs(mod, 1, ranges=WHOLE_RANGES)
    want = llvm_reference(mod)(*x)[0]
    with pytest.warns(tp.OffloadWarning):
        model = tp.build(mod, "accel, llvm")
    assert model.report.to_json()["macs"]["host"] == 0     # the matmul itself still runs on accel
    np.testing.assert_array_equal(model(*x), want)


@pytest.mark.parametrize("step", sorted(NOT_WRAPPED_BY_LLVM))
def test_a_sum_llvm_does_not_wrap_is_declined_with_the_reason(step):
    # llvm's code computes acc + -2**31 as acc | -2**31 (it may: its int32 arithmetic is
    # "no signed wrap"), accel's ALU wraps; the host computes it as llvm does
    mod = _model("matmul", 16, 16, 32, [step], None, [False], 0)
    with pytest.raises(tp.OffloadError, match=r"overflows int32, and TVM's llvm code .* does not wrap it"):
        tp.build(mod, "accel, llvm", strict=True)
    x = random_inputs(mod, 1, ranges=WHOLE_RANGES)
    want = llvm_reference(mod)(*x)[0]
    with pytest.warns(tp.OffloadWarning):
        np.testing.assert_array_equal(tp.build(mod, "accel, llvm")(*x), want)
