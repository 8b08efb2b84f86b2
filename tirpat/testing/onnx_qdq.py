"""Small QDQ ONNX graphs written by hand, for tests of how a backend takes quantised operators.

A quantiser (``tp.quantize``, onnxruntime's) leaves a float operator between
``DequantizeLinear`` nodes of its int8 inputs and a ``QuantizeLinear`` -> ``DequantizeLinear``
pair on its output. :func:`qdq` writes such a pair for a tensor, :func:`dequantized` a
constant stored quantised (a weight, a bias), and :func:`qdq_model` makes the model of the
nodes, with float inputs and one float output ``y``. Each returns ``onnx.helper`` objects;
names are derived from the output's (``{out}_q``, ``{out}_s``, ``{out}_z``), so a test's
graph reads as the operators it chains. Needs the ``model`` extra (onnx).

>>> from onnx import helper
>>> xq, xi = qdq("x", "xd", 0.02, 3)
>>> wq, wi = dequantized("w", np.ones((4, 2), np.int8), 0.01)
>>> yq, yi = qdq("m", "y", 0.05)
>>> model = qdq_model(xq + wq + [helper.make_node("MatMul", ["xd", "w"], ["m"])] + yq, xi + wi + yi, {"x": (3, 4)},
...                   (3, 2))
>>> [n.op_type for n in model.graph.node]
['QuantizeLinear', 'DequantizeLinear', 'DequantizeLinear', 'MatMul', 'QuantizeLinear', 'DequantizeLinear']
>>> sorted(i.name for i in model.graph.initializer)
['w_q', 'w_s', 'w_z', 'xd_s', 'xd_z', 'y_s', 'y_z']
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["qdq", "dequantized", "qdq_model"]


def qdq(name: str, out: str, scale: float, zero_point: int = 0) -> tuple[list, list]:
    """The nodes and initialisers of ``QuantizeLinear`` of the float tensor ``name`` to int8
    (per tensor, at ``scale`` and ``zero_point``), then ``DequantizeLinear`` of that to the
    float tensor ``out``.

    >>> nodes, inits = qdq("c", "cd", 0.1, -4)
    >>> [(n.op_type, list(n.input), list(n.output)) for n in nodes]
    [('QuantizeLinear', ['c', 'cd_s', 'cd_z'], ['cd_q']), ('DequantizeLinear', ['cd_q', 'cd_s', 'cd_z'], ['cd'])]
    """
    from onnx import helper, numpy_helper

    if not -128 <= zero_point <= 127:
        raise ValueError(f"qdq: zero point {zero_point} of {out!r} is not an int8 value")
    nodes = [helper.make_node("QuantizeLinear", [name, f"{out}_s", f"{out}_z"], [f"{out}_q"]),
             helper.make_node("DequantizeLinear", [f"{out}_q", f"{out}_s", f"{out}_z"], [out])]
    inits = [numpy_helper.from_array(np.array(scale, np.float32), f"{out}_s"),
             numpy_helper.from_array(np.array(zero_point, np.int8), f"{out}_z")]
    return nodes, inits


def dequantized(out: str, q: np.ndarray, scale, zero_point=0, *, axis: int | None = None) -> tuple[list, list]:
    """The node and initialisers of ``DequantizeLinear`` of the constant ``q`` (int8, or int32
    for a bias) to the float tensor ``out``: ``scale`` and ``zero_point`` are scalars (per
    tensor) or, with ``axis``, one value per channel along it (the zero points in ``q``'s
    dtype).

    >>> nodes, inits = dequantized("b", np.arange(3, dtype=np.int32), [0.1, 0.2, 0.3], axis=0)
    >>> [(i.name, i.data_type, list(i.dims)) for i in inits]     # int32 = 6, float = 1
    [('b_q', 6, [3]), ('b_s', 1, [3]), ('b_z', 6, [3])]
    """
    from onnx import helper, numpy_helper

    q = np.asarray(q)
    if q.dtype not in (np.int8, np.int32):
        raise TypeError(f"dequantized: {out!r} is stored as {q.dtype}, not int8 or int32")
    scale = np.asarray(scale, np.float32)
    zero_point = np.broadcast_to(np.asarray(zero_point), scale.shape).astype(q.dtype)
    if scale.ndim > 1 or (scale.ndim == 1 and axis is None):
        raise ValueError(f"dequantized: {out!r} has {scale.size} scales; per-channel scales need an axis")
    node = helper.make_node("DequantizeLinear", [f"{out}_q", f"{out}_s", f"{out}_z"], [out],
                            **({} if axis is None else {"axis": axis}))
    inits = [numpy_helper.from_array(q, f"{out}_q"), numpy_helper.from_array(scale, f"{out}_s"),
             numpy_helper.from_array(zero_point, f"{out}_z")]
    return [node], inits


def qdq_model(nodes: list, inits: list, inputs: dict[str, Sequence[int]], out_shape: Sequence[int] | None,
              *, opset: int = 17):
    """The ONNX model of ``nodes`` and ``inits``: ``inputs`` maps each float input's name to
    its shape; the output is the float tensor ``y``, of ``out_shape`` (None: unknown).

    >>> from onnx import helper
    >>> model = qdq_model([helper.make_node("Relu", ["x"], ["y"])], [], {"x": (2, 3)}, None)
    >>> [i.name for i in model.graph.input], model.opset_import[0].version
    (['x'], 17)
    """
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v))
                                             for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             None if out_shape is None else list(out_shape))],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
