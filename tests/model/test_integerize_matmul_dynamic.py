"""tp.integerize on a matmul of two quantised activations (attention's ``Q K^T`` and
``softmax V``): both operands are DequantizeLinear of int8 tensors computed at run time.

The integer core is ``sum (a - z_a)(b - z_b)`` in int32 (an int8 x int8 matmul, the zero
points as row and column sums). Followed by a QuantizeLinear it is requantised: bit-exact with
the numpy evaluation of the same fixed-point requantise, and within one step of onnxruntime's
exact QDQ run. Read by float code it is dequantised (times float32 ``s_a s_b``): within float32
rounding of onnxruntime's float matmul. Small QDQ graphs, shapes, scales and zero points drawn
by hypothesis, compiled for llvm."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tvm  # noqa: E402
from onnx import helper  # noqa: E402
from tvm import relax  # noqa: E402

from tirpat.model.integerize import calls  # noqa: E402
from tirpat.model.integerize.fixed_point import Requantize  # noqa: E402
from tirpat.testing.int_ranges import int32_overflows  # noqa: E402
from tirpat.testing.onnx_qdq import qdq, qdq_model  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402
from integerize_checks import integerised  # noqa: E402


def attention_matmul(a_shape, b_shape, transposed: bool, qa, qb, qy=None):
    """``MatMul(dq(q(a)), [Transpose](dq(q(b))))``, then ``q``/``dq`` at ``qy`` when given
    (the int8-out form), else the float product is the output (the float form)."""
    nodes, inits = [], []
    for name, (s, z) in (("a", qa), ("b", qb)):
        n, i = qdq(name, f"{name}d", s, z)
        nodes += n
        inits += i
    rhs = "bd"
    if transposed:
        perm = list(range(len(b_shape)))
        perm[-2:] = perm[-1], perm[-2]
        nodes.append(helper.make_node("Transpose", ["bd"], ["bt"], perm=perm))
        rhs = "bt"
    nodes.append(helper.make_node("MatMul", ["ad", rhs], ["mm" if qy else "y"]))
    if qy:
        n, i = qdq("mm", "y", *qy)
        nodes += n
        inits += i
    return qdq_model(nodes, inits, {"a": a_shape, "b": b_shape}, None)


def integers(shape, zero_point: int, rng) -> np.ndarray:
    """int8 values, every one of them where the tensor is large enough (saturation included)."""
    q = rng.integers(-128, 128, int(np.prod(shape)))
    q[: min(256, q.size)] = rng.permutation(np.arange(-128, 128))[: min(256, q.size)]
    return q.reshape(shape).astype(np.int64)


def run(mod, *inputs) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(v) for v in inputs]).numpy()


def integer_matmuls(mod) -> list:
    """The matmuls of ``mod``: each must be int8 x int8 -> int32."""
    found = [c for c in calls(mod["main"]) if str(c.op.name) == "relax.matmul"]
    for c in found:
        assert str(c.ty.dtype) == "int32", c
    return found


def scale(draw, around: float) -> float:
    return float(np.float32(around * 10.0 ** draw(st.floats(-1.5, 1.5))))


@st.composite
def sites(draw):
    batch = draw(st.lists(st.integers(1, 3), min_size=0, max_size=2))
    m, k, n = draw(st.integers(1, 24)), draw(st.integers(1, 48)), draw(st.integers(1, 24))
    transposed = draw(st.booleans())
    a_shape = (*batch, m, k)
    b_shape = (*batch, n, k) if transposed else (*batch, k, n)
    qa = (scale(draw, 0.05), draw(st.integers(-60, 60)))
    qb = (scale(draw, 0.05), draw(st.integers(-60, 60)))
    qy = (scale(draw, 0.05 * 0.05 * np.sqrt(k) * 60), draw(st.integers(-60, 60)))
    return a_shape, b_shape, transposed, qa, qb, qy, draw(st.integers(0, 2**16))


def operands(a_shape, b_shape, qa, qb, seed):
    rng = np.random.default_rng(seed)
    ia, ib = integers(a_shape, qa[1], rng), integers(b_shape, qb[1], rng)
    # float inputs that QuantizeLinear maps back to exactly these integers
    a = ((ia - qa[1]).astype(np.float32) * np.float32(qa[0])).astype(np.float32)
    b = ((ib - qb[1]).astype(np.float32) * np.float32(qb[0])).astype(np.float32)
    return ia, ib, a, b


@settings(max_examples=10)
@given(sites())
def test_requantised_matmul_of_activations_is_exact(site):
    """int8 out: the integer module equals the numpy fixed-point evaluation bit for bit, and
    onnxruntime's exact QDQ run within one step (equal on nearly every element)."""
    a_shape, b_shape, transposed, qa, qb, qy, seed = site
    model = attention_matmul(a_shape, b_shape, transposed, qa, qb, qy)
    mod, warned = integerised(model)
    assert not warned, warned
    assert len(integer_matmuls(mod)) == 1
    assert int32_overflows(mod["main"]) == []
    ia, ib, a, b = operands(a_shape, b_shape, qa, qb, seed)
    ours = run(mod, a, b)
    q_ours = np.rint(ours / np.float32(qy[0])).astype(np.int64) + qy[1]

    centred_b = ib - qb[1]
    if transposed:
        centred_b = np.swapaxes(centred_b, -1, -2)
    acc = np.matmul(ia - qa[1], centred_b)
    k = a_shape[-1]
    real = np.float64(np.float32(qa[0])) * np.float64(np.float32(qb[0])) / np.float64(np.float32(qy[0]))
    rq = Requantize.choose([real], [k * (128 + abs(qa[1])) * (128 + abs(qb[1]))], -128, 127, zero_point=qy[1],
                            precise=True)     # integerize's default form
    np.testing.assert_array_equal(q_ours, rq.apply([acc]))

    ref = exact_session(model).run(None, {"a": a, "b": b})[0]
    steps = np.abs(np.rint((ours.astype(np.float64) - ref) / np.float64(np.float32(qy[0]))))
    assert steps.max() <= 1
    # a step off onnxruntime only next to a rounding tie of the real value, where the
    # fixed-point multiplier's error (a few thousandths of a step at most) decides the side
    real_steps = acc * real
    to_tie = np.abs(real_steps - np.floor(real_steps) - 0.5)
    assert np.all(to_tie[steps != 0] < 1 / 64), to_tie[steps != 0]


@settings(max_examples=10)
@given(sites())
def test_dequantised_matmul_of_activations_is_the_float_one(site):
    """Float out (what a softmax reads): an integer matmul times ``s_a s_b``, within float32
    rounding of onnxruntime's float matmul of the dequantized operands."""
    a_shape, b_shape, transposed, qa, qb, _, seed = site
    model = attention_matmul(a_shape, b_shape, transposed, qa, qb)
    mod, warned = integerised(model)
    assert not warned, warned
    assert len(integer_matmuls(mod)) == 1
    assert "relax.dequantize" not in [str(c.op.name) for c in calls(mod["main"])]
    ia, ib, a, b = operands(a_shape, b_shape, qa, qb, seed)
    ours = run(mod, a, b)
    ref = exact_session(model).run(None, {"a": a, "b": b})[0]
    assert ours.shape == ref.shape and ours.dtype == np.float32
    magnitude = np.matmul(np.abs(a).astype(np.float64),
                          np.abs(np.swapaxes(b, -1, -2) if transposed else b).astype(np.float64))
    k = a_shape[-1]
    # float32's relative error (2**-24) on each of ~k + 2 roundings of the float sum, and ours'
    np.testing.assert_array_less(np.abs(ours.astype(np.float64) - ref), (k + 4) * 2.0**-23 * magnitude + 1e-30)


def test_a_reduction_too_long_for_int32_stays_float_and_says_why():
    """``K (128 + |z_a|)(128 + |z_b|)`` past int32: the site stays float, named with its reason."""
    k = 50_000
    model = attention_matmul((1, k), (k, 1), False, (0.01, 100), (0.01, -100), (1.0, 0))
    mod, warned = integerised(model)
    assert len(warned) == 1 and "matmul" in warned[0]
    assert "the int32 accumulator could overflow (a reduction of 50000 products of int8 tensors)" in warned[0]
    assert [str(c.ty.dtype) for c in calls(mod["main"]) if str(c.op.name) == "relax.matmul"] == ["float32"]
