"""A batch of matrices times one constant weight (``[1, L, K] x [K, N]``: a transformer's
linear layers, as ONNX MatMul writes them): tp.integerize computes it on the rows flattened
to 2-D, so accel takes it as one GEMM with its bias and requantise, bit for bit llvm's
result of the integerised module and within one step of onnxruntime's exact QDQ run."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tvm  # noqa: E402
from onnx import helper  # noqa: E402
from tvm import relax  # noqa: E402
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.testing.onnx_qdq import dequantized, qdq, qdq_model  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402


def linear(batch: tuple, k: int, n: int, zx: int, seed: int):
    """``q(MatMul(dq(q(x)), dq(w)) + dq(bias))`` with ``x`` of shape ``[*batch, k]``."""
    rng = np.random.default_rng(seed)
    sx, sw, sy = 0.05, 0.01, 0.08
    xq, xi = qdq("x", "xd", sx, zx)
    wq, wi = dequantized("w", rng.integers(-127, 128, (k, n)).astype(np.int8), sw)
    bq, bi = dequantized("b", rng.integers(-500, 500, n).astype(np.int32), sx * sw)
    yq, yi = qdq("s", "y", sy)
    nodes = xq + wq + bq + [helper.make_node("MatMul", ["xd", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["s"])]
    return qdq_model(nodes + yq, xi + wi + bi + yi, {"x": (*batch, k)}, (*batch, n)), sy


@settings(max_examples=6, deadline=None)
@given(st.sampled_from([(1, 40), (2, 7), (1, 3, 5)]), st.integers(1, 64), st.integers(1, 48),
       st.integers(-20, 20), st.integers(0, 2**16))
def test_a_batch_of_rows_times_one_weight_is_one_gemm_on_accel(batch, k, n, zx, seed):
    model, sy = linear(batch, k, n, zx, seed)
    mod = from_onnx(model, keep_params_in_input=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = tp.build(mod, "accel, llvm")
        integer = tp.integerize()(mod)
    report = built.report.to_json()
    assert [p["pattern"] for p in report["partitions"]] == ["accel.matmul"], report["partitions"]
    assert report["macs"]["host"] == 0, report["on_host"]
    vm = relax.VirtualMachine(tvm.compile(integer, "llvm"), tvm.cpu())
    rng = np.random.default_rng(seed)
    for _ in range(2):
        x = rng.normal(0, 3, (*batch, k)).astype(np.float32)
        want = vm["main"](tvm.runtime.tensor(x)).numpy()
        got = built(x)
        np.testing.assert_array_equal(got, want)
        ref = exact_session(model).run(None, {"x": x})[0]
        assert got.shape == ref.shape
        assert np.abs(np.rint((got.astype(np.float64) - ref) / np.float64(np.float32(sy)))).max() <= 1
