"""Element-wise operations of two int8 tensors on accel (:mod:`accel.compiler.elementwise`):
the add, subtract and multiply :mod:`tirpat.model.integerize` writes (rescaled operands,
requantise), with operands of the output's shape, one value per row of the trailing
dimensions (a squeeze-excitation's ``[1, C, 1, 1]``), one row repeated (a per-channel ``[C]``
of a ``[1, L, C]`` tensor: a bias row) or one value in all, built by
``tp.build(..., "accel, llvm")`` bit-exact against ``tvm.compile(..., "llvm")`` of the same
module over three calls (the third replays the simulator's batched plan); what stays on the
host says why."""


import numpy as np
import pytest
import tvm
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from tvm import relax

import tirpat as tp
from tirpat.model.integerize.fixed_point import Requantize
from tirpat.model.integerize.rules import emit_requantize, emit_table
from tirpat.testing.differential import assert_matches_llvm
from tirpat.testing.onnx_qdq import dequantized, qdq, qdq_model


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


def _on_accel(model, alu: bool = True) -> None:
    report = model.report.to_json()
    parts = [p for p in report["partitions"] if p["pattern"] == "accel.elementwise"]
    assert len(parts) == 1 and parts[0]["rules"].get("accel.elementwise"), report["partitions"]
    assert not report["on_host"], report["on_host"]
    stats = model.stats["accel"]
    assert stats.instructions["ALU"] + stats.instructions["ALU_CHAIN"] >= alu and stats.instructions["STORE"] >= 1


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
@example((1, 8, 5, 5), 1.0, 1, 0, (-128, 127), 1)       # an exact multiplier with an input zero point
@example((1, 8, 5, 5), 0.5, 5, -2, (-128, 127), 1)      # (its offset added after the multiply)
@example((1, 8, 5, 5), 1.0, 0, 0, (-128, 127), 1)       # the identity: a copy, no ALU step
def test_a_rescale_of_one_int8_tensor_on_accel_is_bit_exact(shape, real, zx, zy, bounds, seed):
    identity = zx == zy and real in (None, 1.0) and bounds == (-128, 127)
    _on_accel(_build_and_compare(rescale_module(shape, real, zx, zy, bounds), seed), alu=not identity)


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


@pytest.mark.parametrize("shape_b", [(1, 8, 1, 4), (8, 1, 4)])
def test_an_operand_no_row_layout_takes_stays_on_the_host_and_says_why(shape_b):
    """``[1, 8, 1, 4]`` against ``[1, 8, 4, 4]`` varies along the channels and the columns but
    not the rows of an image: no split into rows makes it one value per row or one row
    repeated, which is all the ALU's two strides can broadcast."""
    mod = chain_module("add", (1, 8, 4, 4), shape_b, (0.5, 0.3))
    with pytest.warns(tp.OffloadWarning, match="broadcast against"):
        model = tp.build(mod, "accel, llvm")
    assert not [p for p in model.report.partitions if p.pattern == "accel.elementwise"]
    reasons = " ".join(h.reason for h in model.report.on_host)
    assert "no split of its dimensions into rows" in reasons and "one row repeated" in reasons


def test_operands_that_need_different_row_layouts_stay_on_the_host():
    """``[1, 8, 4, 1]`` is one value per row of an ``[8, 4]`` grid of rows of 4; ``[1, 1, 4, 4]``
    one row of 16 repeated for 8 rows: each alone is accel's, together no split into rows takes
    both, and the chain runs on the CPU (llvm's result)."""
    mod = chain_module("add", (1, 8, 4, 1), (1, 1, 4, 4), (0.5, 0.3))
    with pytest.warns(tp.OffloadWarning, match="no split of its dimensions"):
        model = tp.build(mod, "accel, llvm")
    assert not [p for p in model.report.partitions if p.pattern == "accel.elementwise"]
    for shapes in (((1, 8, 4, 4), (1, 8, 4, 1)), ((1, 8, 4, 4), (1, 1, 4, 4))):
        _on_accel(_build_and_compare(chain_module("add", *shapes, (0.5, 0.3)), 1))


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
    assert stats.instructions["ALU"] == 0 and stats.instructions["ALU_CHAIN"] == 1     # the 4 steps, one pass
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
    from onnx import helper
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    for part in (qdq("x", "xd", 0.02, 0), qdq("s", "sd", 1 / 255, -128),
                 dequantized("w", rng.integers(-127, 128, (8, 8, 3, 3)).astype(np.int8), 0.01),
                 ([helper.make_node("Conv", ["xd", "w"], ["c"], pads=[1, 1, 1, 1])], []),
                 qdq("c", "cd", sc, zc),
                 ([helper.make_node("Add", ["cd", "xd"], ["r"])], []),
                 qdq("r", "rd", sc, zc),
                 ([helper.make_node("Mul", ["rd", "sd"], ["m"])], []),
                 qdq("m", "y", sc, zc)):
        nodes, inits = nodes + part[0], inits + part[1]
    model = qdq_model(nodes, inits, {"x": (1, 8, 8, 8), "s": (1, 8, 1, 1)}, (1, 8, 8, 8))
    mod = from_onnx(model, keep_params_in_input=False)
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


def test_rows_too_long_for_acc_run_in_pieces_and_a_chain_no_tile_of_which_fits_stays_on_the_host():
    """One row of a per-channel chain (the trailing dimensions' 12,000 elements) needs more than
    a 64 KiB ACC: it runs in pieces of a row, still bit-exact; with an ACC of one tile the
    chain's two values never fit, and the partition runs on the CPU (llvm's result), saying why."""
    mod = chain_module("multiply", (1, 2, 1, 12000), (1, 2, 1, 1), (0.01,))
    model = _build_and_compare(mod, 2, "accel -acc_bytes=65536, llvm")
    _on_accel(model)
    # a row and its value take 12,256 of ACC's 16,384 elements, twice that with the loop's double
    # buffers: one row at a time, in 2 pieces of 6,000 elements, each LOADed, widened, multiplied by
    # its row's value (LOADed and widened again), requantised and STOREd
    stats = model.stats["accel"]
    assert stats.instructions["STORE"] == 4 and stats.instructions["DWMAC"] == 4 and stats.instructions["GEMM"] == 4
    with pytest.warns(tp.OffloadWarning, match="does not fit ACC"):
        model = assert_matches_llvm(mod, "accel -acc_bytes=1024, llvm", seed=2, quiet=False)
    assert "does not fit ACC" in model.report.text(verbose=True)


def _broadcast_shape(out: tuple, split: int, kind: str, drop: int) -> tuple:
    """An operand of ``kind`` against ``out`` split into rows at ``split``, with ``drop`` of its
    leading 1s left off (Relax broadcasts right-aligned: ``[C]`` against ``[1, L, C]``)."""
    shape = {"full": out, "row": out[:split] + (1,) * (len(out) - split),
             "column": (1,) * split + out[split:], "scalar": (1,) * len(out)}[kind]
    lead = next((i for i, d in enumerate(shape) if d != 1), len(shape))
    return shape[min(drop, lead, len(shape) - 1):]


_OUTS = st.sampled_from([(1, 40, 120), (1, 7, 33), (3, 40), (2, 5, 18), (1, 8, 4, 4), (1, 6, 1, 20), (4, 3, 2, 5),
                         (1, 3, 700), (130,)])


@settings(max_examples=16, deadline=None)
@given(st.sampled_from(["add", "subtract", "multiply"]), _OUTS, st.data(),
       st.sampled_from([("full", "column"), ("column", "full"), ("full", "row"), ("row", "column"),
                        ("column", "scalar"), ("column", "column"), ("full", "scalar")]),
       st.integers(0, 3), st.integers(-20, 20), st.integers(-20, 20), st.integers(-10, 10),
       st.sampled_from([(-128, 127), (0, 127), (-90, 100)]), st.booleans(), st.integers(0, 1000))
def test_operands_repeated_along_leading_dimensions_run_on_accel_bit_exact(op, out, data, kinds, drop, za, zb, zy,
                                                                           bounds, small, seed):
    """Every split of the result into rows, every pair of layouts (a whole tensor, one value per
    row, one row repeated, one value), operands of fewer dimensions, scratchpads so small that
    the rows run in blocks and pieces (and the rests of both; 8 ACC tiles: a chain's 4 values at
    most, double-buffered): on accel, llvm's result over three calls. The result's shape must be one of the operands' broadcast (integerize's rules give it
    one operand of that shape, these chains need not)."""
    split = data.draw(st.integers(0, len(out)))
    shapes = [_broadcast_shape(out, split, k, drop) for k in kinds]
    got = tuple(max(a, b) for a, b in zip(*(((1,) * (len(out) - len(s)) + s) for s in shapes)))
    assume(got == tuple(out))
    mod = chain_module(op, *shapes, (0.37, 0.81) if op != "multiply" else (0.004,), za, zb, zy, bounds)
    _on_accel(_build_and_compare(mod, seed, "accel -acc_bytes=8192 -inp_bytes=1024, llvm" if small else "accel, llvm"))


@settings(max_examples=10, deadline=None)
@given(_OUTS, st.data(), st.sampled_from(["add", "multiply"]), st.integers(0, 1000))
def test_any_broadcast_is_llvm_s_result_on_accel_or_on_the_host_with_the_reason(out, data, op, seed):
    """An operand broadcast along any set of the result's dimensions: on accel when some split
    into rows takes it (a value per row, a row), else on the CPU saying why; llvm's result either way."""
    keep = data.draw(st.lists(st.booleans(), min_size=len(out), max_size=len(out)))
    other = tuple(d if k else 1 for d, k in zip(out, keep))
    mod = chain_module(op, out, other, (0.5, 0.25) if op == "add" else (0.01,))
    model = _build_and_compare(mod, seed)
    live = [i for i, d in enumerate(out) if d != 1]
    varying = [keep[i] for i in live]
    # a layout exists iff the operand's live dimensions are "varying, then broadcast" or "broadcast,
    # then varying" (one switch at most), or everything is one kind
    switches = sum(a != b for a, b in zip(varying, varying[1:]))
    if switches <= 1:
        _on_accel(model)
    else:
        assert not [p for p in model.report.partitions if p.pattern == "accel.elementwise"]
        assert "no split of its dimensions into rows" in " ".join(h.reason for h in model.report.on_host)


def test_a_per_channel_row_of_a_sequence_is_widened_once_and_broadcast_by_the_alu():
    """``[1, 40, 120] * [120]`` (a LayerNorm's gamma after integerize): 40 rows of 120 (128
    padded) elements, the ``[120]`` one row widened by DWMAC and read by the ALU with a source
    stride of 0 between rows: no GEMM, no host step."""
    model = _build_and_compare(chain_module("multiply", (1, 40, 120), (120,), (0.004,)), 4)
    _on_accel(model)
    stats = model.stats["accel"]
    # 3 weight LOADs (padding), 2 zeroings, 2 operands; DWMAC widenings: 40 x 128 = 20 tiles, the row 1 tile
    assert stats.instructions["LOAD"] == 7 and stats.instructions["DWMAC"] == 2 and stats.instructions["GEMM"] == 0
    # the product, then MUL, ADD, SHR of the requantise: one ALU chain
    assert stats.instructions["ALU"] == 0 and stats.instructions["ALU_CHAIN"] == 1
    assert stats.macs == 21 * 16**2
    # the row read from DRAM once, not once per row; the chain walks 40 rows of 8 vectors once
    assert stats.bytes["dram_to_sram"] == 40 * 120 + 120 and stats.bytes["sram_to_dram"] == 40 * 120
    assert stats.busy["alu"] == 40 * 8 + 3 + 4       # a stage a step after the first, 4 cycles of issue


def test_a_bias_row_is_widened_once_for_all_blocks_of_rows():
    """``[1, 3, 700] + [700]`` with scratchpads of 4 ACC and 4 INP tiles: one row at a time, in 3
    pieces of 240 elements; each piece of the bias row is LOADed, widened and rescaled once, before
    the blocks of rows that read it (not once per row)."""
    model = _build_and_compare(chain_module("add", (1, 3, 700), (700,), (0.3, 0.6)), 0,
                               "accel -acc_bytes=4096 -inp_bytes=1024, llvm")
    _on_accel(model)
    stats = model.stats["accel"]
    assert stats.instructions["STORE"] == 9 and stats.instructions["DWMAC"] == 9 + 3
    assert stats.bytes["dram_to_sram"] == 3 * 700 + 700


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_qdq_per_channel_constant_of_a_sequence_runs_on_accel(op):
    """A QDQ model: ``x [1, L, C]`` Add (or Mul) a quantised per-channel constant ``[C]`` (a
    transformer's bias or LayerNorm gamma), then an Add of two such results: every element-wise
    operation on accel, bit for bit llvm's result of the integerised module."""
    pytest.importorskip("onnx")
    from onnx import helper
    from tvm.relax.frontend.onnx import from_onnx

    rng = np.random.default_rng(7)
    shape, C = (1, 24, 40), 40
    nodes, inits = [], []
    for part in (qdq("x", "xd", 0.03, 3),
                 dequantized("g", rng.integers(-127, 128, C).astype(np.int8), 0.01),
                 ([helper.make_node(op, ["xd", "g"], ["a"])], []),
                 qdq("a", "ad", 0.02, -4),
                 ([helper.make_node("Add", ["ad", "xd"], ["r"])], []),
                 qdq("r", "y", 0.05, 1)):
        nodes, inits = nodes + part[0], inits + part[1]
    mod = from_onnx(qdq_model(nodes, inits, {"x": shape}, shape), keep_params_in_input=False)
    x = rng.normal(0, 1, shape).astype(np.float32)
    model = assert_matches_llvm(mod, "accel, llvm", inputs=[x], reference=tp.integerize()(mod))
    report = model.report.to_json()
    elementwise = [p for p in report["partitions"] if p["pattern"] == "accel.elementwise"]
    assert len(elementwise) == 2 and all(p["rules"].get("accel.elementwise") for p in elementwise), \
        report["partitions"]
    host = {h["op"] for h in report["on_host"]}
    assert not {"relax.add", "relax.multiply", "relax.right_shift", "relax.astype", "relax.clip"} & host, \
        report["on_host"]


def table_module(shape, table: np.ndarray, chain: tuple | None = None) -> tvm.IRModule:
    """``main(a[, b])``: integerize's table activation ``take(table, astype(x, int32) + 128)`` of
    the int8 ``a`` itself, or (``chain``: ``(shape_b, reals, za, zb, zy, bounds)``) of the
    requantised sum of ``a`` and ``b``."""
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType(shape, "int8"))
    params = [a] if chain is None else [a, relax.Var("b", relax.TensorType(chain[0], "int8"))]
    with bb.function("main", params):
        with bb.dataflow():
            x = a
            if chain is not None:
                _, reals, za, zb, zy, bounds = chain
                rq = Requantize.choose(list(reals), [128, 128], *bounds, [za, zb], zy)
                x = emit_requantize([relax.op.astype(p, "int32") for p in params], rq)
            out = bb.emit_output(emit_table(x, table))
        bb.emit_func_output(out)
    return bb.get()


@settings(max_examples=8, deadline=None)
@given(st.sampled_from([(1, 8, 40, 15), (1, 40, 240), (1, 96, 1, 1), (7, 33)]), st.booleans(),
       st.sampled_from(["full", "column", "row"]), st.integers(-20, 20), st.sampled_from([(-128, 127), (-60, 90)]),
       st.integers(0, 2**16))
def test_a_table_activation_alone_or_after_the_chain_runs_on_lut_bit_exact(shape, after_chain, kind, zy, bounds, seed):
    """A table lookup of an int8 tensor (a sigmoid or GELU integerize tabulated after a reshape),
    or at the end of a requantised add (a bias row, a per-channel value, a whole tensor): one
    LUT per block of rows on the chain's result, the table LOADed into WGT once, no host step."""
    table = np.random.default_rng(seed).integers(-128, 128, 256).astype(np.int8)
    split = len(shape) - 1
    other = {"full": shape, "column": shape[split:], "row": shape[:split] + (1,)}[kind]
    chain = (other, (0.4, 0.7), 3, -5, zy, bounds) if after_chain else None
    model = _build_and_compare(table_module(shape, table, chain), seed)
    report = model.report.to_json()
    parts = [p for p in report["partitions"] if p["pattern"] == "accel.elementwise"]
    assert len(parts) == 1 and parts[0]["rules"].get("accel.elementwise") and not report["on_host"], report
    assert parts[0]["epilogue"][-1] == "table lookup" and ("add" in parts[0]["epilogue"]) == after_chain
    stats = model.stats["accel"]
    assert stats.instructions["LUT"] >= 1 and (stats.instructions["ALU"] + stats.instructions["ALU_CHAIN"] >= 1) == \
        after_chain
    # the table's 256 bytes come from DRAM once (with the operands'), beside the operands
    operands = int(np.prod(shape)) + (int(np.prod(other)) if after_chain else 0)
    assert stats.bytes["dram_to_sram"] == operands + 256


@pytest.mark.parametrize("table, offset, why", [(np.arange(256, dtype=np.int32), 128, "not 256 int8 entries"),
                                                (np.arange(128, dtype=np.int8), 0, "not 256 int8 entries"),
                                                (np.arange(-128, 128).astype(np.int8), 127, "not x \\+ 128")])
def test_a_take_the_lut_does_not_compute_stays_on_the_host_and_says_why(table, offset, why):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((1, 4, 16), "int8"))
    with bb.function("main", [a]):
        with bb.dataflow():
            index = relax.op.add(relax.op.astype(a, "int32"), relax.const(offset, "int32"))
            out = bb.emit_output(relax.op.take(relax.const(table), index, axis=0, mode="clip"))
        bb.emit_func_output(out)
    with pytest.warns(tp.OffloadWarning, match=why):
        model = assert_matches_llvm(bb.get(), "accel, llvm", quiet=False)
    assert not [p for p in model.report.partitions if p.pattern == "accel.elementwise"]


def test_a_product_two_chains_share_is_taken_by_both():
    """A C2f block (YOLO) rescales one half of a split by the same multiplier for its residual
    add and for its concat; common subexpression elimination leaves one ``astype(x) * m_hi``
    for both chains, which leaked out of either partition (both stayed on the host).
    ``widen_per_use`` gives each chain its own product: both on accel, bit for bit llvm's."""
    bb = relax.BlockBuilder()
    x, y = (relax.Var(n, relax.TensorType((1, 8, 6, 6), "int8")) for n in "xy")

    def const(v):
        return relax.const(v, "int32")

    def precise(high, low):         # ((high + ((low) >> 25)) + 2**21) >> 22, as int8
        v = relax.op.add(relax.op.add(high, relax.op.right_shift(low, const(25))), const(2**21))
        return relax.op.astype(relax.op.clip(relax.op.right_shift(v, const(22)), -128, 127), "int8")

    with bb.function("main", [x, y]):
        with bb.dataflow():
            wx, wy = (relax.op.astype(v, "int32") for v in (x, y))
            alone = precise(relax.op.multiply(wx, const(3696935)), relax.op.multiply(wx, const(2510084)))
            summed = precise(relax.op.add(relax.op.multiply(wx, const(3696935)), relax.op.multiply(wy, const(1471831))),
                             relax.op.add(relax.op.multiply(wx, const(2510085)), relax.op.multiply(wy, const(13739617))))
            out = bb.emit_output(relax.Tuple([bb.emit(alone), bb.emit(summed)]))
        bb.emit_func_output(out)
    mod = relax.transform.EliminateCommonSubexpr()(relax.transform.Normalize()(bb.get()))
    assert mod.script().count("R.const(3696935") == 1, "the product is shared, as after an exporter's CSE"
    model = _build_and_compare(mod, 5)
    report = model.report.to_json()
    assert [p["pattern"] for p in report["partitions"]].count("accel.elementwise") == 2
    assert not report["on_host"], report["on_host"]


def test_a_chain_whose_intermediate_is_read_elsewhere_stays_on_the_host_and_says_why():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 6, 6), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            moved = bb.emit(relax.op.add(relax.op.astype(x, "int32"), relax.const(3, "int32")))
            out = relax.op.astype(relax.op.clip(moved, -128, 127), "int8")
            result = bb.emit_output(relax.Tuple([bb.emit(out), bb.emit(relax.op.multiply(moved, moved))]))
        bb.emit_func_output(result)
    model = _build_and_compare(bb.get(), 2)
    reasons = {h["op"]: h["reason"] for h in model.report.to_json()["on_host"]}
    assert "the chain's add" in reasons["relax.add"] and "is also read outside it" in reasons["relax.add"], reasons
