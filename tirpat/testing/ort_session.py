"""onnxruntime sessions for references: the exact one for accuracy, the fused one for speed.

onnxruntime's default session (graph optimisation ``ORT_ENABLE_ALL``) fuses a QDQ model's
DequantizeLinear -> Conv/Gemm -> QuantizeLinear groups into its int8 kernels (QLinearConv,
QGemm, QLinearAveragePool, ...). Their result depends on the CPU: on x86-64 with AVX2 but no
VNNI (AMD znver1, for one) the u8s8 path multiplies with ``vpmaddubsw``, whose int16 pair sums
saturate, and a small CNN's output lands tens of quantisation steps off the model's QDQ
semantics; with VNNI it does not. With graph optimisation at ``ORT_ENABLE_BASIC`` (constant
folding and redundant-node removal only) onnxruntime runs each operator as the model writes
it, dequantise, float operator, quantise, which is the QDQ semantics on every CPU. So every
accuracy test compares with :func:`exact_session`; :func:`fused_session` exists for
benchmarks, as a speed reference, never as a reference for values. Needs the ``model`` extra.

>>> from tirpat.testing import onnx_cnn
>>> model = onnx_cnn.conv_relu(seed=0, channels=4)
>>> session = exact_session(model)
>>> session.get_session_options().graph_optimization_level == EXACT_LEVEL
True
>>> x = onnx_cnn.calibration(model, 1)["x"][0]       # one input, [1, 3, 16, 16]
>>> session.run(None, {"x": x})[0].shape
(1, 10)
"""

from __future__ import annotations

import os

import onnxruntime as ort

__all__ = ["EXACT_LEVEL", "exact_session", "fused_session"]

#: The graph optimisation level of :func:`exact_session`: no fusion into int8 kernels.
EXACT_LEVEL = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


def _session(model, level: ort.GraphOptimizationLevel, threads: int | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    if threads is not None:
        options.intra_op_num_threads = threads
    source = model if isinstance(model, (str, bytes, os.PathLike)) else model.SerializeToString()
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def exact_session(model) -> ort.InferenceSession:
    """onnxruntime's exact execution of ``model``: each operator as written, the reference for
    accuracy on every CPU.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or path
        The model (a QDQ model, or a float one).

    Returns
    -------
    onnxruntime.InferenceSession
        On the CPU execution provider, with graph optimisation at :data:`EXACT_LEVEL`
        (``ORT_ENABLE_BASIC``): a QDQ model computes dequantise, float operator, quantise,
        never a fused int8 kernel, whose result differs by CPU (see the module's docstring).
    """
    return _session(model, EXACT_LEVEL)


def fused_session(model, threads: int | None = None) -> ort.InferenceSession:
    """onnxruntime's default session on ``model``, which fuses QDQ groups into int8 kernels: a
    speed reference only. Its values depend on the CPU (int16 saturation without VNNI), so
    compare values with :func:`exact_session`.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or path
        The model.
    threads : int, optional
        onnxruntime's intra-op threads (its default when None); speed references use 1.

    Returns
    -------
    onnxruntime.InferenceSession
        On the CPU execution provider, with graph optimisation at ``ORT_ENABLE_ALL``.
    """
    return _session(model, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads)
