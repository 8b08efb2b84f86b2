"""tirpat.testing.onnx_qdq: the QDQ pieces the tests write compute the QDQ formula (run by
onnxruntime's exact QDQ session, checked against numpy), and bad arguments are named."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import helper  # noqa: E402

from tirpat.testing.onnx_qdq import dequantized, qdq, qdq_model  # noqa: E402
from tirpat.testing.ort_session import exact_session  # noqa: E402


@settings(max_examples=20)
@given(st.floats(1e-3, 1.0), st.integers(-128, 127), st.integers(0, 2**16))
def test_qdq_then_a_per_channel_constant_computes_the_qdq_formula(scale, zero_point, seed):
    """``dq(q(x)) + dq(c)``: saturating round-half-even quantise, then dequantise; ``c``
    per channel along axis 1."""
    rng = np.random.default_rng(seed)
    c = rng.integers(-128, 128, (1, 3, 1)).astype(np.int8)
    sc = rng.uniform(0.01, 0.1, 3).astype(np.float32)
    nodes, inits = qdq("x", "xd", scale, zero_point)
    cq, ci = dequantized("c", c.reshape(3), sc, axis=0)
    model = qdq_model(nodes + cq + [helper.make_node("Unsqueeze", ["c", "axes"], ["cu"]),
                                    helper.make_node("Add", ["xd", "cu"], ["y"])],
                      inits + ci + [helper.make_tensor("axes", 7, [2], [0, 2])], {"x": (2, 3, 4)}, (2, 3, 4))
    x = rng.normal(0, 200 * scale, (2, 3, 4)).astype(np.float32)
    (got,) = exact_session(model).run(None, {"x": x})
    s = np.float32(scale)
    q = np.clip(np.round(x / s) + zero_point, -128, 127)
    expected = (q - zero_point).astype(np.float32) * s + c.astype(np.float32) * sc.reshape(1, 3, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="zero point 200 of 'xd'"):
        qdq("x", "xd", 0.1, 200)
    with pytest.raises(TypeError, match="'w' is stored as float32"):
        dequantized("w", np.ones(3, np.float32), 0.1)
    with pytest.raises(ValueError, match="'w' has 3 scales; per-channel scales need an axis"):
        dequantized("w", np.ones(3, np.int8), [0.1, 0.2, 0.3])
