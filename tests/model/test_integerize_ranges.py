"""tp.integerize never overflows int32: an interval analysis of the integerised module
(``tirpat.testing.int_ranges``) bounds every int32 intermediate of the requantise, the
residual add and the pooling arithmetic for worst-case int8 inputs, on QDQ models whose
scales hypothesis draws (ratios from 1e-6 to 1e6 included); the same modules, compiled for
llvm, stay within one output step of onnxruntime's exact QDQ execution (graph optimisation
at ORT_ENABLE_BASIC: no fused int8 kernels)."""

import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import tvm  # noqa: E402
from onnx import helper  # noqa: E402
from tvm import relax  # noqa: E402

from tirpat.model.integerize import Requantize, calls, emit_requantize  # noqa: E402
from tirpat.testing import int8_models, int_ranges  # noqa: E402
from tirpat.testing.int_ranges import int32_overflows  # noqa: E402
from tirpat.testing.onnx_qdq import dequantized, qdq, qdq_model  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402
from integerize_checks import integerised  # noqa: E402


def test_docstring_examples():
    for module in (int_ranges, int8_models):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0


# ----------------------------------------------------------------------------------------
# the analysis itself
# ----------------------------------------------------------------------------------------
@settings(max_examples=25)
@given(st.integers(0, 2**32 - 1))
def test_analysis_agrees_with_the_generator(seed):
    """Models generated without overflow have none; where the analysis finds one, the
    generator made a product or a narrowing that may wrap (it bounds each layer's input by
    all of int8, the analysis by what the layer before can give: it may find less)."""
    safe = int8_models.random_int8_model(seed, overflow=False)
    assert int32_overflows(safe.mod["main"]) == [], safe.describe()
    risky = int8_models.random_int8_model(seed, overflow=True)
    assert risky.wraps or not int32_overflows(risky.mod["main"]), risky.describe()


@pytest.mark.parametrize("seed", [5, 21, 132430])
def test_analysis_finds_the_products_that_wrap(seed):
    model = int8_models.random_int8_model(seed, overflow=True)
    found = int32_overflows(model.mod["main"])
    assert model.wraps and "relax.multiply" in {op for _, op, _, _ in found}, (found, model.describe())


def test_analysis_bounds_what_llvm_computes():
    """The bounds hold: llvm's results on extreme inputs lie within them, for every binding."""
    model = int8_models.random_int8_model(3, overflow=False)
    func = model.mod["main"]
    ranges = int_ranges.int_ranges(func)
    out = ranges[func.body.body]
    vm = relax.VirtualMachine(tvm.compile(model.mod, "llvm"), tvm.cpu())
    for x in (np.full(model.input_shape, -128, np.int8), np.full(model.input_shape, 127, np.int8), model.inputs()):
        y = vm["main"](tvm.runtime.tensor(x)).numpy().astype(np.int64)
        assert np.all(y >= out.lo.astype(np.int64)) and np.all(y <= out.hi.astype(np.int64))


@pytest.mark.parametrize("precise", [False, True])
@pytest.mark.parametrize("real", [2.0**-31, 3 * 2.0**-31, 2.0**-30, 0.75, 1e-9])
def test_requantise_shifts_stay_below_32(real, precise):
    """An exact multiplier first exact at the largest shift rounds half up: the parity of
    rounding half to even would read v >> 32 (undefined for int32); the precise form's two
    shifts stay below 32 too."""
    rq = Requantize.choose([real], [2**30 - 1], precise=precise)
    x = relax.Var("acc", relax.TensorType((5,), "int32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(emit_requantize([x], rq))
        bb.emit_func_output(y)
    func = bb.get()["main"]
    assert int32_overflows(func, {"acc": (-(2**30) + 1, 2**30 - 1)}) == []     # ValueError for a shift >= 32
    acc = np.array([-(2**30) + 1, -12345, 0, 2**29 + 3, 2**30 - 1], np.int32)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), "llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(acc)).numpy()
    np.testing.assert_array_equal(got, rq.apply([acc]))
    assert np.all(np.abs(got - np.clip(np.round(acc * real), -128, 127)) <= 1)


# ----------------------------------------------------------------------------------------
# integerised QDQ operators, with the scales drawn
# ----------------------------------------------------------------------------------------
def session(model):
    return exact_session(model)


def scale(draw, around: float = 1.0, spread: float = 6.0) -> float:
    """A scale 10**u times ``around``, ``u`` in [-spread, spread]: extreme ratios included."""
    return float(np.float32(around * 10.0 ** draw(st.floats(-spread, spread))))


def check(model, inputs: dict, out_scale: float, integer_op: str, precise: bool):
    """No int32 intermediate can overflow for any int8 values; within one output step of
    onnxruntime; the operator is integer arithmetic unless integerize said why not. ``precise``:
    ``tp.integerize(precise=True)``'s two products per requantise."""
    mod, declined = integerised(model, precise)
    func = mod["main"]
    assert int32_overflows(func) == []
    ops = [str(c.op.name) for c in calls(func)]
    assert declined or integer_op in ops and ops.count("relax.dequantize") == 1, (ops, declined)
    ref = session(model).run(None, inputs)[0]
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    ours = vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()]).numpy()
    steps = np.round(np.abs(ours.astype(np.float64) - ref.astype(np.float64)) / np.float64(np.float32(out_scale)))
    assert steps.max() <= 1, f"{steps.max()} steps"
    return ops


def extremes(rng, shape, s: float) -> np.ndarray:
    """Float inputs that quantise to every int8 value, the extremes and saturation included."""
    q = rng.integers(-140, 141, shape).astype(np.float64)
    q.flat[:2] = [-1000, 1000][: q.size]
    return (q * s).astype(np.float32)


@st.composite
def conv_sites(draw):
    cin, cout = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    k = draw(st.sampled_from([1, 3]))
    sx = scale(draw, 1.0, 3.0)
    per_channel = draw(st.booleans())
    sw = [scale(draw, 1e-2, 3.0) for _ in range(cout if per_channel else 1)]
    sy = scale(draw, sx * sw[0] * k * k * cin * 64)        # around the accumulator's scale: ratios to 1e+-6
    relu = draw(st.booleans())
    return cin, cout, k, sx, sw, sy, relu, draw(st.integers(0, 2**16))


@settings(max_examples=10)
@given(conv_sites(), st.booleans())
def test_conv_requantise_never_overflows(site, precise):
    cin, cout, k, sx, sw, sy, relu, seed = site
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (cout, cin, k, k)).astype(np.int8)
    w.flat[0] = -128                                   # the worst case is in the weights
    sw = np.array(sw, np.float32)
    sb = (np.float32(sx) * sw).astype(np.float32)
    b = rng.integers(-(2**20), 2**20, cout).astype(np.int32)
    axis = 0 if sw.size > 1 else None
    sw, sb = (v if v.size > 1 else v.reshape(()) for v in (sw, sb))
    xq, xi = qdq("x", "xd", sx)
    (wq, wi), (bq, bi) = dequantized("w", w, sw, axis=axis), dequantized("b", b, sb, axis=axis)
    nodes = xq + wq + bq + [helper.make_node("Conv", ["xd", "w", "b"], ["c"], kernel_shape=[k, k], pads=[k // 2] * 4)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
    yq, yi = qdq("r" if relu else "c", "y", sy)
    model = qdq_model(nodes + yq, xi + wi + bi + yi, {"x": (1, cin, 5, 5)}, (1, cout, 5, 5))
    check(model, {"x": extremes(rng, (1, cin, 5, 5), sx)}, sy, "relax.nn.conv2d", precise)


@st.composite
def add_sites(draw):
    sa = scale(draw, 1.0, 3.0)
    sb = scale(draw, sa)
    sy = scale(draw, max(sa, sb), 3.0)
    return sa, sb, sy, draw(st.booleans()), draw(st.integers(0, 2**16))


@settings(max_examples=10)
@given(add_sites(), st.booleans())
def test_residual_add_never_overflows(site, precise):
    """Both operands rescaled to a common fixed point, summed in int32: the sum of the two
    worst-case terms and the rounding stays within int32 whatever the scale ratios."""
    sa, sb, sy, relu, seed = site
    rng = np.random.default_rng(seed)
    (aq, ai), (bq, bi) = qdq("a", "ad", sa), qdq("b", "bd", sb)
    nodes = aq + bq + [helper.make_node("Add", ["ad", "bd"], ["s"])]
    if relu:
        nodes.append(helper.make_node("Relu", ["s"], ["r"]))
    yq, yi = qdq("r" if relu else "s", "y", sy)
    model = qdq_model(nodes + yq, ai + bi + yi, {"a": (2, 3, 4), "b": (2, 3, 4)}, (2, 3, 4))
    inputs = {"a": extremes(rng, (2, 3, 4), sa), "b": extremes(rng, (2, 3, 4), sb)}
    inputs["b"].flat[:2] = inputs["b"].flat[1::-1].copy()     # -128 + 127 and 127 + -128 as well as equal signs
    check(model, inputs, sy, "relax.add", precise)


@st.composite
def pool_sites(draw):
    k = draw(st.integers(2, 4))
    stride = draw(st.integers(1, k))
    pad = draw(st.integers(0, k - 1))
    sx = scale(draw, 1.0, 3.0)
    same = draw(st.booleans())
    sy = sx if same else scale(draw, sx)
    return k, stride, pad, sx, sy, draw(st.booleans()), draw(st.integers(0, 2**16))


@settings(max_examples=8)
@given(pool_sites(), st.booleans())
def test_average_pool_never_overflows(site, precise):
    k, stride, pad, sx, sy, include, seed = site
    rng = np.random.default_rng(seed)
    size = 8
    out = (size + 2 * pad - k) // stride + 1
    (xq, xi), (yq, yi) = qdq("x", "xd", sx), qdq("p", "y", sy)
    pool = helper.make_node("AveragePool", ["xd"], ["p"], kernel_shape=[k, k], strides=[stride, stride],
                            pads=[pad] * 4, count_include_pad=int(include))
    model = qdq_model(xq + [pool] + yq, xi + yi, {"x": (1, 2, size, size)}, (1, 2, out, out))
    check(model, {"x": extremes(rng, (1, 2, size, size), sx)}, sy, "relax.sum" if (k == stride and not pad
          and size % k == 0) else "relax.nn.conv2d", precise)
