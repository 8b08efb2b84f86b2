"""integerize's precise requantise on accel: a multiplier of up to 48 bits as two int32
products, ``(acc*H + ((acc*L + c) >> k) + c') >> (s - k)``, reads the accumulator twice. accel
runs it in its epilogue (one block of the fork kept as a temporary in a second ACC region, the
ALU's chain on a copy of the accumulator there), bit for bit what ``tvm.compile(mod, "llvm")``
computes, and a QDQ convolution integerised with ``precise=True`` runs wholly on accel."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tirpat as tp
from tirpat.model.integerize.fixed_point import Requantize
from tirpat.model.integerize.rules import emit_requantize
from tirpat.testing.differential import assert_matches_llvm
from tirpat.testing.int8_models import int8_layer


def _model(kind, m, n, k, rq, bias, seed, nchw=False):
    """:func:`int8_layer`'s matmul, 3x3 conv2d (NHWC or ``nchw``; accel computes channels-last
    and transposes back) or depthwise one, a per-channel bias or none, then ``rq`` as
    integerize emits it."""
    return int8_layer(kind, m, n, k, lambda bb, y: bb.emit(emit_requantize([y], rq)), seed=seed,
                      bias=2**14 if bias else 0, layout="NCHW" if nchw else "NHWC")


def _assert_on_accel_bit_exact(mod, calls=2, alu=True):
    model = assert_matches_llvm(mod, "accel, llvm", calls=calls, seed=1)
    report = model.report.to_json()
    assert report["macs"]["host"] == 0 and len(report["partitions"]) == 1, report
    part = report["partitions"][0]
    assert part["backend"] == "accel" and part["fallback"] is None, part
    assert all("epilogue" not in why for _, why in part["on_host"]), part
    if alu:
        assert "requantise" in part["epilogue"] and part["rules"].get("accel.alu", 0) >= 1, part
        # the temporary's copy (x * 0 + acc) and its chain, and the accumulator's, ran on the ALU (as ALU chains)
        counts = model.stats["accel"].instructions
        assert counts["ALU"] + counts["ALU_CHAIN"] >= 2
    return model


@st.composite
def precise_cases(draw):
    kind = draw(st.sampled_from(["matmul", "conv2d", "depthwise"]))
    m = draw(st.integers(1, 20) if kind == "matmul" else st.integers(2, 6))
    n = draw(st.integers(1, 40))
    k = n if kind == "depthwise" else draw(st.integers(1, 40))
    taps = 1 if kind == "matmul" else 9
    reach_k = 1 if kind == "depthwise" else k
    # the accumulator's bound: what the MACs reach, or a clamp well inside it; multipliers of
    # 2**-30 .. 2**-2 with up to 48 significant bits (the two products then near int32's limits)
    reach = taps * reach_k * 128 * 128 + 2**14
    bound = draw(st.sampled_from([reach, max(1, reach // 64), 2**20]))
    real = draw(st.floats(2.0**-30, 0.25)) * (1 + draw(st.integers(1, 2**20)) * 2.0**-44)
    zy = draw(st.integers(-20, 20))
    lo = draw(st.sampled_from([-128, 0, -100]))
    rq = Requantize.choose([real], [bound], lo, 127, zero_point=zy, precise=True)
    # an exact multiplier keeps its single product; a split one with a part of 0 has one
    # product too (test_a_precise_requantise_with_a_zero_part_on_accel_is_llvms): two here
    assume(rq.split > 0 and all(int(h) != 0 and int(lo_) != 0 for h, lo_ in rq.parts))
    return kind, m, n, k, rq, draw(st.booleans()), draw(st.integers(0, 2**16)), draw(st.booleans())


@settings(max_examples=14)
@given(precise_cases())
def test_precise_requantise_on_accel_is_llvms(case):
    kind, m, n, k, rq, bias, seed, nchw = case
    _assert_on_accel_bit_exact(_model(kind, m, n, k, rq, bias, seed, nchw))


@settings(max_examples=10)
@given(kind=st.sampled_from(["matmul", "conv2d", "depthwise"]), zero=st.sampled_from(["high", "low"]),
       n=st.integers(1, 24), split=st.integers(4, 30), m=st.integers(1, 2**31 - 1), clamp=st.integers(2**8, 2**20),
       zy=st.integers(-20, 20), seed=st.integers(0, 2**16))
def test_a_precise_requantise_with_a_zero_part_on_accel_is_llvms(kind, zero, n, split, m, clamp, zy, seed):
    """A split multiplier whose high (or low) part is 0: ``emit_requantize`` leaves that product
    out (``x * 0`` would fold away and leave the epilogue nothing to read), and accel's epilogue
    runs what is left, bit for bit llvm's."""
    k = split
    m = m % (1 << k) if zero == "high" else (m >> k) << k
    assume(m > 0)
    rq = Requantize((np.int64(m),), k + 12, np.int64(clamp), -128, 127, zero_point=zy, split=k)
    try:
        rq.apply([np.array([clamp, -clamp])])       # every intermediate within int32
    except OverflowError:
        assume(False)
    k_in = n if kind == "depthwise" else 16
    # one product: no temporary (a multiplier of 1 may leave shifts alone, which the STORE's
    # epilogue takes without an accel.alu nest)
    _assert_on_accel_bit_exact(_model(kind, 4, n, k_in, rq, True, seed), alu=False)


def test_forty_eight_bit_multiplier_at_int32_limits():
    """The first convolution's case (few bits in one product): 48-bit multiplier, the
    accumulator clamped at its full reach, both products close to int32's limits."""
    rq = Requantize.choose([0.00087], [146_000], precise=True)
    assert rq.split > 0 and rq.shift >= 40
    acc_h, acc_l = rq.parts[0]
    assert 146_000 * abs(int(acc_h)) > 2**30 or 146_000 * abs(int(acc_l)) > 2**30
    _assert_on_accel_bit_exact(_model("conv2d", 5, 24, 16, rq, True, 3))


@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_convolution_integerised_precisely_runs_on_accel(per_channel):
    """A QDQ ONNX CNN integerised with ``precise=True``: its convolutions and matmul, requantise
    included, run on accel, bit for bit the integer module on llvm. With weights per channel
    every constant of the requantise is a vector, the low product's multiplier read by the
    temporary alone (staged in ACC for it: it was left on the CPU)."""
    pytest.importorskip("onnx")
    from tvm.relax.frontend.onnx import from_onnx

    from tirpat.testing import onnx_cnn

    model = onnx_cnn.conv_relu(seed=1)
    qdq = tp.quantize(model, onnx_cnn.calibration(model, 16), per_channel=per_channel)
    integer = tp.integerize(precise=True)(from_onnx(qdq, keep_params_in_input=False))
    xs = onnx_cnn.calibration(qdq, 2, seed=9)["x"]
    # quantize/dequantize stay on the host: the build's OffloadWarnings are expected
    compiled = assert_matches_llvm(integer, "accel, llvm", calls=len(xs), inputs=lambda call: [xs[call]])
    report = compiled.report.to_json()
    assert report["macs"]["accel"] == report["total_macs"] > 0, report["macs"]
    host_ops = {h["op"] for h in report["on_host"]}
    assert not host_ops & {"relax.multiply", "relax.right_shift", "relax.nn.conv2d", "relax.matmul"}, host_ops
    accel_parts = [p for p in report["partitions"] if p["backend"] == "accel"]
    assert accel_parts and all(p["fallback"] is None for p in accel_parts)
    assert any("relax.right_shift" in p["ops"] and p["ops"].count("relax.multiply") >= 2 for p in accel_parts)
    # each requantise on the ALU: none left to the CPU after the transpose back to NCHW
    macs = [p for p in accel_parts if p["macs"]]
    assert all("requantise" in p["epilogue"] and p["rules"].get("accel.alu", 0) >= 1 for p in macs), macs
    assert all("epilogue" not in why for p in macs for _, why in p["on_host"]), macs


@settings(max_examples=10)
@given(kind=st.sampled_from(["matmul", "conv2d", "depthwise"]), n=st.integers(1, 40),
       multiplier=st.integers(1, 15), shift=st.integers(1, 12), zy=st.integers(-20, 20), seed=st.integers(0, 2**16))
def test_round_half_to_even_requantise_on_accel_is_llvms(kind, n, multiplier, shift, zy, seed):
    """An exact multiplier rounds half to even: its form reads the value three times (floor,
    half, and the sum with their parity), two temporaries on accel."""
    rq = Requantize.choose([multiplier / 2**shift], [2**18], -128, 127, zero_point=zy)
    assume(rq.half_even)
    k = n if kind == "depthwise" else 12
    _assert_on_accel_bit_exact(_model(kind, 4, n, k, rq, True, seed, nchw=seed % 2 == 1))
