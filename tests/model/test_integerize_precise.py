"""``tp.integerize(precise=True)`` against onnxruntime's exact QDQ run: the same int8 results but
where the real result lies within float32's error of a rounding tie; and the precise
requantise (a 48-bit multiplier as two int32 products) against exact rational arithmetic.

The layers' reference is the real arithmetic of the QDQ model, evaluated in float64 from the
int8 tensors onnxruntime computed: onnxruntime's float32 rounds as it does but near a tie
(:data:`NEAR_TIE`), and so must the integer module, everywhere else. Each of these tests
fails with the one-product requantise."""

import warnings
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tvm  # noqa: E402
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.dpl import is_op, wildcard  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.model.integerize import Requantize, calls, emit_requantize, requantize_pattern  # noqa: E402
from tirpat.testing.int_ranges import int32_overflows  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402
from integerize_checks import exact_round  # noqa: E402

#: How close to a rounding tie (in steps) the real result may be for onnxruntime's float32
#: and the integers to round it apart: float32's error on a sum of K dequantized products is
#: about sqrt(K) * 2**-24 of the result, up to 1e-4 of a step at 127 steps and K = 256 (more
#: where the sum cancels); the precise requantise's is 2**-23. One product's error on these
#: layers reaches hundredths of a step.
NEAR_TIE = 2e-3


# ----------------------------------------------------------------------------------------
# the precise requantise against exact arithmetic
# ----------------------------------------------------------------------------------------
@st.composite
def requantise_cases(draw):
    # up to 1e6: a per-channel scale far above the others makes the multiplier of the
    # precise form's largest shift overflow int64 before it is found too large
    real = draw(st.floats(1e-6, 4.0) | st.floats(4.0, 1e6))
    bound = draw(st.integers(1, 2**31 - 1))
    lo = draw(st.sampled_from([-128, 0, -20]))
    hi = draw(st.sampled_from([127, 6, 100]))
    zy = draw(st.sampled_from([0, 0, -128, 17]))
    accs = draw(st.lists(st.integers(-bound, bound), min_size=1, max_size=20))
    return real, bound, lo, hi, zy, np.array(accs + [bound, -bound], dtype=np.int64)


@given(requantise_cases())
def test_precise_requantise_is_its_formula_and_never_overflows(case):
    """``clip(floor((acc * m + 2**(s-1) + z_y * 2**s) / 2**s))`` with the whole multiplier, its
    two int32 products never leaving int32, at a shift no smaller than one product's."""
    real, bound, lo, hi, zy, accs = case
    rq = Requantize.choose([real], [bound], lo, hi, zero_point=zy, precise=True)
    assert rq.shift >= Requantize.choose([real], [bound], lo, hi, zero_point=zy).shift
    got = rq.apply([accs])                       # raises OverflowError on any int32 overflow
    m = int(rq.multipliers[0])
    for acc, y in zip(accs.tolist(), got.tolist()):
        assert y == min(max(exact_round(Fraction(acc * m, 2**rq.shift), rq.half_even) + zy, lo), hi)


@given(st.floats(1e-3, 2.0), st.floats(1e-3, 2.0), st.integers(-128, 127), st.integers(-128, 127),
       st.integers(-128, 127), st.lists(st.integers(-128, 127), min_size=2, max_size=40))
def test_precise_rescaled_add_is_its_formula(ma, mb, za, zb, zy, values):
    """Two terms with input zero points: ``floor((sum (acc_i - z_i) * m_i) / 2**s + 1/2) + z_y``."""
    a = np.array(values[::2], dtype=np.int64)
    b = np.resize(np.array(values[1::2], dtype=np.int64), len(a))
    rq = Requantize.choose([ma, mb], [128, 128], input_zero_points=[za, zb], zero_point=zy, precise=True)
    got = rq.apply([a, b]).tolist()
    m0, m1 = (int(m) for m in rq.multipliers)
    for x, y, out in zip(a.tolist(), b.tolist(), got):
        fixed = exact_round(Fraction((x - za) * m0 + (y - zb) * m1, 2**rq.shift), rq.half_even) + zy
        assert out == min(max(fixed, -128), 127)
        # within 2**-20 of a step of the real sum
        real = (x - za) * Fraction(ma) + (y - zb) * Fraction(mb)
        assert abs(Fraction((x - za) * m0 + (y - zb) * m1, 2**rq.shift) - real) < Fraction(1, 2**20)


def test_precise_requantise_rounds_a_long_convolution_as_the_real_product():
    """The first convolution of the classifier ppocr_v2_cls (multiplier 0.00087, accumulators up
    to 146,000): one product's 14-bit multiplier rounds 114 of the 146,001 non-negative
    accumulators to the other side of a tie; the precise form rounds every one as the real
    product, but where it lies within 2**-20 of a step of a tie."""
    real, bound = 0.00087, 146_000
    num, den = Fraction(real).as_integer_ratio()
    accs = np.arange(-bound, bound + 1)
    # round(acc * real) with exact integers: no tie, the denominator is a large power of 2
    rounded = np.array([(2 * a * num + den) // (2 * den) for a in accs.tolist()])
    expected = np.clip(rounded, -128, 127)
    value = accs * real
    near = np.abs(value - np.floor(value) - 0.5) < 2**-20
    single = Requantize.choose([real], [bound]).apply([accs])
    precise = Requantize.choose([real], [bound], precise=True).apply([accs])
    assert np.count_nonzero(single != expected) > 100          # where one product is not enough
    assert np.all((precise == expected) | near) and np.count_nonzero(near) <= 2


def _requantise_module(rq: Requantize, n: int) -> tvm.IRModule:
    """``main(acc)``: ``emit_requantize([acc], rq)`` of an int32 vector of ``n``."""
    bb = relax.BlockBuilder()
    acc = relax.Var("acc", relax.TensorType((n,), "int32"))
    with bb.function("main", [acc]):
        with bb.dataflow():
            out = bb.emit_output(emit_requantize([acc], rq))
        bb.emit_func_output(out)
    return bb.get()


def _constant(e) -> np.ndarray | None:
    value = getattr(e, "value", None)
    return value.numpy() if hasattr(value, "numpy") else None


def _constants_of_products(mod: tvm.IRModule) -> list[int]:
    return [int(_constant(c.args[1])) for c in calls(mod["main"]) if str(c.op.name) == "relax.multiply"]


def _assert_emitted_is_apply(rq: Requantize, accs: np.ndarray) -> tvm.IRModule:
    """The emitted Relax (compiled for llvm) computes ``rq.apply``, with no product by 0 (and,
    for the precise form, no add of a constant 0), in a form ``requantize_pattern`` matches."""
    mod = _requantise_module(rq, accs.size)
    assert 0 not in _constants_of_products(mod), mod.script()
    assert not rq.split or not any(str(c.op.name) == "relax.add" and _constant(c.args[1]) is not None
                   and not np.any(_constant(c.args[1])) for c in calls(mod["main"])), mod.script()
    found = []
    relax.dpl.rewrite_call(requantize_pattern(), lambda orig, m: found.append(orig) or orig, mod["main"])
    assert found, mod.script()
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(accs.astype(np.int32))).numpy()
    np.testing.assert_array_equal(got, rq.apply([accs]))
    return mod


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 2**24), st.integers(1, 60), st.integers(1, 2**31 - 1), st.sampled_from([0, -128, 17]),
       st.lists(st.integers(-2**31, 2**31 - 1), min_size=1, max_size=8))
def test_a_split_multiplier_never_multiplies_by_zero(significand, exponent, bound, zy, extra):
    """Multipliers with few significant bits (``significand * 2**-exponent``: trailing zeros at
    the precise form's shift) and tiny ones: a split never leaves every low part 0 (it is one
    product at ``s - k`` then, the same value), and a high part of 0 is left out with its
    product; the emitted module computes :meth:`Requantize.apply`."""
    real = significand * 2.0**-exponent
    # (below 2**-49 the multiplier rounds to 0 even at the largest shift: a constant result)
    assume(real <= 1e6 and real * 2.0**48 >= 1)
    try:
        rq = Requantize.choose([real], [bound], zero_point=zy, precise=True)
    except ValueError:
        return                                  # no shift fits int32 for this multiplier and bound
    # (a multiplier that rounds to 0 at the shift that fits: a constant result, multiplied by 0)
    assume(np.all(rq.multipliers[0] != 0))
    if rq.split:
        assert any(np.any(lo) for _, lo in rq.parts), rq
    accs = np.clip(np.array(extra + [bound, -bound, 0, 1, -1], dtype=np.int64), -bound, bound)
    _assert_emitted_is_apply(rq, accs)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(["high", "low"]), st.integers(2, 48), st.integers(1, 31), st.integers(1, 2**20),
       st.sampled_from([0, -128, 17]), st.integers(0, 2**16))
def test_a_split_with_a_zero_part_is_emitted_without_its_product(zero, shift, split, bound, zy, seed):
    """A precise form whose high (or low) part is 0 for the whole multiplier: one product, its
    constants added where they are not 0, the value :meth:`Requantize.apply` gives."""
    assume(split < shift and shift - split <= 31)
    # m < 2**k: only the low product; m = m_hi * 2**k: only the high one (each within int32)
    top = min(2**split - 1, (2**31 - 1 - 2**split) // bound) if zero == "high" else (2**31 - 1) // bound
    assume(top >= 1)
    m = int(np.random.default_rng(seed).integers(1, top + 1))
    m = m if zero == "high" else m << split
    rq = Requantize((np.int64(m),), shift, None, -128, 127, zero_point=zy, split=split)
    high, low = rq.parts[0]
    assert (int(high) if zero == "high" else int(low)) == 0
    try:                    # the constants (z_y * 2**s among them) must keep int32 too
        rq.apply([np.array([bound, -bound, 0])])
    except OverflowError:
        assume(False)
    accs = np.random.default_rng(seed).integers(-bound, bound + 1, 64)
    mod = _assert_emitted_is_apply(rq, np.concatenate([accs, [bound, -bound]]))
    assert len(_constants_of_products(mod)) == 1


@pytest.mark.parametrize("precise", [False, True])
def test_per_channel_constants_of_one_value_are_scalars(precise):
    """Per-channel multipliers give every constant of the requantise their shape, but the
    rounding and the output zero point are one value for all channels (no input zero point):
    emitted 0-d, an immediate for a device instead of a vector it stages and reads; the
    module still computes :meth:`Requantize.apply` for each channel."""
    rng = np.random.default_rng(3)
    n, bound = 12, 2**30       # a clamp per channel too
    rq = Requantize.choose([rng.uniform(2e-4, 2e-3, n)], [np.full(n, bound)], zero_point=17, precise=precise)
    assert bool(rq.split) == precise and rq.clamp is not None
    mod = _requantise_module(rq, n)
    vectors = [_constant(a) for c in calls(mod["main"]) for a in c.args[1:] if _constant(a) is not None]
    assert any(v.ndim for v in vectors), mod.script()                  # the multipliers and the clamp
    assert all(v.ndim == 0 or len(np.unique(v)) > 1 for v in vectors), mod.script()
    accs = rng.integers(-2**31, 2**31, (64, n))
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    for row in accs:
        got = vm["main"](tvm.runtime.tensor(row.astype(np.int32))).numpy()
        np.testing.assert_array_equal(got, rq.apply([np.clip(row, -bound, bound)]))


# ----------------------------------------------------------------------------------------
# single layers against onnxruntime, and the real arithmetic of their int8 tensors
# ----------------------------------------------------------------------------------------
def _model(nodes, inits, in_shape, out_shape):
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv2d(x, w, pads, strides, groups):
    """float64 NCHW convolution (OIHW weights)."""
    x = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    out, per_group, kh, kw = w.shape
    windows = sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::strides[0], ::strides[1]]
    n, _, h, wd = windows.shape[:4]
    windows = windows.reshape(n, groups, per_group, h, wd, kh, kw)
    return np.einsum("ngchwij,gocij->ngohw", windows, w.reshape(groups, out // groups, per_group, kh, kw)
                     ).reshape(n, out, h, wd)


class _Layer:
    """A QDQ model whose output is ``DequantizeLinear(QuantizeLinear(op(...)))``: onnxruntime's
    int8 tensors, and the real value of the output in steps from the op's int8 inputs."""

    def __init__(self, q):
        self.q = q
        self.init = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
        self.producer = {o: n for n in q.graph.node for o in n.output}
        last = self.producer[q.graph.output[0].name]            # the output's DequantizeLinear
        self.quantize = self.producer[last.input[0]]
        self.op = self.producer[self.quantize.input[0]]
        taps = onnx.ModelProto()
        taps.CopyFrom(q)
        inner = [n.output[0] for n in q.graph.node if n.op_type == "QuantizeLinear"]
        taps.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.INT8, None) for t in inner)
        self.session, self.names = exact_session(taps), [o.name for o in taps.graph.output]

    def _dequantized(self, name, values):
        dq = self.producer[name]
        assert dq.op_type == "DequantizeLinear"
        q = self.init[dq.input[0]] if dq.input[0] in self.init else values[dq.input[0]]
        scale, zero = self.init[dq.input[1]].astype(np.float64), self.init[dq.input[2]].astype(np.float64)
        axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        if scale.size > 1:
            shape = [1] * q.ndim
            shape[axis] = scale.size
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        return (q.astype(np.float64) - zero) * scale

    def run(self, feed: dict):
        """(onnxruntime's output in steps, the real output in steps, unrounded) for the inputs ``feed``."""
        values = dict(zip(self.names, self.session.run(None, feed)))
        args = [self._dequantized(i, values) for i in self.op.input]
        attrs = {a.name: helper.get_attribute_value(a) for a in self.op.attribute}
        if self.op.op_type == "Conv":
            real = _conv2d(args[0], args[1], attrs.get("pads", [0] * 4), attrs.get("strides", [1, 1]),
                           attrs.get("group", 1))
            if len(args) > 2:
                real = real + args[2].reshape(1, -1, 1, 1)
        elif self.op.op_type == "Gemm":
            real = args[0] @ (args[1].T if attrs.get("transB", 0) else args[1]) + (args[2] if len(args) > 2 else 0)
        elif self.op.op_type == "MatMul":
            real = args[0] @ args[1]
        elif self.op.op_type in ("Add", "Mul"):
            real = args[0] + args[1] if self.op.op_type == "Add" else args[0] * args[1]
        else:
            raise AssertionError(f"no real arithmetic for {self.op.op_type}")
        scale, zero = (float(self.init[n]) for n in self.quantize.input[1:])
        return values[self.quantize.output[0]].astype(np.int64), real / scale + zero


def assert_bit_exact(q, feeds: list[dict]):
    """The precise integer module gives onnxruntime's int8 output everywhere but within
    :data:`NEAR_TIE` of a tie of the real result (and at most one step there); its int32
    intermediates provably never overflow. The layer's inputs must be the model's (quantised
    alike by both): a layer computed from another's result would read ours, where the real
    result is onnxruntime's."""
    layer = _Layer(q)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tp.IntegerizeWarning)
        mod = tp.integerize(precise=True)(from_onnx(q, keep_params_in_input=False))
    assert not int32_overflows(mod["main"])
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    scale, zero = (float(layer.init[n]) for n in layer.quantize.input[1:])
    near_ties = elements = 0
    for feed in feeds:
        ref, real = layer.run(feed)
        ours = vm["main"](*[tvm.runtime.tensor(v) for v in feed.values()]).numpy()
        ours = np.rint(ours.astype(np.float64) / scale).astype(np.int64) + zero
        near = np.abs(real - np.floor(real) - 0.5) < NEAR_TIE
        assert np.all((ours == ref) | near), f"{np.count_nonzero((ours != ref) & ~near)} elements off onnxruntime"
        assert np.all(np.abs(ours - ref) <= 1)
        assert np.array_equal(ref[~near], np.clip(np.rint(real[~near]), -128, 127))   # the reference is real
        near_ties, elements = near_ties + np.count_nonzero(near), elements + near.size
    assert near_ties <= 4 + elements // 50             # the exemption is for the few near a tie
    return mod


@st.composite
def conv_layers(draw):
    depthwise = draw(st.booleans())
    cin = draw(st.integers(4, 16))
    cout = cin if depthwise else draw(st.integers(1, 8))
    k, stride = draw(st.sampled_from([3, 5])), draw(st.sampled_from([1, 2]))
    return (cin, cout, k, stride, draw(st.integers(k + 2, 10)), draw(st.integers(0, k // 2)), depthwise,
            draw(st.sampled_from([0.0, 0.5])), draw(st.booleans()), draw(st.integers(0, 2**16)))


@settings(max_examples=8)
@given(conv_layers())
def test_conv_is_onnxruntimes_int8_result(layer):
    """Convolutions, dense and depthwise, per-tensor and per-channel weights. Weights of one sign
    add up (``mean`` 0.5): the output's scale is then large against the products', a small
    multiplier (0.0003 and below), for which one int32 product is too coarse."""
    cin, cout, k, stride, size, pad, depthwise, mean, per_channel, seed = layer
    rng = np.random.default_rng(seed)
    groups = cin if depthwise else 1
    inits = {"w": rng.normal(mean, 0.5, (cout, cin // groups, k, k)), "b": rng.normal(0, 0.3, cout)}
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[stride] * 2,
                            pads=[pad] * 4, group=groups)
    out = (size + 2 * pad - k) // stride + 1
    data = rng.normal(mean, 1.0, size=(12, 1, cin, size, size)).astype(np.float32)
    q = tp.quantize(_model([node], inits, (1, cin, size, size), (1, cout, out, out)), {"x": data[:4]},
                    per_channel=per_channel)
    mod = assert_bit_exact(q, [{"x": x} for x in data[4:]])
    assert "relax.nn.conv2d" in {str(c.op.name) for c in calls(mod["main"])}


@settings(max_examples=4)
@given(st.integers(8, 32), st.integers(256, 1024), st.integers(8, 16), st.booleans(), st.integers(0, 2**16))
def test_matmul_is_onnxruntimes_int8_result(rows, k, n, gemm, seed):
    """Gemm (a transposed weight, a bias) and MatMul, weights of one sign (small multipliers)."""
    rng = np.random.default_rng(seed)
    if gemm:
        inits = {"w": rng.normal(0.5, 0.5, (n, k)), "b": rng.normal(0, 0.3, n)}
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)
    else:
        inits = {"w": rng.normal(0.5, 0.5, (k, n))}
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    data = rng.normal(0.5, 1.0, size=(12, rows, k)).astype(np.float32)
    assert_bit_exact(tp.quantize(_model([node], inits, (rows, k), (rows, n)), {"x": data[:4]}),
                     [{"x": x} for x in data[4:]])


@settings(max_examples=6)
@given(st.sampled_from(["Add", "Mul"]), st.floats(0.05, 5.0), st.integers(0, 2**16))
def test_add_and_multiply_of_two_tensors_are_onnxruntimes_int8_result(op, ratio, seed):
    """Two quantised tensors at scales ``ratio`` apart, added or multiplied: two rescales in
    one requantise, or a product's. The inputs are quantised values (``q * s``), which both
    quantise to ``q``. (One product's error here, about 1e-5 of a step, is as small as
    onnxruntime's own: its precision is checked against exact arithmetic above.)"""
    rng = np.random.default_rng(seed)
    shape = (1, 4, 12, 12)
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"])], "layer",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    calibration = {"a": rng.normal(0, 1.0, (4, *shape)).astype(np.float32),
                   "b": rng.normal(0, ratio, (4, *shape)).astype(np.float32)}
    q = tp.quantize(model, calibration)
    scales = {n.input[0]: numpy_helper.to_array(next(i for i in q.graph.initializer if i.name == n.input[1]))
              for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in "ab"}
    feeds = [{n: (rng.integers(-127, 128, shape) * scales[n]).astype(np.float32) for n in "ab"} for _ in range(4)]
    assert_bit_exact(q, feeds)


def test_precise_requantise_is_the_pattern_backends_match():
    """``requantize_pattern`` matches the precise form (which reads the accumulator twice) after
    a convolution and a bias, and the default form still has one multiply per requantise."""
    rng = np.random.default_rng(3)
    inits = {"w": rng.normal(0, 0.5, (8, 16, 3, 3)), "b": rng.normal(0, 0.3, 8)}
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3])
    data = rng.normal(size=(4, 1, 16, 8, 8)).astype(np.float32)
    q = tp.quantize(_model([node], inits, (1, 16, 8, 8), (1, 8, 6, 6)), {"x": data})
    conv = is_op("relax.nn.conv2d")(wildcard(), wildcard())
    pattern = requantize_pattern(is_op("relax.add")(conv, wildcard()))
    for precise, multiplies in ((True, 2), (False, 1)):
        mod = tp.integerize(precise=precise)(from_onnx(q, keep_params_in_input=False))
        names = [str(c.op.name) for c in calls(mod["main"])]
        assert names.count("relax.multiply") == multiplies
        found = []
        relax.dpl.rewrite_call(pattern, lambda orig, m: found.append(orig) or orig, mod["main"])
        assert len(found) == 1, f"no requantise matched in {names}"
