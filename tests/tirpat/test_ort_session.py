"""tirpat.testing.ort_session: the onnxruntime reference of every accuracy test is its exact QDQ
execution, which holds on every x86-64 CPU, never the fused int8 kernels, which saturate on
CPUs without VNNI (this machine may have VNNI: the checks below do not depend on it)."""

import collections
import doctest
import pathlib
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import version_converter  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tirpat as tp  # noqa: E402
from tirpat.testing import onnx_cnn, ort_session  # noqa: E402
from tirpat.testing.ort_session import exact_session, fused_session  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def qdq():
    """The model on which onnxruntime's fused kernels are 89 output steps off on AMD znver1
    (``ort_fused_int8_saturates.py`` of issue 21): per-channel residual CNN, seed 4."""
    model = onnx_cnn.residual(seed=4, channels=8)
    return tp.quantize(model, onnx_cnn.calibration(model, 16), per_channel=True)


def test_docstring_examples():
    result = doctest.testmod(ort_session, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def operators_run(model, level, tmp_path) -> collections.Counter:
    """The operators onnxruntime runs for ``model`` at graph optimisation ``level``: its
    optimised graph, as the session saves it."""
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(tmp_path / f"optimised-{int(level)}.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)


def test_exact_session_runs_the_operators_as_written(qdq, tmp_path):
    """At the exact session's level onnxruntime runs the model's own operators (dequantise,
    float Conv/Gemm/pools, quantise); at the fused session's it runs int8 kernels instead,
    which is what the exact session must never do."""
    level = exact_session(qdq).get_session_options().graph_optimization_level
    assert int(level) <= int(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    written = {n.op_type for n in qdq.graph.node}
    assert set(operators_run(qdq, level, tmp_path)) == written
    fused_level = fused_session(qdq).get_session_options().graph_optimization_level
    fused = set(operators_run(qdq, fused_level, tmp_path))
    assert {"QLinearConv", "QGemm"} <= fused - written, fused


def test_exact_session_computes_the_qdq_semantics(qdq):
    """Within one output step of onnx's numpy evaluation of the QDQ model on every element
    (float32 sums in another order may move a value across a rounding boundary, never
    further); onnxruntime's fused int8 kernels are up to 89 steps off it on AMD znver1."""
    reference = ReferenceEvaluator(version_converter.convert_version(qdq, 21))   # its DequantizeLinear is opset 19+
    session, step = exact_session(qdq), onnx_cnn.output_scale(qdq)
    for x in onnx_cnn.calibration(qdq, 8, seed=5)["x"]:
        expected = reference.run(None, {"x": x})[0].astype(np.float64)
        assert np.abs(session.run(None, {"x": x})[0] - expected).max() <= 1.001 * step


def test_exact_session_takes_a_path_and_bytes(qdq, tmp_path):
    onnx.save(qdq, str(tmp_path / "q.onnx"))
    x = {"x": onnx_cnn.calibration(qdq, 1, seed=3)["x"][0]}
    expected = exact_session(qdq).run(None, x)[0]
    for source in (tmp_path / "q.onnx", str(tmp_path / "q.onnx"), qdq.SerializeToString()):
        assert np.array_equal(exact_session(source).run(None, x)[0], expected)


def sources():
    """Where references are made: tests, benchmarks, examples, tirpat's testing helpers, and
    the code blocks of README.md and docs/."""
    for pattern in ("tests/**/*.py", "benchmarks/*.py", "examples/**/*.py", "tirpat/testing/*.py"):
        yield from sorted(ROOT.glob(pattern))
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").glob("*.md"))


def test_every_onnxruntime_session_is_made_by_the_helper():
    """No test, benchmark, example or doc makes its own onnxruntime session, which would be the
    default, fused one: they all go through ``exact_session`` (or ``fused_session`` for speed)."""
    helper = ROOT / "tirpat" / "testing" / "ort_session.py"
    making = re.compile(r"\bInferenceSession\s*\(")
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sources() if path not in (helper, pathlib.Path(__file__))
             for n, line in enumerate(path.read_text().splitlines(), 1) if making.search(line)]
    assert not found, f"make onnxruntime sessions with tirpat.testing.ort_session.exact_session: {found}"
