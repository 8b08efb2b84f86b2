"""A small float ONNX model with the traits of models exported by other frameworks.

Paddle's and PyTorch's exporters write what tirpat's own builders (:mod:`tirpat.testing.onnx_cnn`)
do not: an open batch (``dim_value: -1``, or a name), a Reshape whose new shape the graph
computes (``Shape -> Cast -> Slice -> Cast -> Concat``), a BatchNormalization after a Conv, and
old opsets (11). :func:`exported` builds one such classifier, with seeded weights, for tests of
``tirpat compile`` / ``tp.build`` and ``tirpat quantize`` on models as shipped. Needs the
``model`` extra (onnx).

>>> model = exported(opset=11)
>>> [d.dim_value or d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim]
[-1, 3, 8, 8]
>>> [n.op_type for n in model.graph.node]           # doctest: +NORMALIZE_WHITESPACE
['Conv', 'BatchNormalization', 'Relu', 'Shape', 'Cast', 'Constant', 'Constant', 'Slice', 'Cast',
 'Constant', 'Cast', 'Concat', 'Reshape', 'MatMul', 'Add']
"""

from __future__ import annotations

import numpy as np

__all__ = ["exported", "CHANNELS", "SIZE", "CLASSES"]

#: Input channels, spatial size (height = width) and classes of :func:`exported`.
CHANNELS, SIZE, CLASSES = 3, 8, 5
_FILTERS = 4


def exported(opset: int = 13, batch: int | str = -1, seed: int = 0):
    """``y = (Relu(BatchNorm(Conv(x))) reshaped to [batch, -1]) @ w + b`` as an
    ``onnx.ModelProto`` of ``opset`` (11 to 21), input ``x: [batch, 3, 8, 8]`` float32
    (``batch`` an int, ``-1`` as Paddle writes it, or a name), output ``y: [batch, 5]``. The
    Reshape's new shape is computed from the Relu's ``Shape`` (the batch) and ``[-1]``, in int32
    and cast back, as Paddle writes it. Nodes are
    named after their role (``conv``, ``bn``, ``relu``, ..., ``fc``, ``fc_bias``)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    consts = {
        "w_conv": rng.normal(0, np.sqrt(2 / (CHANNELS * 9)), (_FILTERS, CHANNELS, 3, 3)),
        "bn_scale": rng.uniform(0.5, 1.5, _FILTERS), "bn_bias": rng.normal(0, 0.1, _FILTERS),
        "bn_mean": rng.normal(0, 0.1, _FILTERS), "bn_var": rng.uniform(0.5, 1.5, _FILTERS),
        "w_fc": rng.normal(0, np.sqrt(1 / (_FILTERS * SIZE * SIZE)), (_FILTERS * SIZE * SIZE, CLASSES)),
        "b_fc": rng.normal(0, 0.1, CLASSES),
    }
    initialisers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in consts.items()]
    def constant(name: str, value: np.ndarray):
        return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value, name))

    nodes = [       # the new shape computed as Paddle's exporter writes it: [batch, -1]
        helper.make_node("Conv", ["x", "w_conv"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["b"], name="bn"),
        helper.make_node("Relu", ["b"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Cast", ["s"], ["s32"], name="shape_int32", to=TensorProto.INT32),
        constant("zero", np.array([0], np.int64)), constant("one", np.array([1], np.int64)),
        helper.make_node("Slice", ["s32", "zero", "one", "zero"], ["n32"], name="batch"),
        helper.make_node("Cast", ["n32"], ["n"], name="batch_int64", to=TensorProto.INT64),
        constant("rest32", np.array([-1], np.int32)),
        helper.make_node("Cast", ["rest32"], ["rest"], name="rest_int64", to=TensorProto.INT64),
        helper.make_node("Concat", ["n", "rest"], ["new_shape"], name="new_shape", axis=-1),
        helper.make_node("Reshape", ["r", "new_shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "w_fc"], ["m"], name="fc"),
        helper.make_node("Add", ["m", "b_fc"], ["y"], name="fc_bias"),
    ]
    graph = helper.make_graph(
        nodes, "exported", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, CHANNELS, SIZE, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, CLASSES])], initialisers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tirpat.testing")
    model.ir_version = min(model.ir_version, 8 if opset <= 17 else 10)    # what onnxruntime reads for that opset
    return model
