"""Element-wise operations of two int8 tensors on accel (:mod:`accel.compiler.elementwise`):
the add, subtract and multiply :mod:`tirpat.model.integerize` writes (rescaled operands,
requantise), with operands of the output's shape, one value per row of the trailing
dimensions (a squeeze-excitation's ``[1, C, 1, 1]``) or one value in all, built by
``tp.build(..., "accel, llvm")`` bit-exact against ``tvm.compile(..., "llvm")`` of the same
module over three calls (the third replays the simulator's batched plan); what stays on the
host says why."""

import warnings

import numpy as np
import pytest
import tvm
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tvm import relax

import tirpat as tp
from tirpat.model.integerize.fixed_point import Requantize
from tirpat.model.integerize.rules import emit_requantize
from tirpat.testing.differential import assert_matches_llvm


def chain_module(op: str, shape_a, shape_b, reals, za: int = 0, zb: int = 0, zy: int = 0,
                 bounds=(-128, 127), precise: bool = False) -> tvm.IRModule:
    """``main(a, b)``: integerize's int8 form of ``q(dq(a) op dq(b))`` (op: add, subtract,
    multiply) with the real rescale(s) ``reals`` and zero points, clipped to ``bounds``
    (``precise``: the requantise's multipliers in two int32 products, integerize's default)."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(shape_a, "int8"))
    b = relax.Var("b", relax.TensorType(shape_b, "int8"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            wa, wb = relax.op.astype(a, "int32"), relax.op.astype(b, "int32")
            if op == "multiply":
                centred = [relax.op.subtract(w, relax.const(z, "int32")) if z else w for w, z in ((wa, za), (wb, zb))]
                bound = (128 + abs(za)) * (128 + abs(zb))
                rq = Requantize.choose([reals[0]], [bound], *bounds, zero_point=zy, precise=precise)
                value = emit_requantize([relax.op.multiply(*centred)], rq)
            else:
                if op == "subtract":
                    wb, zb = relax.op.negative(wb), -zb
                rq = Requantize.choose(list(reals), [128, 128], *bounds, [za, zb], zy, precise)
                value = emit_requantize([wa, wb], rq)
            out = bb.emit_output(value)
        bb.emit_func_output(out)
    return bb.get()


def rescale_module(shape, real: float | Requantize | None, zx: int, zy: int, bounds=(-128, 127),
                   precise: bool = False) -> tvm.IRModule:
    """``main(a)``: integerize's rescale of an int8 tensor to the scale ``real`` times its own
    (None: the same scale, only the zero point moves from ``zx`` to ``zy``; a ``Requantize``:
    that one), clipped to ``bounds`` (``precise``: as :func:`chain_module`)."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(shape, "int8"))
    with bb.function("main", [a]):
        with bb.dataflow():
            wide = relax.op.astype(a, "int32")
            if real is None:
                value = relax.op.astype(relax.op.clip(relax.op.add(wide, relax.const(zy - zx, "int32")), *bounds), "int8")
            elif isinstance(real, Requantize):
                value = emit_requantize([wide], real)
            else:
                value = emit_requantize([wide], Requantize.choose([real], [128], *bounds, [zx], zy, precise))
            out = bb.emit_output(value)
        bb.emit_func_output(out)
    return bb.get()


def _build_and_compare(mod: tvm.IRModule, seed: int, target: str = "accel, llvm"):
    # three calls: the third replays the stream in the simulator's batched plan (accel.hw.fused)
    return assert_matches_llvm(mod, target, seed=seed)


def _on_accel(model) -> None:
    report = model.report.to_json()
    parts = [p for p in report["partitions"] if p["pattern"] == "accel.elementwise"]
    assert len(parts) == 1 and parts[0]["rules"].get("accel.elementwise"), report["partitions"]
    assert not report["on_host"], report["on_host"]
    stats = model.stats["accel"]
    assert stats.instructions["ALU"] >= 1 and stats.instructions["STORE"] >= 1


_SHAPES = st.sampled_from([(1, 8, 5, 5), (1, 16, 4, 4), (1, 3, 7, 9), (2, 40, 33), (1, 24, 1, 1), (64, 130),
                           (1, 200, 2, 3)])


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["add", "subtract", "multiply"]), _SHAPES, st.sampled_from(["full", "row", "scalar"]),
       st.booleans(), st.floats(0.001, 3.0), st.floats(0.001, 3.0), st.integers(-20, 20), st.integers(-20, 20),
       st.integers(-20, 20), st.sampled_from([(-128, 127), (0, 127), (-100, 90)]), st.integers(0, 1000))
def test_elementwise_chain_on_accel_is_bit_exact_with_llvm(op, shape, broadcast, swap, ra, rb, za, zb, zy, bounds,
                                                           seed):
    other = {"full": shape, "row": shape[:-2] + (1, 1) if len(shape) == 4 else shape[:1] + (1,) * (len(shape) - 1),
             "scalar": (1,) * len(shape)}[broadcast]
    shapes = (other, shape) if swap else (shape, other)
    mod = chain_module(op, *shapes, (ra, rb), za, zb, zy, bounds)
    _on_accel(_build_and_compare(mod, seed))


@settings(max_examples=6, deadline=None)
@given(_SHAPES, st.one_of(st.none(), st.floats(0.01, 4.0)), st.integers(-30, 30), st.integers(-30, 30),
       st.sampled_from([(-128, 127), (0, 127)]), st.integers(0, 1000))
def test_a_rescale_of_one_int8_tensor_on_accel_is_bit_exact(shape, real, zx, zy, bounds, seed):
    _on_accel(_build_and_compare(rescale_module(shape, real, zx, zy, bounds), seed))


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["add", "subtract", "multiply"]), _SHAPES, st.sampled_from(["full", "row", "scalar"]),
       st.booleans(), st.floats(1e-4, 3.0), st.floats(1e-4, 3.0), st.integers(-128, 127), st.integers(-128, 127),
       st.integers(-128, 127), st.sampled_from([(-128, 127), (0, 127), (-100, 90)]), st.integers(0, 1000))
def test_a_precise_requantise_on_accel_is_bit_exact_with_llvm(op, shape, broadcast, swap, ra, rb, za, zb, zy,
                                                              bounds, seed):
    """integerize's default requantise (the multiplier in two int32 products: each term
    multiplied twice, the low sum shifted and added to the high one) on the element-wise
    core, bit for bit llvm's, whole on accel."""
    other = {"full": shape, "row": shape[:-2] + (1, 1) if len(shape) == 4 else shape[:1] + (1,) * (len(shape) - 1),
             "scalar": (1,) * len(shape)}[broadcast]
    shapes = (other, shape) if swap else (shape, other)
    mod = chain_module(op, *shapes, (ra, rb), za, zb, zy, bounds, precise=True)
    model = _build_and_compare(mod, seed)
    _on_accel(model)


@settings(max_examples=10, deadline=None)
@given(_SHAPES, st.sampled_from(["high", "low", "both"]), st.integers(1, 30), st.integers(1, 2**31 - 1),
       st.integers(-30, 30), st.integers(-30, 30), st.integers(0, 1000))
def test_a_precise_rescale_with_a_zero_part_on_accel_is_bit_exact(shape, zero, split, m, zx, zy, seed):
    """A rescale in the precise form, its high or low part 0 (left out with its product, see
    ``emit_requantize``) or neither: on accel, bit for bit llvm's."""
    k = split
    m = {"high": m % (1 << k), "low": (m >> k) << k, "both": m}[zero]
    assume(m > 0 and 128 * (m % (1 << k)) + (1 << k) <= 2**31 - 1 and 128 * (m >> k) + 2**20 <= 2**31 - 1)
    rq = Requantize((np.int64(m),), k + 20, None, -128, 127, offset=np.int64(-zx * m), zero_point=zy, split=k)
    try:
        rq.apply([np.array([-128, 127])])       # every intermediate within int32
    except OverflowError:
        assume(False)
    _on_accel(_build_and_compare(rescale_module(shape, rq, zx, zy), seed))


@pytest.mark.parametrize("op", ["add", "multiply"])
def test_an_exact_rescale_rounds_half_to_even_on_accel(op):
    """Dyadic multipliers round half to even: the requantise reads its sum three times (floor,
    half, parity), so the device copies it before the shifts; still bit-exact."""
    mod = chain_module(op, (1, 16, 6, 6), (1, 16, 1, 1), (0.5, 0.25) if op == "add" else (0.125,))
    assert "right_shift" in mod.script() and mod.script().count("right_shift") >= 3
    model = _build_and_compare(mod, 3)
    _on_accel(model)
    # with an input zero point, the offset is added before the parity (emit_requantize)
    mod = chain_module(op, (1, 16, 6, 6), (1, 16, 6, 6), (1.0, 1.0) if op == "add" else (0.125,), za=0, zb=1)
    assert mod.script().count("right_shift") >= 3
    model = _build_and_compare(mod, 3)
    _on_accel(model)


def test_an_operand_broadcast_along_a_leading_dimension_stays_on_the_host_and_says_why():
    mod = chain_module("add", (1, 8, 4, 4), (1, 1, 4, 4), (0.5, 0.3))
    with pytest.warns(tp.OffloadWarning, match="broadcast against"):
        model = tp.build(mod, "accel, llvm")
    assert not [p for p in model.report.partitions if p.pattern == "accel.elementwise"]
    reasons = " ".join(h.reason for h in model.report.on_host)
    assert "the ALU broadcasts one value per row of the trailing dimensions" in reasons


def test_the_report_and_the_instructions():
    model = _build_and_compare(chain_module("multiply", (1, 24, 5, 5), (1, 24, 1, 1), (0.01,)), 0)
    _on_accel(model)
    text = model.report.text(verbose=True)
    assert "accel.elementwise" in text and "ran on the host" not in text
    stats = model.stats["accel"]
    # per call, a widening each into an accumulator zeroed by a LOAD of padding: a DWMAC (the full
    # operand), a GEMM by the ones column (the per-channel one); the product and the requantise on
    # the ALU; LOADs: 3 weights (padding), 2 zeroings, 2 operands
    assert stats.instructions["DWMAC"] == 1 and stats.instructions["GEMM"] == 1
    assert stats.instructions["LOAD"] == 7
    assert stats.instructions["ALU"] == 4
    # the widening's products: 24 rows of 25 (32 padded) elements are 3 DWMAC tiles, 24 per-channel
    # values 2 GEMM tiles
    assert stats.macs == 3 * 16**2 + 2 * 16**3


@settings(max_examples=3, deadline=None)
@given(st.integers(0, 2**16), st.floats(0.02, 0.2), st.integers(-20, 20))
def test_qdq_conv_residual_add_and_squeeze_excitation_multiply_end_on_accel(seed, sc, zc):
    """A QDQ model: a convolution, the Add of its quantised output and the quantised input (a
    residual), then the Mul by a quantised per-channel scale (squeeze-excitation's): the
    convolution and both element-wise operations run on accel, bit for bit llvm's result of
    the integerised module, no add or multiply left on the host."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(seed)
    const = lambda v, n: numpy_helper.from_array(np.asarray(v), n)  # noqa: E731

    def qdq(name, out, s, z):
        return ([helper.make_node("QuantizeLinear", [name, f"{out}_s", f"{out}_z"], [f"{out}_q"]),
                 helper.make_node("DequantizeLinear", [f"{out}_q", f"{out}_s", f"{out}_z"], [out])],
                [const(np.float32(s), f"{out}_s"), const(np.int8(z), f"{out}_z")])

    nodes, inits = [], []
    for part in (qdq("x", "xd", 0.02, 0), qdq("s", "sd", 1 / 255, -128)):
        nodes, inits = nodes + part[0], inits + part[1]
    inits += [const(rng.integers(-127, 128, (8, 8, 3, 3)).astype(np.int8), "w_q"),
              const(np.float32(0.01), "w_s"), const(np.int8(0), "w_z")]
    nodes += [helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"]),
              helper.make_node("Conv", ["xd", "w"], ["c"], pads=[1, 1, 1, 1])]
    for part in (qdq("c", "cd", sc, zc),
                 ([helper.make_node("Add", ["cd", "xd"], ["r"])], []),
                 qdq("r", "rd", sc, zc),
                 ([helper.make_node("Mul", ["rd", "sd"], ["m"])], []),
                 qdq("m", "y", sc, zc)):
        nodes, inits = nodes + part[0], inits + part[1]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8]),
                                       helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 8, 1, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    mod = from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), keep_params_in_input=False)
    x = rng.normal(0, 1, (1, 8, 8, 8)).astype(np.float32)
    s = rng.uniform(0, 1, (1, 8, 1, 1)).astype(np.float32)
    model = assert_matches_llvm(mod, "accel, llvm", inputs=[x, s], reference=tp.integerize()(mod))
    report = model.report.to_json()
    elementwise = [p for p in report["partitions"] if p["pattern"] == "accel.elementwise"]
    assert len(elementwise) == 2 and all(p["rules"].get("accel.elementwise") for p in elementwise), \
        report["partitions"]
    host = [h["op"] for h in report["on_host"]]
    assert not {"relax.add", "relax.multiply", "relax.right_shift"} & set(host), report["on_host"]
    assert report["macs"]["host"] == 0


def test_a_widened_input_shared_with_a_sum_is_widened_again_for_the_chain():
    """integerize widens a squeeze-excitation's input once for the average pool's sum and the
    scaling multiply; accel's ``widen_per_use`` gives the multiply a cast of its own, so the
    chain is one element-wise partition (and the sum another: a convolution), bit-exact."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((1, 8, 6, 6), "int8"))
    s = relax.Var("s", relax.TensorType((1, 8, 1, 1), "int8"))
    with bb.function("main", [a, s]):
        with bb.dataflow():
            wide = bb.emit(relax.op.astype(a, "int32"))
            total = bb.emit(relax.op.sum(wide, axis=[2, 3], keepdims=True))
            product = relax.op.multiply(wide, relax.op.astype(s, "int32"))
            rq = Requantize.choose([0.003], [128 * 128])
            out = bb.emit(emit_requantize([product], rq))
            result = bb.emit_output(relax.Tuple([out, total]))
        bb.emit_func_output(result)
    model = assert_matches_llvm(bb.get(), "accel, llvm", seed=5)
    report = model.report.to_json()
    # the sum is accel's too (a convolution by ones), each with a cast of its own
    assert sorted(p["pattern"] for p in report["partitions"]) == ["accel.conv2d", "accel.elementwise"], \
        report["partitions"]
    assert not report["on_host"], report["on_host"]


def test_a_chain_whose_rows_do_not_fit_acc_runs_on_the_host_and_says_why():
    """One row of a per-channel chain (the trailing dimensions' 12,000 elements) needs more than
    a 64 KiB ACC: the partition runs on the CPU, still llvm's result, and the report says why."""
    mod = chain_module("multiply", (1, 2, 1, 12000), (1, 2, 1, 1), (0.01,))
    with pytest.warns(tp.OffloadWarning, match="does not fit ACC"):
        model = tp.build(mod, "accel -acc_bytes=65536, llvm")
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    rng = np.random.default_rng(2)
    args = [rng.integers(-128, 128, s, dtype=np.int8) for s in ((1, 2, 1, 12000), (1, 2, 1, 1))]
    np.testing.assert_array_equal(model(*args), vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy())
    assert "does not fit ACC" in model.report.text(verbose=True)
