"""tp.integerize on the operators between int8 tensors that are not convolutions: activations
as 256-entry tables, multiply and subtract of two quantised tensors, nearest resize and the
element moves. Each is a small QDQ graph (scales and zero points drawn by hypothesis) whose
integerised module, compiled for llvm, is compared element by element with onnxruntime's
exact QDQ execution (``exact_session``, ORT_ENABLE_BASIC) on inputs that reach every int8
value: bit-exact where onnxruntime's float arithmetic is exact, within one step where it
approximates a transcendental function."""

import doctest
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tvm  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402
from tvm import relax  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.model.integerize import IntegerizeWarning, calls, pads, tables  # noqa: E402
from tirpat.testing.int_ranges import int32_overflows  # noqa: E402
from tirpat.testing.onnx_qdq import dequantized, qdq, qdq_model  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402
from integerize_checks import integerised  # noqa: E402


@pytest.mark.parametrize("module", [tables, pads])
def test_docstring_examples(module):
    assert doctest.testmod(module, extraglobs={"np": np}).failed == 0


# ----------------------------------------------------------------------------------------
# small QDQ graphs (tirpat.testing.onnx_qdq)
# ----------------------------------------------------------------------------------------
def every_int8(shape, scale: float, zero_point: int, rng) -> np.ndarray:
    """Float inputs that quantise to every int8 value (then random ones), saturation included."""
    q = rng.integers(-128, 128, int(np.prod(shape)))
    q[:256] = np.arange(-128, 128)[: min(256, q.size)]
    x = (q.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)
    return x.reshape(shape).astype(np.float32)


def op_names(mod) -> list[str]:
    return [str(c.op.name) for c in calls(mod["main"])]


def steps(model, mod, inputs: dict, out_scale: float) -> np.ndarray:
    """|ours - onnxruntime| in output steps, per element."""
    ref = exact_session(model).run(None, inputs)[0]
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    ours = vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()]).numpy()
    assert ours.shape == ref.shape
    return np.round(np.abs(ours.astype(np.float64) - ref) / np.float64(np.float32(out_scale)))


def assert_table_steps(diff: np.ndarray, exact: bool) -> None:
    """A table's output steps off onnxruntime (``diff``): none where onnxruntime's float
    arithmetic is ``exact``, else at most one, and at most 3% of the elements off."""
    if exact:
        assert diff.max() == 0, f"{int((diff > 0).sum())} elements differ"
    else:
        assert diff.max() <= 1 and np.mean(diff == 0) >= 0.97, (diff.max(), np.mean(diff == 0))


def integer_between(mod) -> None:
    """Only the input's quantize and the output's dequantize are float: nothing in between."""
    ops = op_names(mod)
    assert ops.count("relax.dequantize") == 1 and ops[-1] == "relax.dequantize", ops
    assert all(op == "relax.quantize" for op in ops[: ops.count("relax.quantize")]), ops
    assert int32_overflows(mod["main"]) == []


def scale(draw, around: float = 1.0, spread: float = 2.0) -> float:
    return float(np.float32(around * 10.0 ** draw(st.floats(-spread, spread))))


# ----------------------------------------------------------------------------------------
# activations as tables
# ----------------------------------------------------------------------------------------
#: activation -> (ONNX nodes from "xd" to "f" with their initialisers, opset, exact in float32)
def activation_nodes(name: str) -> tuple[list, list, bool]:
    c = lambda v, n: numpy_helper.from_array(np.array(v, np.float32), n)      # noqa: E731
    if name == "HardSwish":              # Paddle's export: x * relu6(x + 3) / 6
        return ([helper.make_node("Add", ["xd", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["r"]),
                 helper.make_node("Mul", ["xd", "r"], ["m"]), helper.make_node("Div", ["m", "six"], ["f"])],
                [c(3, "three"), c(0, "zero"), c(6, "six")], True)
    if name == "HardSigmoid":
        return [helper.make_node("HardSigmoid", ["xd"], ["f"], alpha=1 / 6, beta=0.5)], [], True
    if name == "GELU":                   # the Erf form exporters write
        return ([helper.make_node("Div", ["xd", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["xd", "p"], ["h"]),
                 helper.make_node("Mul", ["h", "half"], ["f"])],
                [c(np.sqrt(2), "sqrt2"), c(1, "one"), c(0.5, "half")], False)
    if name == "SiLU":
        return [helper.make_node("Sigmoid", ["xd"], ["s"]), helper.make_node("Mul", ["xd", "s"], ["f"])], [], True
    if name == "Sigmoid":                # computed as onnxruntime's MLAS kernel computes it
        return [helper.make_node("Sigmoid", ["xd"], ["f"])], [], True
    if name == "Div":
        return [helper.make_node("Div", ["xd", "k"], ["f"])], [c(6, "k")], True
    if name == "LeakyRelu":              # YOLOv3's and GANs' activation
        return [helper.make_node("LeakyRelu", ["xd"], ["f"], alpha=0.1)], [], True
    if name == "PRelu":                  # PyTorch's nn.PReLU(): one slope, shape [1]
        return [helper.make_node("PRelu", ["xd", "slope"], ["f"])], [c([0.25], "slope")], True
    if name == "Pow":                    # YOLOv5's box decoding: (2 * sigmoid(t)) ** 2, squared in float32
        return [helper.make_node("Pow", ["xd", "two"], ["f"])], [c(2, "two")], True
    return [helper.make_node(name, ["xd"], ["f"])], [], False


ACTIVATIONS = ["Sigmoid", "Tanh", "Exp", "HardSigmoid", "HardSwish", "GELU", "SiLU", "Div", "LeakyRelu", "PRelu"]


@st.composite
def table_sites(draw):
    name = draw(st.sampled_from(ACTIVATIONS))
    sx = scale(draw, 0.05)
    zx = draw(st.integers(-40, 40))
    sy = scale(draw, 0.02, 1.5)
    zy = draw(st.integers(-40, 40))
    return name, sx, zx, sy, zy, draw(st.integers(0, 2**16))


@settings(max_examples=16)
@given(table_sites())
def test_activation_is_a_table_like_onnxruntime(site):
    """Each activation becomes one ``take`` from a 256-entry int8 table: bit-exact with
    onnxruntime for float32 arithmetic, within one step (and almost always exact) for its
    approximations of sigmoid, tanh, exp and erf."""
    check_table(*site)


@pytest.mark.parametrize("name", ["LeakyRelu", "PRelu"])
def test_leaky_relu_and_prelu_of_one_slope_are_tables(name):
    """Operators with their slope as an attribute or a one-value input (TVM's nn.leakyrelu,
    nn.prelu) are tables too, bit-exact."""
    check_table(name, 0.05, 7, 0.03, -5, 3)


def test_pow_by_a_constant_is_a_table():
    """A Pow by a constant exponent (an operator of two operands, the exponent a constant
    scalar) is a table, bit-exact with onnxruntime."""
    check_table("Pow", 0.05, 7, 0.03, -5, 3)


def check_table(name: str, sx: float, zx: int, sy: float, zy: int, seed: int) -> None:
    shape = (1, 4, 8, 9)
    xq, xi = qdq("x", "xd", sx, zx)
    body, inits, exact = activation_nodes(name)
    yq, yi = qdq("f", "y", sy, zy)
    model = qdq_model(xq + body + yq, xi + inits + yi, {"x": shape}, shape)
    mod, declined = integerised(model)
    assert not declined
    assert "relax.take" in op_names(mod)
    integer_between(mod)
    assert_table_steps(steps(model, mod, {"x": every_int8(shape, sx, zx, np.random.default_rng(seed))}, sy), exact)


@settings(max_examples=12)
@given(st.floats(0.02, 0.3), st.floats(-7.0, -2.0), st.integers(-128, 127), st.integers(0, 2**16))
def test_sigmoid_table_is_onnxruntimes_at_tiny_output_scales(sx, log_sy, zy, seed):
    """A sigmoid quantised with a tiny step (ppocrv5_det's probability map: 1.3e-6) resolves
    onnxruntime's own approximation (its ``p / q + 0.5`` cancels near 0, off the true sigmoid by
    up to 1.8e-7): the table is its value, bit for bit, where the true function was steps off."""
    sy = float(np.float32(10.0 ** log_sy))
    shape = (1, 2, 8, 16)
    xq, xi = qdq("x", "xd", sx, 0)
    yq, yi = qdq("f", "y", sy, zy)
    model = qdq_model(xq + [helper.make_node("Sigmoid", ["xd"], ["f"])] + yq, xi + yi, {"x": shape}, shape)
    mod, declined = integerised(model)
    assert not declined and "relax.take" in op_names(mod)
    diff = steps(model, mod, {"x": every_int8(shape, sx, 0, np.random.default_rng(seed))}, sy)
    assert diff.max() == 0, f"{int((diff > 0).sum())} elements differ"


def test_table_is_exactly_the_quantised_function():
    """The table of a float function is round-half-even(f(dq(x)) / s_y) + z_y, saturated, for
    each of the 256 inputs (ties included: 0.5 steps round to the even neighbour)."""
    x = np.arange(-128, 128)
    table = tables.quantized_table(lambda v: v * np.float32(0.5), (1.0, 3), (1.0, -2))
    want = np.clip(np.round((x - 3) * 0.5) - 2, -128, 127)       # numpy rounds half to even
    assert np.array_equal(table, want)
    with pytest.raises(tables.Declined, match="NaN"):
        tables.quantized_table(np.log, (1.0, 0), (1.0, 0))


def declined_site(body: list, inits: list, inputs: dict) -> list:
    nodes = []
    for name in inputs:
        q, i = qdq(name, f"{name}d", 0.05, 0)
        nodes, inits = nodes + q, inits + i
    yq, yi = qdq("f", "y", 0.02, 0)
    model = qdq_model(nodes + body + yq, inits + yi, inputs, None)
    return integerised(model)


def test_a_table_declines_with_its_reason():
    """A function of two tensors and a constant that varies by element are no table: the
    site stays float, and the warning says why."""
    shape = (1, 4, 3, 3)
    body = [helper.make_node("Sigmoid", ["ad"], ["s"]), helper.make_node("Mul", ["s", "bd"], ["f"])]
    _, declined = declined_site(body, [], {"a": shape, "b": shape})
    assert len(declined) == 1 and "table: the float region reads two tensors" in declined[0]
    ramp = numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1), "ramp")
    body = [helper.make_node("Mul", ["ad", "ramp"], ["m"]), helper.make_node("Tanh", ["m"], ["f"])]
    _, declined = declined_site(body, [ramp], {"a": shape})
    assert len(declined) == 1 and "a constant of 4 different values" in declined[0]
    slopes = numpy_helper.from_array(np.array([0.1, 0.2, 0.3, 0.4], np.float32).reshape(4, 1, 1), "slopes")
    _, declined = declined_site([helper.make_node("PRelu", ["ad", "slopes"], ["f"])], [slopes], {"a": shape})
    assert len(declined) == 1 and "a PRelu with 4 different slopes (one table per channel)" in declined[0]


# ----------------------------------------------------------------------------------------
# two quantised tensors: multiply, subtract
# ----------------------------------------------------------------------------------------
@st.composite
def binary_sites(draw):
    op = draw(st.sampled_from(["Mul", "Sub", "Add"]))
    sa, sb = scale(draw, 0.05), scale(draw, 0.05)
    za, zb, zy = (draw(st.integers(-60, 60)) for _ in range(3))
    if op == "Mul":
        sy = scale(draw, sa * sb * 128, 1.0)
    else:
        sy = scale(draw, max(sa, sb), 1.0)
    broadcast = draw(st.booleans())              # a squeeze-excitation's [1, C, 1, 1] scale
    relu = draw(st.booleans())
    return op, sa, sb, za, zb, sy, zy, broadcast, relu, draw(st.integers(0, 2**16))


@settings(max_examples=12)
@given(binary_sites())
def test_two_quantised_tensors_within_one_step(site):
    """``dq(a) op dq(b)`` with different scales and zero points is int32 arithmetic with
    fixed-point rescales into the output's scale, never overflowing int32, within one step of
    onnxruntime."""
    op, sa, sb, za, zb, sy, zy, broadcast, relu, seed = site
    rng = np.random.default_rng(seed)
    shape = (1, 4, 8, 8)
    b_shape = (1, 4, 1, 1) if broadcast else shape
    aq, ai = qdq("a", "ad", sa, za)
    bq, bi = qdq("b", "bd", sb, zb)
    body = [helper.make_node(op, ["ad", "bd"], ["r" if relu else "f"])]
    if relu:
        body.append(helper.make_node("Relu", ["r"], ["f"]))
    yq, yi = qdq("f", "y", sy, zy)
    model = qdq_model(aq + bq + body + yq, ai + bi + yi, {"a": shape, "b": b_shape}, shape)
    mod, declined = integerised(model)
    assert not declined
    ops = op_names(mod)
    assert ops.count("relax.dequantize") == 1 and int32_overflows(mod["main"]) == []
    if op == "Mul":
        products = [c for c in calls(mod["main"]) if str(c.op.name) == "relax.multiply"
                    and all(str(a.ty.dtype) == "int32" and not isinstance(a, tvm.ir.Constant) for a in c.args)]
        assert products, ops
    inputs = {"a": every_int8(shape, sa, za, rng), "b": every_int8(b_shape, sb, zb, rng)}
    inputs["b"] = rng.permutation(inputs["b"].ravel()).reshape(b_shape)
    assert steps(model, mod, inputs, sy).max() <= 1


@settings(max_examples=10)
@given(st.sampled_from(["Mul", "Sub", "Add"]), st.integers(-128, 127), st.floats(0.001, 0.2), st.booleans(),
       st.booleans(), st.integers(-40, 40), st.integers(0, 2**16))
def test_a_quantised_constant_operand_is_a_table(op, c, sc, left, relu, zx, seed):
    """``dq(x) op dq(c)`` with a quantised scalar constant (onnxruntime quantises a Mul's or an
    Add's constant operand so) is a function of ``x`` alone: a table, bit-exact with onnxruntime."""
    shape = (1, 3, 5, 7)
    sx, sy = 0.03, 0.05
    xq, xi = qdq("x", "xd", sx, zx)
    body, consts = dequantized("cd", np.array([c], np.int8), sc)
    body += [helper.make_node(op, ["cd", "xd"] if left else ["xd", "cd"], ["r" if relu else "f"])]
    if relu:
        body.append(helper.make_node("Relu", ["r"], ["f"]))
    yq, yi = qdq("f", "y", sy, 0)
    model = qdq_model(xq + body + yq, xi + consts + yi, {"x": shape}, shape)
    mod, declined = integerised(model)
    assert not declined and "relax.take" in op_names(mod)
    integer_between(mod)
    assert steps(model, mod, {"x": every_int8(shape, sx, zx, np.random.default_rng(seed))}, sy).max() == 0


# ----------------------------------------------------------------------------------------
# element moves on int8
# ----------------------------------------------------------------------------------------
@settings(max_examples=6)
@given(st.sampled_from(["asymmetric", "half_pixel", "align_corners"]), st.sampled_from([2, 3]),
       st.integers(-50, 50), st.booleans(), st.integers(0, 2**16))
def test_nearest_resize_moves_int8_elements(mode, factor, zx, rescale, seed):
    """A nearest resize gives each output one input element: it runs on int8 (then a rescale
    if the output's scale differs), bit-exact."""
    shape, out = (1, 3, 4, 5), (1, 3, 4 * factor, 5 * factor)
    sx = 0.03
    sy = 0.045 if rescale else sx
    xq, xi = qdq("x", "xd", sx, zx)
    yq, yi = qdq("f", "y", sy, zx)
    scales = numpy_helper.from_array(np.array([1, 1, factor, factor], np.float32), "scales")
    body = [helper.make_node("Resize", ["xd", "", "scales"], ["f"], mode="nearest",
                             coordinate_transformation_mode=mode, nearest_mode="floor")]
    model = qdq_model(xq + body + yq, xi + [scales] + yi, {"x": shape}, out)
    mod, declined = integerised(model)
    assert not declined
    resize = [c for c in calls(mod["main"]) if str(c.op.name) == "relax.image.resize2d"]
    assert len(resize) == 1 and str(resize[0].args[0].ty.dtype) == "int8"
    integer_between(mod)
    x = every_int8(shape, sx, zx, np.random.default_rng(seed))
    diff = steps(model, mod, {"x": x}, sy)
    assert diff.max() <= (1 if rescale else 0)


def test_linear_resize_is_declined_with_its_reason():
    shape = (1, 2, 4, 4)
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    _, declined = declined_site([helper.make_node("Resize", ["ad", "", "scales"], ["f"], mode="linear")],
                                [scales], {"a": shape})
    assert len(declined) == 1 and "a linear resize (interpolation" in declined[0]


@settings(max_examples=6)
@given(st.integers(1, 3), st.integers(1, 3), st.booleans(), st.integers(-50, 50), st.integers(0, 2**16))
def test_split_transpose_reshape_concat_stay_int8(first, second, rescale, zx, seed):
    """A split, a transpose, a reshape and a concat only move elements: at one scale they run
    on int8 and the result is bit-exact; where a part's scale differs it is requantised
    (within one step)."""
    channels = first + second
    shape = (1, channels, 4, 6)
    sx = 0.04
    sb = 0.055 if rescale else sx
    xq, xi = qdq("x", "xd", sx, zx)
    aq, ai = qdq("a", "ad", sx, zx)
    bq, bi = qdq("t", "td", sb, zx)
    yq, yi = qdq("c", "y", sx, zx)
    sizes = numpy_helper.from_array(np.array([first, second], np.int64), "sizes")
    flat = numpy_helper.from_array(np.array([1, second, 4, 6], np.int64), "flat")
    body = [helper.make_node("Split", ["xd", "sizes"], ["a", "b"], axis=1),
            helper.make_node("Transpose", ["b"], ["bt"], perm=[0, 1, 3, 2]),
            helper.make_node("Reshape", ["bt", "flat"], ["t"])]
    body2 = [helper.make_node("Concat", ["ad", "td"], ["c"], axis=1)]
    model = qdq_model(xq + body + aq + bq + body2 + yq, xi + [sizes, flat] + ai + bi + yi, {"x": shape}, shape)
    mod, declined = integerised(model)
    assert not declined
    ops = op_names(mod)
    assert {"relax.split", "relax.permute_dims", "relax.reshape", "relax.concat"} <= set(ops)
    integer_between(mod)
    diff = steps(model, mod, {"x": every_int8(shape, sx, zx, np.random.default_rng(seed))}, sx)
    assert diff.max() <= (1 if rescale else 0)


@settings(max_examples=6)
@given(st.lists(st.integers(0, 2), min_size=4, max_size=4), st.integers(-30, 30),
       st.sampled_from(["constant", "reflect", "edge"]), st.integers(0, 2**16))
def test_a_pad_before_a_convolution_pads_the_int8_tensor(pads, zx, mode, seed):
    """An ONNX Pad (imported as a TOPI call_tir) with 0.0 before a Conv: the int8 tensor is
    padded with its zero point, and the convolution is integer, within one step; a reflect or
    edge Pad (CycleGAN's and segmentation models' ReflectionPad2d) moves the int8 elements."""
    rng = np.random.default_rng(seed)
    shape = (1, 3, 6, 5)
    top, left, bottom, right = pads
    out = (1, 4, 6 + top + bottom - 1, 5 + left + right - 1)
    sx, sw, sy = 0.03, 0.02, 0.01
    w = rng.integers(-127, 128, (4, 3, 2, 2)).astype(np.int8)
    xq, xi = qdq("x", "xd", sx, zx)
    yq, yi = qdq("c", "y", sy, 0)
    wq, wi = dequantized("w", w, sw)
    inits = [numpy_helper.from_array(np.array([0, 0, top, left, 0, 0, bottom, right], np.int64), "pads")] + wi
    body = [helper.make_node("Pad", ["xd", "pads"], ["p"], mode=mode)] + wq + [
        helper.make_node("Conv", ["p", "w"], ["c"], kernel_shape=[2, 2])]
    model = qdq_model(xq + body + yq, xi + inits + yi, {"x": shape}, out)
    mod, declined = integerised(model)
    assert not declined
    assert "relax.call_tir" not in op_names(mod)
    convs = [c for c in calls(mod["main"]) if str(c.op.name) == "relax.nn.conv2d"]
    assert len(convs) == 1 and str(convs[0].args[0].ty.dtype) == "int8"
    integer_between(mod)
    assert steps(model, mod, {"x": every_int8(shape, sx, zx, rng)}, sy).max() <= 1


def test_pad_of_reads_widths_and_value():
    x = np.arange(1.0, 13.0).reshape(3, 4)
    assert padded_pad_of(x, [(2, 0), (1, 3)], 0.0) == ([2, 1], [0, 3], 0.0)
    assert padded_pad_of(x, [(0, 1), (0, 0)], -2.5) == ([0, 0], [1, 0], -2.5)
    assert pads.pad_of(x, np.flip(x)) is None                            # moved, not padded
    assert pads.pad_of(x, np.pad(x, 1, mode="edge")) is None             # not one constant
    assert pads.moved_pad_of(x, np.pad(x, [(1, 2), (0, 1)], mode="edge")) == ([1, 0], [2, 1], "edge")
    assert pads.moved_pad_of(x, np.pad(x, [(2, 0), (3, 3)], mode="reflect")) == ([2, 3], [0, 3], "reflect")
    assert pads.moved_pad_of(x, np.pad(x, 1, constant_values=0.0)) is None


def padded_pad_of(x, widths, value):
    """:func:`pads.pad_of` of ``x`` padded by numpy."""
    return pads.pad_of(x, np.pad(x, widths, constant_values=value))


def test_a_pad_with_a_value_off_the_scale_is_declined():
    shape = (1, 2, 4, 4)
    inits = [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
             numpy_helper.from_array(np.array(0.013, np.float32), "value")]
    _, declined = declined_site([helper.make_node("Pad", ["ad", "pads", "value"], ["f"])], inits, {"a": shape})
    assert len(declined) == 1 and "pad: a pad with 0.013" in declined[0] and "not a value of the int8" in declined[0]


@settings(max_examples=6)
@given(st.sampled_from(["Div", "Sigmoid", "HardSigmoid"]), st.integers(-40, 40), st.booleans(), st.integers(0, 2**16))
def test_a_max_pool_after_a_monotone_function_pools_the_int8_input(name, zx, transpose, seed):
    """``q(max_pool(f(dq(x))))`` (PaddleOCR's classifier divides by 6, then pools): a monotone
    ``f`` commutes with the maximum, so the table runs on ``x`` (after its producer, where
    accel's LUT takes it) and the pool (and any element move) on the table's int8 output; the result is onnxruntime's, within one step (exactly for arithmetic ``f``)."""
    shape = (1, 3, 6, 8)
    sx, sy = 0.04, 0.011
    xq, xi = qdq("x", "xd", sx, zx)
    body, inits, exact = activation_nodes(name)
    body = body + [helper.make_node("MaxPool", ["f"], ["p"], kernel_shape=[2, 2], strides=[2, 2])]
    last = "p"
    if transpose:
        body.append(helper.make_node("Transpose", ["p"], ["t"], perm=[0, 1, 3, 2]))
        last = "t"
    yq, yi = qdq(last, "y", sy, 0)
    out = (1, 3, 4, 3) if transpose else (1, 3, 3, 4)
    model = qdq_model(xq + body + yq, xi + inits + yi, {"x": shape}, out)
    mod, declined = integerised(model)
    assert not declined
    pools = [c for c in calls(mod["main"]) if str(c.op.name) == "relax.nn.max_pool2d"]
    assert len(pools) == 1 and str(pools[0].args[0].ty.dtype) == "int8" and "relax.take" in op_names(mod)
    assert op_names(mod).index("relax.take") < op_names(mod).index("relax.nn.max_pool2d")
    integer_between(mod)
    diff = steps(model, mod, {"x": every_int8(shape, sx, zx, np.random.default_rng(seed))}, sy)
    assert diff.max() <= (0 if exact else 1)


def test_a_max_pool_after_a_function_that_is_not_monotone_is_declined():
    shape = (1, 2, 4, 4)
    body = [helper.make_node("Mul", ["ad", "ad"], ["s"]),
            helper.make_node("MaxPool", ["s"], ["f"], kernel_shape=[2, 2], strides=[2, 2])]
    _, declined = declined_site(body, [], {"a": shape})
    assert len(declined) == 1 and "a maximum of a function that is not monotone" in declined[0]


# ----------------------------------------------------------------------------------------
# a function of x quantised inside: x * q(HardSigmoid(x)), MobileNetV3's HardSwish
# ----------------------------------------------------------------------------------------
@settings(max_examples=12)
@given(st.sampled_from(["HardSigmoid", "Sigmoid"]), st.floats(-1.5, 1.5), st.integers(-40, 40),
       st.floats(-1.5, 1.5), st.integers(-40, 40), st.integers(-40, 40), st.booleans(), st.integers(0, 2**16))
def test_x_times_a_quantised_table_of_x_is_one_table(name, lsx, zx, lsy, zh, zy, mul_first, seed):
    """``q(dq(x) * dq(q(g(dq(x)))))`` (a QDQ export of HardSwish or SiLU: the gate is quantised
    before the multiply) is a function of the int8 ``x`` alone: one ``take``, no product of two
    tensors, equal to onnxruntime's exact run (its HardSigmoid is float32 arithmetic; its
    sigmoid an approximation, within one step)."""
    shape = (1, 4, 8, 9)
    sx, sy = float(np.float32(0.05 * 10**lsx)), float(np.float32(0.02 * 10**lsy))
    xq, xi = qdq("x", "xd", sx, zx)
    gate, _, exact = activation_nodes(name)
    hq, hi = qdq("f", "hd", 1 / 255 if name == "HardSigmoid" else 1 / 250, zh)
    operands = ["xd", "hd"] if mul_first else ["hd", "xd"]
    mul = [helper.make_node("Mul", operands, ["m"])]
    yq, yi = qdq("m", "y", sy, zy)
    model = qdq_model(xq + gate + hq + mul + yq, xi + hi + yi, {"x": shape}, shape)
    mod, declined = integerised(model)
    assert not declined
    ops = op_names(mod)
    assert ops.count("relax.take") == 1 and "relax.multiply" not in ops, ops
    integer_between(mod)
    assert_table_steps(steps(model, mod, {"x": every_int8(shape, sx, zx, np.random.default_rng(seed))}, sy), exact)


def test_a_quantised_gate_of_another_tensor_stays_a_product():
    """``dq(a) * dq(q(HardSigmoid(dq(b))))`` reads two tensors: no table, the product of two
    int8 tensors, and no warning (the table rule that runs first declines in silence)."""
    shape = (1, 2, 4, 4)
    gate, _, _ = activation_nodes("HardSigmoid")
    gate = [helper.make_node("HardSigmoid", ["bd"], ["g"], alpha=1 / 6, beta=0.5)]
    gq, gi = qdq("g", "gd", 1 / 255, 0)
    body = gate + gq + [helper.make_node("Mul", ["ad", "gd"], ["f"])]
    mod, declined = declined_site(body, gi, {"a": shape, "b": shape})
    assert not declined
    ops = op_names(mod)
    assert ops.count("relax.take") == 1 and "relax.multiply" in ops, ops


@settings(max_examples=8)
@given(st.integers(0, 2**16), st.floats(0.01, 0.2), st.integers(-30, 30), st.booleans())
def test_a_table_of_a_table_is_one_table(seed, s, z, shared):
    """``q(g(dq(take(t, x + 128))))``: a table after an earlier rule's table lookup is one
    lookup of ``x`` with the composed table, the same integers as the two lookups (llvm runs
    the module before and after); when the first lookup has another user, both stay (folding
    would only read ``x`` twice)."""
    rng = np.random.default_rng(seed)
    first = rng.integers(-128, 128, 256).astype(np.int8)
    x = relax.Var("x", relax.TensorType((2, 128), "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(tables.emit_table(x, first))
            d = bb.emit(relax.op.dequantize(t, relax.const(s, "float32"), relax.const(z, "int8")))
            g = bb.emit(relax.op.clip(relax.op.add(relax.op.multiply(d, relax.const(1 / 6, "float32")),
                                                   relax.const(0.5, "float32")), 0, 1))
            y = bb.emit(relax.op.quantize(g, relax.const(1 / 255, "float32"), relax.const(-128, "int8")))
            out = bb.emit_output(relax.Tuple([y, t]) if shared else y)
        bb.emit_func_output(out)
    before = bb.get()
    with warnings.catch_warnings():
        warnings.simplefilter("error", IntegerizeWarning)
        after = tp.integerize()(before)
    takes = [c for c in calls(after["main"]) if str(c.op.name) == "relax.take"]
    assert len(takes) == (2 if shared else 1)
    params = after["main"].params
    reads_of_x = [c for c in calls(after["main"]) if any(a.same_as(params[0]) for a in c.args)]
    assert len(reads_of_x) == 1, reads_of_x
    if not shared:
        assert "relax.dequantize" not in op_names(after)
    xs = np.arange(-128, 128).astype(np.int8).reshape(2, 128)
    run = lambda mod: relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](tvm.runtime.tensor(xs))  # noqa: E731
    want, got = run(before), run(after)
    if shared:
        want, got = want[0], got[0]
    assert np.array_equal(want.numpy(), got.numpy())
