"""accel's matmul with a second operand computed at run time (attention's ``Q K^T`` and
``softmax V``): the GEMM LOADs it as WGT by DMA from the host buffer on every call, nothing
prepacked at build time. Bit-exact with llvm on successive calls with new operands, alone
and in a QDQ attention block imported from ONNX."""

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import tirpat as tp
from tirpat.model.integerize.fixed_point import Requantize
from tirpat.model.integerize.rules import emit_requantize
from tirpat.testing.differential import assert_matches_llvm, random_inputs
from tirpat.testing.onnx_qdq import qdq, qdq_model


def dynamic_matmul(batch: tuple, m: int, k: int, n: int, transposed: bool, real: float) -> tvm.IRModule:
    """``requantise(matmul(a, b))`` of two int8 parameters; ``b`` is ``[.., n, k]`` read
    through ``permute_dims`` when ``transposed`` (the importer's form of ``Q K^T``)."""
    a = relax.Var("a", relax.TensorType((*batch, m, k), "int8"))
    b = relax.Var("b", relax.TensorType((*batch, n, k) if transposed else (*batch, k, n), "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b]):
        with bb.dataflow():
            rhs = b
            if transposed:
                axes = list(range(len(batch) + 2))
                axes[-2:] = axes[-1], axes[-2]
                rhs = bb.emit(relax.op.permute_dims(b, axes))
            acc = bb.emit(relax.op.matmul(a, rhs, out_dtype="int32"))
            rq = Requantize.choose([real], [k * 128 * 128])
            out = bb.emit_output(bb.emit(emit_requantize([acc], rq)))
        bb.emit_func_output(out)
    return bb.get()


def matmuls_on_accel(model, count: int) -> None:
    report = model.report.to_json()
    parts = [p for p in report["partitions"] if p["pattern"] == "accel.matmul"]
    assert len(parts) == count, report["partitions"]
    assert report["macs"]["host"] == 0, report["on_host"]


@settings(max_examples=8, deadline=None)
@given(st.sampled_from([(), (2,), (1, 3)]), st.integers(1, 40), st.integers(1, 48), st.integers(1, 40),
       st.booleans(), st.floats(0.0005, 0.05), st.integers(0, 2**16))
def test_a_runtime_second_operand_is_loaded_on_every_call(batch, m, k, n, transposed, real, seed):
    """Two calls with new ``a`` and ``b`` each: both bit-exact with llvm (a ``b`` kept from the
    first call, as a prepacked weight would be, gives the first call's product)."""
    mod = dynamic_matmul(batch, m, k, n, transposed, real)
    rng = np.random.default_rng(seed)
    model = assert_matches_llvm(mod, "accel, llvm", calls=2, inputs=lambda _: random_inputs(mod, rng))
    matmuls_on_accel(model, 1)


def attention(heads: int, length: int, depth: int, scales: dict):
    """A QDQ attention block as a per-tensor quantiser writes it: ``softmax(Q K^T)`` then
    times ``V``, each tensor quantised to int8 (K transposed after its DequantizeLinear)."""
    pytest.importorskip("onnx")
    from onnx import helper

    nodes, inits = [], []

    def quantised(name, out):
        more_nodes, more_inits = qdq(name, out, *scales[out])
        nodes.extend(more_nodes)
        inits.extend(more_inits)

    for name in ("q", "k", "v"):
        quantised(name, f"{name}d")
    nodes += [helper.make_node("Transpose", ["kd"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["qd", "kt"], ["s"])]
    quantised("s", "sd")
    nodes.append(helper.make_node("Softmax", ["sd"], ["p"], axis=-1))
    quantised("p", "pd")
    nodes.append(helper.make_node("MatMul", ["pd", "vd"], ["o"]))
    quantised("o", "y")
    shape = (1, heads, length, depth)
    return qdq_model(nodes, inits, {n: shape for n in ("q", "k", "v")}, shape)


@pytest.mark.parametrize("zero_points", [False, True], ids=["symmetric", "asymmetric"])
def test_a_qdq_attention_block_ends_with_its_matmuls_on_accel(zero_points):
    """Q K^T and softmax x V of a QDQ attention block both run on accel (no MAC on the host,
    the softmax between them in float on the host), bit for bit llvm's result of the
    integerised module over two calls."""
    pytest.importorskip("onnx")
    from tvm.relax.frontend.onnx import from_onnx

    z = (lambda v: v) if zero_points else (lambda v: 0)
    scales = {"qd": (0.05, z(7)), "kd": (0.04, z(-5)), "vd": (0.06, z(3)), "sd": (0.3, z(-2)),
              "pd": (1 / 255, -128), "y": (0.05, z(1))}
    mod = from_onnx(attention(2, 24, 16, scales), keep_params_in_input=False)
    rng = np.random.default_rng(0)
    q_k_v = lambda _: [rng.normal(0, 2, (1, 2, 24, 16)).astype(np.float32) for _ in range(3)]  # noqa: E731
    model = assert_matches_llvm(mod, "accel, llvm", calls=2, inputs=q_k_v, reference=tp.integerize()(mod))
    matmuls_on_accel(model, 2)


@pytest.mark.parametrize("axes", [[0, 2, 3, 1], [2, 0, 3, 1]])
def test_an_operand_permuted_across_its_batch_axes_is_read_as_rows(axes):
    """``K^T`` as a head split writes it (``[1, L, H, D]`` read through axes ``[0, 2, 3, 1]``):
    permuted on the host to ``[1, H, L, D]``, the GEMM reads it transposed; on accel, bit for
    bit llvm's result over two calls."""
    source = [1, 40, 8, 15]
    a = relax.Var("a", relax.TensorType((1, 8, 40, 15) if axes[0] == 0 else (8, 1, 40, 15), "int8"))
    b = relax.Var("b", relax.TensorType(source, "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [a, b]):
        with bb.dataflow():
            acc = bb.emit(relax.op.matmul(a, bb.emit(relax.op.permute_dims(b, axes)), out_dtype="int32"))
            out = bb.emit_output(bb.emit(emit_requantize([acc], Requantize.choose([0.003], [15 * 128 * 128]))))
        bb.emit_func_output(out)
    mod = bb.get()
    rng = np.random.default_rng(1)
    model = assert_matches_llvm(mod, "accel, llvm", calls=2, inputs=lambda _: random_inputs(mod, rng))
    matmuls_on_accel(model, 1)
