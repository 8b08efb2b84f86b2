"""tp.integerize(): QDQ Relax -> integer arithmetic, checked against onnxruntime's run of the
same QDQ model (quantised by the real onnxruntime here), with the fixed-point requantise
checked against exact rational arithmetic."""

import doctest
import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tvm  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.dpl import is_op, wildcard  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.model import integerize as integerize_package  # noqa: E402
from tirpat.model.integerize import IntegerizeWarning, Requantize, calls, fixed_point, requantize_pattern, rules  # noqa: E402
from tirpat.testing import onnx_cnn  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402
from integerize_checks import exact_round  # noqa: E402


# ----------------------------------------------------------------------------------------
# the fixed-point requantise against exact arithmetic
# ----------------------------------------------------------------------------------------


@st.composite
def requantise_cases(draw):
    real = draw(st.floats(1e-6, 4.0))
    bound = draw(st.integers(1, 2**31 - 1))
    lo = draw(st.sampled_from([-128, 0, -20]))
    hi = draw(st.sampled_from([127, 6, 100]))
    accs = draw(st.lists(st.integers(-bound, bound), min_size=1, max_size=20))
    return real, bound, lo, hi, np.array(accs + [bound, -bound], dtype=np.int64)


@given(requantise_cases())
def test_requantise_is_its_formula_and_never_overflows(case):
    real, bound, lo, hi, accs = case
    rq = Requantize.choose([real], [bound], lo, hi)
    got = rq.apply([accs])                       # raises OverflowError on any int32 overflow
    m = int(rq.multipliers[0])
    for acc, y in zip(accs.tolist(), got.tolist()):
        # the clamp never changes the result: the same formula on the unclamped accumulator
        fixed = exact_round(Fraction(acc * m, 2**rq.shift), rq.half_even)
        assert y == min(max(fixed, lo), hi)
        # and the result is the correctly rounded real product up to the multiplier's error
        exact = Fraction(acc) * Fraction(real)
        err = abs(Fraction(acc) * (Fraction(m, 2**rq.shift) - Fraction(real)))
        nearest = min(max(round(exact), lo), hi)
        assert abs(y - nearest) <= 1
        if abs(exact - exact.numerator // exact.denominator - Fraction(1, 2)) > err:
            assert y == nearest or min(max(exact_round(exact, False), lo), hi) == y


@given(st.floats(1e-3, 2.0), st.floats(1e-3, 2.0), st.lists(st.integers(-128, 127), min_size=2, max_size=40))
def test_rescaled_add_within_half_a_step_of_exact(ma, mb, values):
    a = np.array(values[::2], dtype=np.int64)
    b = np.array(values[1::2][: len(a)] + [0] * (len(a) - len(values[1::2])), dtype=np.int64)
    rq = Requantize.choose([ma, mb], [128, 128])
    got = rq.apply([a, b]).astype(np.int64)
    exact = a * ma + b * mb
    assert np.all(np.abs(got - np.clip(exact, -128, 127)) <= 0.5 + 1e-4)


@given(requantise_cases(), st.integers(-128, 127))
def test_requantise_with_an_output_zero_point_is_its_formula(case, zy):
    """The output zero point, added to the rounding constant as ``z * 2**s``, is
    ``clip(round(acc * m / 2**s) + z)``, and no int32 intermediate overflows (with the clamp
    where needed, whose saturation point moves with ``z``)."""
    real, bound, lo, hi, accs = case
    rq = Requantize.choose([real], [bound], lo, hi, zero_point=zy)
    assert rq.shift >= 1 or zy == 0         # a zero point rides on the rounding constant, z * 2**s
    got = rq.apply([accs])
    m = int(rq.multipliers[0])
    for acc, y in zip(accs.tolist(), got.tolist()):
        assert y == min(max(exact_round(Fraction(acc * m, 2**rq.shift), rq.half_even) + zy, lo), hi)


@given(st.floats(1e-3, 2.0), st.floats(1e-3, 2.0), st.integers(-128, 127), st.integers(-128, 127),
       st.integers(-128, 127), st.lists(st.integers(-128, 127), min_size=2, max_size=40))
def test_rescaled_add_with_zero_points_within_half_a_step(ma, mb, za, zb, zy, values):
    """``round(ma * (a - za) + mb * (b - zb)) + zy``: the input zero points as one offset."""
    a = np.array(values[::2], dtype=np.int64)
    b = np.array(values[1::2][: len(a)] + [0] * (len(a) - len(values[1::2])), dtype=np.int64)
    rq = Requantize.choose([ma, mb], [128, 128], input_zero_points=[za, zb], zero_point=zy)
    got = rq.apply([a, b]).astype(np.int64)
    exact = (a - za) * ma + (b - zb) * mb + zy
    assert np.all(np.abs(got - np.clip(exact, -128, 127)) <= 0.5 + 1e-4)


@given(st.integers(0, 6), st.lists(st.integers(-128, 127), min_size=1, max_size=30))
def test_dyadic_multipliers_round_half_to_even(log_count, means):
    """A 2**k-element average that keeps its scale is exactly the sum / 2**k, ties to even."""
    rq = Requantize.choose([1.0 / 2**log_count], [128 * 2**log_count])
    assert rq.half_even or log_count == 0
    sums = np.array(means, dtype=np.int64) * 2**log_count + np.arange(len(means)) % 2**log_count
    assert np.array_equal(rq.apply([sums]), np.clip(np.round(sums / 2**log_count), -128, 127).astype(np.int8))


def test_requantise_rejects_what_cannot_fit():
    with pytest.raises(ValueError, match="positive and finite"):
        Requantize.choose([0.0], [10])
    with pytest.raises(ValueError, match="within int8"):
        Requantize.choose([0.5], [10], lo=-200)
    with pytest.raises(ValueError, match="one bound per multiplier"):
        Requantize.choose([0.5, 0.5], [10])
    with pytest.raises(ValueError, match="no shift"):
        Requantize.choose([1e12], [2**30])


@pytest.mark.parametrize("module", [integerize_package, fixed_point, rules])
def test_docstring_examples(module):
    assert doctest.testmod(module, extraglobs={"calls": calls}, optionflags=doctest.ELLIPSIS).failed == 0


# ----------------------------------------------------------------------------------------
# whole models against onnxruntime
# ----------------------------------------------------------------------------------------
class Compiled:
    """A QDQ model: onnxruntime's exact QDQ execution, and its integerised Relax module on llvm."""

    def __init__(self, q, made=None):
        """``made``: the model already integerised and compiled (the session's ``quantised_cnn``)."""
        self.q = q
        self.session = exact_session(q)
        self.name = q.graph.input[0].name
        if made is not None:
            self.mod, self.warnings, self.vm = made.integer, made.warnings, made.vm
        else:
            with warnings.catch_warnings(record=True) as self.warnings:
                warnings.simplefilter("always")
                self.mod = tp.integerize()(from_onnx(q, keep_params_in_input=False))
            self.vm = relax.VirtualMachine(tvm.compile(self.mod, "llvm"), tvm.cpu())
        self.scale = onnx_cnn.output_scale(q)

    def steps(self, inputs) -> np.ndarray:
        """|ours - onnxruntime| in output quantisation steps, for every output element."""
        diffs = []
        for x in inputs:
            ours = self.vm["main"](tvm.runtime.tensor(x)).numpy()
            ref = self.session.run(None, {self.name: x})[0]
            diffs.append(np.round(np.abs(ours.astype(np.float64) - ref) / self.scale).ravel())
        return np.concatenate(diffs)


def assert_accurate(compiled, inputs):
    steps = compiled.steps(inputs)
    assert steps.max() <= 2, f"max {steps.max()} steps"
    assert np.mean(steps <= 1) >= 0.99, f"only {np.mean(steps <= 1):.2%} within one step"
    return steps


@pytest.fixture(scope="module", params=sorted(onnx_cnn.MODELS))
def cnn(request, quantised_cnn):
    made = quantised_cnn(request.param, seed=1)         # the models test_quantize_accel builds for accel
    return Compiled(made.qdq, made)


def test_cnn_within_one_step_of_onnxruntime(cnn):
    inputs = onnx_cnn.calibration(cnn.q, 40, seed=11)["x"]
    assert_accurate(cnn, inputs)
    assert not cnn.warnings


def op_names(mod) -> list[str]:
    return [str(c.op.name) for c in calls(mod["main"])]


def test_cnn_is_integer_arithmetic(cnn):
    ops = op_names(cnn.mod)
    # the input's quantize and the output's dequantize stay; nothing else is float
    assert ops.count("relax.quantize") == 1 and ops.count("relax.dequantize") == 1
    assert ops[0] == "relax.quantize" and ops[-1] == "relax.dequantize"
    for call in calls(cnn.mod["main"]):
        if str(call.op.name) in ("relax.nn.conv2d", "relax.matmul"):
            assert [str(a.ty.dtype) for a in call.args] == ["int8", "int8"] and str(call.ty.dtype) == "int32"
    assert not {"relax.nn.relu", "relax.mean", "relax.nn.avg_pool2d"} & set(ops)


def test_requantize_pattern_matches_every_epilogue(cnn):
    gemm = is_op("relax.nn.conv2d")(wildcard(), wildcard()) | is_op("relax.matmul")(wildcard(), wildcard())
    pattern = requantize_pattern(gemm | is_op("relax.add")(gemm, wildcard()))
    found = []
    relax.dpl.rewrite_call(pattern, lambda orig, m: found.append(orig) or orig, cnn.mod["main"])
    gemms = [op for op in op_names(cnn.mod) if op in ("relax.nn.conv2d", "relax.matmul")]
    assert len(found) == len(gemms)


def test_relu_is_folded_into_the_requantise(cnn):
    clips = [c for c in calls(cnn.mod["main"]) if str(c.op.name) == "relax.clip"]
    assert all(str(c.args[0].ty.dtype) == "int32" for c in clips)      # no separate ReLU on int8
    assert any(int(c.args[1].value) == 0 for c in clips)


def test_per_channel_cnn_within_one_step():
    model = onnx_cnn.residual(seed=4, channels=8)
    compiled = Compiled(tp.quantize(model, onnx_cnn.calibration(model, 16), per_channel=True))
    assert_accurate(compiled, onnx_cnn.calibration(model, 20, seed=5)["x"])
    vectors = [c for c in calls(compiled.mod["main"]) if str(c.op.name) == "relax.multiply"
               and c.args[1].ty.shape is not None and len(c.args[1].ty.shape) == 4]
    assert vectors                                      # per-output-channel multipliers


# ----------------------------------------------------------------------------------------
# single operators, random configurations
# ----------------------------------------------------------------------------------------
def one_op_model(nodes, initialisers, in_shape, out_shape):
    graph = helper.make_graph(nodes, "op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in initialisers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@st.composite
def conv_layers(draw):
    cin, cout = draw(st.integers(1, 8)), draw(st.integers(1, 12))
    k, stride = draw(st.sampled_from([1, 3])), draw(st.sampled_from([1, 2]))
    size = draw(st.integers(k, 9))
    pad = draw(st.integers(0, k // 2))
    act = draw(st.sampled_from(["none", "Relu", "Clip"]))
    per_channel = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return cin, cout, k, stride, size, pad, act, per_channel, seed


@settings(max_examples=6)
@given(conv_layers())
def test_conv_layer_within_one_step(layer):
    cin, cout, k, stride, size, pad, act, per_channel, seed = layer
    rng = np.random.default_rng(seed)
    inits = {"w": rng.normal(0, 0.5, (cout, cin, k, k)), "b": rng.normal(0, 0.3, cout)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act != "none" else "y"], kernel_shape=[k, k],
                              strides=[stride, stride], pads=[pad] * 4)]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif act == "Clip":
        inits.update(lo=np.array(0.0), hi=np.array(1.5))
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    out = (size + 2 * pad - k) // stride + 1
    model = one_op_model(nodes, inits, (1, cin, size, size), (1, cout, out, out))
    data = rng.normal(size=(12, 1, cin, size, size)).astype(np.float32)
    compiled = Compiled(tp.quantize(model, {"x": data[:8]}, per_channel=per_channel))
    steps = compiled.steps(data[8:])
    assert steps.max() <= 1
    assert "relax.nn.conv2d" in op_names(compiled.mod) and "relax.nn.relu" not in op_names(compiled.mod)


@settings(max_examples=4)
@given(st.integers(1, 3), st.integers(2, 24), st.integers(1, 16), st.booleans(), st.booleans(), st.integers(0, 2**16))
def test_matmul_layer_within_one_step(rows, k, n, gemm, per_channel, seed):
    rng = np.random.default_rng(seed)
    if gemm:   # Gemm with a transposed weight and a bias
        inits = {"w": rng.normal(0, 0.5, (n, k)), "b": rng.normal(0, 0.3, n)}
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)
    else:      # MatMul with a [K, N] weight, no bias
        inits = {"w": rng.normal(0, 0.5, (k, n))}
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    model = one_op_model([node], inits, (rows, k), (rows, n))
    data = rng.normal(size=(12, rows, k)).astype(np.float32)
    compiled = Compiled(tp.quantize(model, {"x": data[:8]}, per_channel=per_channel))
    assert compiled.steps(data[8:]).max() <= 1
    assert "relax.matmul" in op_names(compiled.mod)


@pytest.mark.parametrize("pads, include", [([0, 0, 0, 0], 0), ([1, 1, 1, 1], 0), ([1, 0, 1, 0], 1)])
def test_average_pool_with_padding(pads, include):
    rng = np.random.default_rng(len(pads) + include)
    # a 1x1 convolution first: onnxruntime quantises a pool only after a quantised operator
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("AveragePool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=pads,
                              count_include_pad=include)]
    model = one_op_model(nodes, {"w": rng.normal(size=(4, 4, 1, 1))}, (1, 4, 7, 7), (1, 4, None, None))
    data = rng.normal(size=(10, 1, 4, 7, 7)).astype(np.float32)
    compiled = Compiled(tp.quantize(model, {"x": data[:6]}))
    assert compiled.steps(data[6:]).max() <= 1
    assert "relax.nn.avg_pool2d" not in op_names(compiled.mod)


def test_operator_without_integer_rule_is_named():
    """A Softmax between QDQ pairs (not element-wise: no table) has no integer form: it stays float,
    and the warning says so."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Softmax", ["c"], ["s"], axis=1),
             helper.make_node("Conv", ["s", "v"], ["y"], kernel_shape=[1, 1])]
    model = one_op_model(nodes, {"w": rng.normal(size=(4, 2, 1, 1)), "v": rng.normal(size=(3, 4, 1, 1))},
                         (1, 2, 5, 5), (1, 3, 5, 5))
    q = tp.quantize(model, {"x": rng.normal(size=(4, 1, 2, 5, 5)).astype(np.float32)})
    with pytest.warns(IntegerizeWarning, match=r"in float, computed on the host: nn.softmax \(no integer rule"):
        mod = tp.integerize()(from_onnx(q, keep_params_in_input=False))
    assert op_names(mod).count("relax.nn.conv2d") == 2 and "relax.nn.softmax" in op_names(mod)


def test_an_element_wise_function_read_in_float_is_said_to_be_unquantised():
    """PyTorch's PReLU before an AveragePool: onnxruntime leaves the PRelu's result unquantised,
    so the pool reads it in float and no table can be made. The warning says so, not that
    PRelu has no integer rule (one slope is a table where a quantize reads it)."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("PRelu", ["c", "slope"], ["p"]),
             helper.make_node("AveragePool", ["p"], ["a"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["a", "v"], ["y"], kernel_shape=[1, 1])]
    model = one_op_model(nodes, {"w": rng.normal(size=(4, 2, 1, 1)), "slope": np.array([0.25]),
                                 "v": rng.normal(size=(3, 4, 1, 1))}, (1, 2, 4, 4), (1, 3, 2, 2))
    q = tp.quantize(model, {"x": rng.normal(size=(4, 1, 2, 4, 4)).astype(np.float32)})
    with pytest.warns(IntegerizeWarning, match=r"nn.prelu: element-wise \(a table where a quantize reads its "
                                               r"result\), read in float by nn.avg_pool2d first") as caught:
        tp.integerize()(from_onnx(q, keep_params_in_input=False))
    assert "no integer rule" not in str(caught[0].message)


def test_a_subtract_of_two_tensors_read_in_float_is_no_table():
    """A LayerNorm's x - mean read in float by a transpose (a recogniser's): a function of two
    tensors, which no table computes, is declined as such; the warning does not say that a table would
    take it had the model quantised its result."""
    s, z = helper.make_tensor("s", TensorProto.FLOAT, [], [0.05]), helper.make_tensor("z", TensorProto.INT8, [], [0])
    nodes = [helper.make_node("DequantizeLinear", ["a", "s", "z"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "s", "z"], ["fb"]),
             helper.make_node("Sub", ["fa", "fb"], ["d"]),
             helper.make_node("Transpose", ["d"], ["t"], perm=[0, 2, 1]),
             helper.make_node("QuantizeLinear", ["t", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.INT8, [1, 4, 8]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4])], [s, z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.warns(IntegerizeWarning, match="subtract") as caught:
        tp.integerize()(from_onnx(model, keep_params_in_input=False))
    message = str(caught[0].message)
    assert "read in float by" not in message and "two tensors" in message, message


def test_float_kept_by_the_model_is_not_said_to_be_left_in_float():
    """An operator whose result the QDQ model never quantises again (a float output's Tanh, a
    head kept in float by --float-outputs) is float in the model itself: no warning names it.
    One that is quantised again with no integer rule, beside one declined, is named as such."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Tanh", ["c"], ["y"])]
    model = one_op_model(nodes, {"w": rng.normal(size=(4, 2, 1, 1))}, (1, 2, 5, 5), (1, 4, 5, 5))
    q = tp.quantize(model, {"x": rng.normal(size=(4, 1, 2, 5, 5)).astype(np.float32)}, float_outputs=["y"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", IntegerizeWarning)
        mod = tp.integerize()(from_onnx(q, keep_params_in_input=False))
    assert "relax.tanh" in op_names(mod)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Softmax", ["c"], ["s"], axis=1),
             helper.make_node("AveragePool", ["s"], ["y"], kernel_shape=[2, 2], ceil_mode=1)]
    model = one_op_model(nodes, {"w": rng.normal(size=(4, 2, 1, 1))}, (1, 2, 5, 5), (1, 4, 3, 3))
    q = tp.quantize(model, {"x": rng.normal(size=(4, 1, 2, 5, 5)).astype(np.float32)})
    with pytest.warns(IntegerizeWarning, match=r"declined: avg_pool2d: an average pool with ceil_mode or dilation "
                                               r"\(1x\); no integer rule for the others"):
        tp.integerize()(from_onnx(q, keep_params_in_input=False))


def test_concat_slice_and_global_max_pool():
    """Concat of two branches at different scales, a slice and a global max pool stay integer."""
    rng = np.random.default_rng(3)
    inits = {"w": rng.normal(size=(4, 3, 1, 1)), "v": 3 * rng.normal(size=(5, 3, 3, 3)),
             "starts": np.array([1]), "ends": np.array([8]), "axes": np.array([1])}
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], kernel_shape=[1, 1]),
             helper.make_node("Conv", ["x", "v"], ["b"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Slice", ["c", "starts", "ends", "axes"], ["s"]),
             helper.make_node("GlobalMaxPool", ["s"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "u"], ["y"], transB=1)]
    inits["u"] = rng.normal(size=(2, 7))
    model = one_op_model(nodes, inits, (1, 3, 6, 6), (1, 2))
    for t in model.graph.initializer[2:5]:      # Slice takes int64 indices
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.int64), t.name))
    data = rng.normal(size=(10, 1, 3, 6, 6)).astype(np.float32)
    compiled = Compiled(tp.quantize(model, {"x": data[:6]}))
    assert not compiled.warnings, [str(w.message) for w in compiled.warnings]
    assert compiled.steps(data[6:]).max() <= 1
    assert "relax.concat" in op_names(compiled.mod)


def test_mean_keeping_its_scale_rounds_ties_to_even():
    """A mean over 6 elements at an unchanged scale is exactly round-half-even(sum / 6):
    ties (a sum of 3 mod 6) are frequent, and rounding them all one way would bias it."""
    mod = tp.integerize()(mean_of((64, 2, 2, 3), [2, 3]))
    assert "relax.dequantize" not in op_names(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    data = np.random.default_rng(0).integers(-128, 128, (64, 2, 2, 3)).astype(np.int8)
    data[:8] = [[[[3, 0, 0], [0, 0, 0]]] * 2] * 8          # sums of 3: ties at 0.5
    sums = data.astype(np.int64).sum(axis=(2, 3), keepdims=True)
    got = vm["main"](tvm.runtime.tensor(data)).numpy()
    assert np.array_equal(got, np.round(sums / 6).astype(np.int8))
    assert np.all(got[:8] == 0)


def mean_of(shape, axis):
    """``q(mean(dq(x), axis))`` on an int8 ``x`` of ``shape`` (dims may be symbolic)."""
    x = relax.Var("x", relax.TensorType(shape, "int8"))
    bb = relax.BlockBuilder()
    scale, zero = relax.const(0.05, "float32"), relax.const(0, "int8")
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(relax.op.dequantize(x, scale, zero))
            y = bb.emit_output(relax.op.quantize(relax.op.mean(d, axis=axis, keepdims=True), scale, zero))
        bb.emit_func_output(y)
    return bb.get()


def test_symbolic_dimensions_only_where_the_arithmetic_needs_them():
    """A mean over static axes integerises whatever the batch (checked at two batch sizes);
    one over a symbolic axis cannot divide by a known count, and the warning says so."""
    n, h = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("h", "int64")
    mod = tp.integerize()(mean_of((n, 2, 2, 3), [2, 3]))
    assert "relax.dequantize" not in op_names(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    for batch in (1, 5):
        data = np.random.default_rng(batch).integers(-128, 128, (batch, 2, 2, 3)).astype(np.int8)
        sums = data.astype(np.int64).sum(axis=(2, 3), keepdims=True)
        assert np.array_equal(vm["main"](tvm.runtime.tensor(data)).numpy(), np.round(sums / 6).astype(np.int8))
    with pytest.warns(IntegerizeWarning, match=r"mean: a mean over a dynamic dimension \(h in"):
        tp.integerize()(mean_of((n, 2, h, 3), [2, 3]))



def test_the_warning_lists_a_few_sites_and_counts_the_rest():
    """A model with open sizes declines every mean, each reason naming its own dimension:
    the warning lists four and says how many more, rather than growing with the model."""
    bb, scale, zero = relax.BlockBuilder(), relax.const(0.05, "float32"), relax.const(0, "int8")
    xs = [relax.Var(f"x{k}", relax.TensorType((1, 2, tvm.tirx.Var(f"h{k}", "int64"), 3), "int8")) for k in range(7)]
    with bb.function("main", xs):
        with bb.dataflow():
            ys = [bb.emit(relax.op.quantize(relax.op.mean(relax.op.dequantize(x, scale, zero), axis=[2, 3],
                                                          keepdims=True), scale, zero)) for x in xs]
            out = bb.emit_output(relax.Tuple(ys))
        bb.emit_func_output(out)
    with pytest.warns(IntegerizeWarning) as caught:
        tp.integerize()(bb.get())
    text = str(caught[0].message)
    assert text.startswith("tp.integerize left 7 quantised operator(s) in float")
    assert text.count("over a dynamic dimension") == 4 and "... and 3 more" in text


@pytest.mark.parametrize("token_scale, token_zero_point", [(0.02, 0), (0.05, 3)])
def test_a_constant_concatenated_at_another_quantisation_is_requantised_at_compile_time(token_scale, token_zero_point):
    """ViT's class token, a quantised constant, concatenated with the patches at their scale:
    its requantise was a chain of calls on a constant, offloaded to accel, which TVM's
    FoldConstant then ran at compile time (a device call while building: TypeError)."""
    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
              (("sx", 0.05), ("st", token_scale), ("sy", 0.05))]
    consts += [numpy_helper.from_array(np.array(0, np.int8), "z"),
               numpy_helper.from_array(np.array(token_zero_point, np.int8), "zt"),
               numpy_helper.from_array(np.arange(-8, 8, dtype=np.int8).reshape(1, 1, 16) * 15, "token")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["token", "st", "zt"], ["td"]),
             helper.make_node("Concat", ["td", "xd"], ["c"], axis=1),
             helper.make_node("QuantizeLinear", ["c", "sy", "z"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "sy", "z"], ["y"])]
    graph = helper.make_graph(nodes, "token", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 16])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((1, 4, 16)).astype(np.float32)
    compiled = tp.build(model, "accel, llvm")
    np.testing.assert_array_equal(np.asarray(compiled(x)), exact_session(model).run(None, {"x": x})[0])
