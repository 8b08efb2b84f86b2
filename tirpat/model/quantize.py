"""``tp.quantize``: a float ONNX model to int8 QDQ form, by onnxruntime's ``quantize_static``.

The output is what an int8 accelerator needs and what ``tp.integerize()`` turns into integer
arithmetic after TVM's ONNX import: QuantizeLinear/DequantizeLinear pairs around the float
operators, int8 activations and weights, symmetric (every zero point 0), int32 biases at
the scale ``s_input * s_weight``, per-tensor or per-output-channel weight scales.
onnxruntime's pre-processing runs first (shape inference, and its basic graph
optimisations, e.g. a BatchNormalization folded into the Conv before it). An open input
dimension (a name, ``?`` or Paddle's ``-1``) takes the calibration data's size. Per-channel
weight scales need DequantizeLinear's ``axis`` (opset 13): a model of an older opset is
upgraded by onnx's version converter first, so that the output loads in onnxruntime.

Nodes can be kept in float: by name (``exclude``), by operator type (``exclude_op_types``),
or as the producers of chosen graph outputs (``float_outputs``: a detector's head whose
boxes and scores share a tensor, whose scores one int8 scale would zero: ``tp.quantize``
warns of a Concat whose output scale leaves an input so few steps, naming the option).

Calibration data fixes the activation scales (MinMax by default: the largest magnitude seen
on each tensor). It is an ``.npz`` file, or a dict, keyed by input name, whose arrays have a
leading axis of samples, each sample of the input's shape: ``[16, 1, 3, 16, 16]`` for 16
samples of a ``[1, 3, 16, 16]`` input, of the input's dtype (a float array of another width is
converted, integers for a float input are refused) and finite. Without it, seeded random normal inputs are used and a
warning says that the scales then mean nothing for real data.

>>> import numpy as np, onnx
>>> from onnx import helper, numpy_helper, TensorProto
>>> w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
>>> graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
>>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
>>> calib = {"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 1, 4)}
>>> q = quantize(model, calib)
>>> sorted({n.op_type for n in q.graph.node})
['DequantizeLinear', 'MatMul', 'QuantizeLinear']
"""

from __future__ import annotations

import difflib
import os
import pathlib
import re
import tempfile
import warnings
from typing import Mapping, Sequence, Union

import numpy as np

from .npz import NotAnNpzError, load_npz
from .onnx_import import declare_inputs

__all__ = ["quantize", "CalibrationError", "calibration_samples", "quantised_operators", "METHODS"]

#: Calibration methods by name (onnxruntime's ``CalibrationMethod``).
METHODS = ("minmax", "entropy", "percentile")
#: Random calibration samples used when no calibration data is given.
RANDOM_SAMPLES = 16
#: A Concat input that its output's int8 scale holds in fewer steps than this is warned of
#: (the PaddleOCR models' Concats keep 27 steps or more; a detector's scores beside its box
#: coordinates under 1).
CONCAT_STEPS = 8
INT8_MAX = 127

ModelLike = Union[str, os.PathLike, "onnx.ModelProto"]  # noqa: F821 - onnx is optional
Calibration = Union[str, os.PathLike, Mapping[str, np.ndarray], None]


class CalibrationError(ValueError):
    """Calibration data that does not fit the model (names, shapes, dtypes, sample counts,
    NaN or infinite values)."""


#: Operators that only a model already quantised holds (QDQ pairs, or ONNX's and
#: onnxruntime's integer operators).
_QUANTISED_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
                           "QLinearMatMul", "QGemm", "ConvInteger", "MatMulInteger", "DynamicQuantizeMatMul"})


def _require():
    try:
        import onnx
        import onnxruntime.quantization as ortq
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(f"tp.quantize needs onnx and onnxruntime ({err.name} is missing): "
                          "pip install 'tirpat[model]'") from err
    return onnx, ortq


#: The opset DequantizeLinear's ``axis`` (per-channel scales) needs.
PER_CHANNEL_OPSET = 13


def quantize(model: ModelLike, calibration: Calibration = None, *, per_channel: bool = False,
             method: str = "minmax", exclude: Sequence[str] = (), exclude_op_types: Sequence[str] = (),
             float_outputs: Sequence[str] = ()) -> "onnx.ModelProto":  # noqa: F821
    """``model`` (a path or an ``onnx.ModelProto``) quantised to int8 QDQ form.

    Parameters
    ----------
    model
        A float ONNX model, as a path or a ``ModelProto``.
    calibration
        An ``.npz`` path or a dict ``{input name: array[samples, *input shape]}``; None
        calibrates on seeded random inputs (with a warning: the scales are then meaningless).
    per_channel
        One weight scale per output channel (else one per tensor).
    method
        ``"minmax"`` (default), ``"entropy"`` or ``"percentile"``.
    exclude
        Names of nodes to keep in float (onnxruntime's ``nodes_to_exclude``).
    exclude_op_types
        Operator types to keep in float (left out of onnxruntime's ``op_types_to_quantize``).
    float_outputs
        Graph outputs to keep in float: the nodes that produce them are not quantised.

    Returns the quantised ``onnx.ModelProto``. Raises ``FileNotFoundError`` for a missing
    file, :class:`CalibrationError` for calibration data that does not fit the model (or
    holds NaN or infinite values), ``ValueError`` for a model that is already quantised, for
    one onnxruntime cannot load (with its reason), for an unknown method, and for a node,
    operator type or output to keep in float that the model does not have (after
    onnxruntime's pre-processing, which may fuse nodes). Warns when an input's calibration data is zero everywhere (its
    scale would mean nothing), and when a Concat's output scale leaves one of its inputs fewer
    than :data:`CONCAT_STEPS` steps (a detector's scores beside its boxes: every score 0).
    """
    onnx, ortq = _require()
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    proto = _load(onnx, model)
    _refuse_quantised(proto)
    inputs = _graph_inputs(onnx, proto)
    proto = declare_inputs(proto, {})      # Paddle's -1 is an open dimension, not a size
    if per_channel:
        proto = _upgrade(onnx, proto, PER_CHANNEL_OPSET)
    with tempfile.TemporaryDirectory(prefix="tirpat-quantize-") as tmp:
        source, pre, out = (pathlib.Path(tmp, n) for n in ("float.onnx", "pre.onnx", "int8.onnx"))
        onnx.save(proto, str(source))     # onnxruntime's pre-processing may modify a ModelProto it is given
        _check_runnable(source)
        if calibration is None:
            samples = _random_samples(inputs)
            warnings.warn(f"no calibration data, so calibrating on {RANDOM_SAMPLES} seeded random "
                          "inputs: the activation scales are then meaningless for real data. Pass calibration "
                          "data (an .npz keyed by input name, leading axis of samples).", stacklevel=2)
        else:
            samples = calibration_samples(calibration, inputs)
        ortq.quant_pre_process(str(source), str(pre), skip_symbolic_shape=True)
        excluded, op_types = _kept_in_float(ortq, onnx.load(str(pre)), exclude, exclude_op_types, float_outputs)
        ortq.quantize_static(
            str(pre), str(out), _reader(ortq.CalibrationDataReader, samples),
            quant_format=ortq.QuantFormat.QDQ, per_channel=per_channel,
            activation_type=ortq.QuantType.QInt8, weight_type=ortq.QuantType.QInt8,
            calibrate_method={"minmax": ortq.CalibrationMethod.MinMax, "entropy": ortq.CalibrationMethod.Entropy,
                              "percentile": ortq.CalibrationMethod.Percentile}[method],
            nodes_to_exclude=excluded, op_types_to_quantize=op_types,
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
        quantised = onnx.load(str(out))
    _warn_lost_concat_inputs(quantised)
    return quantised


def _warn_lost_concat_inputs(q) -> None:
    """Warn when a Concat's input keeps fewer than :data:`CONCAT_STEPS` steps of the int8 scale
    the Concat's result is quantised with (after any element moves), naming the nodes to keep
    in float: a detector that concatenates box coordinates (0 to 640) and class scores (0 to 1)
    would quantise every score to 0, silently."""
    from onnx import numpy_helper

    named = {n.input[1] for n in q.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    scales = {i.name: float(np.abs(numpy_helper.to_array(i)).max()) for i in q.graph.initializer if i.name in named}
    producer = {o: n for n in q.graph.node for o in n.output}
    readers: dict[str, list] = {}
    for node in q.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    lost, keep = [], {}
    for node in q.graph.node:
        if node.op_type != "Concat":
            continue
        chain, step = _moves_until_quantised(node, readers)
        if step not in scales:
            continue
        for name in node.input:
            dq = producer.get(name)
            if dq is None or dq.op_type != "DequantizeLinear" or dq.input[1] not in scales:
                continue
            # the input's largest int8 magnitude, in the steps of the scale its values end in
            span = INT8_MAX * scales[dq.input[1]] / scales[step]
            if span < CONCAT_STEPS:
                source = producer.get(dq.input[0])     # the QuantizeLinear of the float tensor it names
                tensor = source.input[0] if source is not None and source.op_type == "QuantizeLinear" else name
                lost.append(f"the input {tensor!r} of Concat {node.name!r} (up to {INT8_MAX * scales[dq.input[1]]:.3g}: "
                            f"{span:.2g} steps of {scales[step]:.3g})")
                keep.update(dict.fromkeys(chain))
    if lost:
        names = list(keep)
        warnings.warn(f"{'; '.join(lost)}: at a scale made for larger values, such an input keeps a few int8 steps "
                      "at most (a value under half a step becomes 0), as a detector's scores beside its box "
                      f"coordinates do; keep them in float: exclude={names!r} (tirpat quantize --exclude "
                      f"{' '.join(names)})", stacklevel=3)


#: Operators that move elements: a tensor that holds two ranges holds them after these too.
_MOVES = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat"})


def _moves_until_quantised(concat, readers: dict) -> tuple[list[str], str | None]:
    """The names of ``concat`` and of the element moves after it up to the first int8 scale its
    values take or a graph output, each the only reader of the one before; and that scale's name
    (None where the values stay float)."""
    chain, step, tensor = [concat.name], None, concat.output[0]
    while len(readers.get(tensor, ())) == 1:
        node = readers[tensor][0]
        if node.op_type == "QuantizeLinear":
            step = step or node.input[1]
            dq = readers.get(node.output[0], ())
            if len(dq) != 1 or dq[0].op_type != "DequantizeLinear":
                break
            tensor = dq[0].output[0]
        elif node.op_type in _MOVES:
            chain.append(node.name)
            tensor = node.output[0]
        else:
            break
    return chain, step


def _upgrade(onnx, proto, opset: int):
    """``proto`` converted to ``opset`` by onnx's version converter if its default-domain
    opset is older (per-channel DequantizeLinear needs ``axis``, which came with opset 13)."""
    current = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), opset)
    if current >= opset:
        return proto
    from onnx import version_converter

    try:
        return version_converter.convert_version(proto, opset)
    except Exception as err:  # noqa: BLE001 - the converter raises several kinds
        raise ValueError(f"per-channel scales need opset {opset} (DequantizeLinear's axis); onnx's version "
                         f"converter cannot upgrade the model from opset {current}: {err}") from err


#: the most node names an error lists (a real model has hundreds)
_NODES_LISTED = 8


def _kept_in_float(ortq, pre, exclude, exclude_op_types, float_outputs) -> tuple[list[str], list[str] | None]:
    """onnxruntime's ``nodes_to_exclude`` and ``op_types_to_quantize`` (None: its default,
    every type it quantises) for the nodes, operator types and graph outputs to keep in
    float, checked against the pre-processed model ``pre``."""
    order = [n.name for n in pre.graph.node]
    names = set(order)
    unknown = [n for n in exclude if n not in names]
    if unknown:
        near = sorted({m for n in unknown for m in difflib.get_close_matches(n, order, n=3)})
        listed = ", ".join(map(repr, order[:_NODES_LISTED])) + (f", ... ({len(order)} in all)"
                                                               if len(order) > _NODES_LISTED else "")
        raise ValueError(f"no node named {', '.join(map(repr, unknown))} in the model (after onnxruntime's "
                         "pre-processing, which may fuse nodes: e.g. a BatchNormalization into its Conv); "
                         + (f"did you mean {', '.join(map(repr, near))}? " if near else "")
                         + f"its nodes are {listed}")
    types = {n.op_type for n in pre.graph.node}
    absent = [t for t in exclude_op_types if t not in types]
    if absent:
        raise ValueError(f"the model has no {', '.join(map(repr, absent))} node to keep in float (its operator "
                         f"types are {', '.join(sorted(types))})")
    outputs = [o.name for o in pre.graph.output]
    missing = [o for o in float_outputs if o not in outputs]
    if missing:
        raise ValueError(f"{', '.join(map(repr, missing))} is not an output of the model (its outputs are "
                         f"{', '.join(map(repr, outputs))})")
    producers = [n.name for n in pre.graph.node if any(o in float_outputs for o in n.output)]
    excluded = list(dict.fromkeys([*exclude, *producers]))
    if not exclude_op_types:
        return excluded, None
    quantisable = set(ortq.registry.QDQRegistry) | set(ortq.registry.QLinearOpsRegistry)
    inert = [t for t in exclude_op_types if t not in quantisable]
    if inert:
        raise ValueError(f"onnxruntime does not quantise {', '.join(map(repr, inert))} nodes (they stay in float "
                         "as they are); to keep a tensor they compute in float, exclude the node that computes "
                         "it, or name the output with float_outputs")
    op_types = sorted(quantisable - set(exclude_op_types))
    return excluded, op_types


def _load(onnx, model):
    if isinstance(model, onnx.ModelProto):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"the model must be a path or an onnx.ModelProto, got {type(model).__name__}")
    path = pathlib.Path(model)
    if not path.is_file():
        raise FileNotFoundError(f"no model file {str(path)!r}")
    try:
        return onnx.load(str(path))
    except Exception as err:  # noqa: BLE001 - protobuf raises several kinds
        raise ValueError(f"{str(path)!r} is not an ONNX model ({err})") from err


def _check_runnable(path: pathlib.Path) -> None:
    """A ``ValueError`` with onnxruntime's reason when it cannot load the model at ``path``
    (an operator of a domain it does not know, an opset newer than it supports): it runs the
    model to calibrate it. The session is made as ``quant_pre_process`` makes its own (basic
    graph optimisations), because that one, when it fails, prints a traceback and goes on."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 4          # its reason is in the exception; no log lines besides
    try:
        onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - onnxruntime raises its own exception kinds
        # its message starts "[ONNXRuntimeError] : 1 : FAIL : Load model from /tmp/... failed:"
        # and may go on with the C++ source line and function that raised it
        reason = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : (Load model from .* failed: ?)?", "",
                        " ".join(str(err).split()))
        reason = re.sub(r"^/\S+:\d+ [^(]*\([^)]*\)\s*", "", reason)
        raise ValueError(f"onnxruntime, which quantises the model, cannot load it: {reason}") from err


def quantised_operators(proto: "onnx.ModelProto") -> dict[str, str]:  # noqa: F821
    """``{operator type: the first such node's name}`` of the quantised operators ``proto``
    holds (QDQ pairs, ONNX's and onnxruntime's integer operators); empty for a float model.

    >>> from onnx import helper
    >>> node = helper.make_node("QuantizeLinear", ["x", "s"], ["q"], name="q0")
    >>> quantised_operators(helper.make_model(helper.make_graph([node], "g", [], [])))
    {'QuantizeLinear': 'q0'}
    """
    found: dict[str, str] = {}
    for node in proto.graph.node:
        if node.op_type in _QUANTISED_OPS or node.op_type.startswith("QLinear"):
            found.setdefault(node.op_type, node.name or node.output[0])
    return found


def _refuse_quantised(proto) -> None:
    """A ``ValueError`` for a model that already holds quantised operators: quantising it
    again would wrap its QDQ pairs in more (onnxruntime then writes nodes with duplicate
    names, an invalid model)."""
    found = quantised_operators(proto)
    if found:
        ops = ", ".join(f"{op} (e.g. {name!r})" for op, name in sorted(found.items()))
        raise ValueError(f"the model is already quantised: it has {ops}; quantise the float model it came "
                         "from, or compile this one as it is")


def _graph_inputs(onnx, proto) -> dict[str, tuple[tuple, np.dtype]]:
    """``{name: (shape with None for open dims: named, ``?`` or ``-1``, dtype)}`` of the real inputs."""
    initialisers = {i.name for i in proto.graph.initializer}
    inputs = {}
    for value in proto.graph.input:
        if value.name in initialisers:
            continue
        tensor = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim)
        inputs[value.name] = (shape, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)))
    return inputs


def calibration_samples(calibration: Calibration, inputs: Mapping[str, tuple]) -> list[dict[str, np.ndarray]]:
    """One feed dict per sample, from an ``.npz`` path or a dict of arrays with a leading
    samples axis; checked against ``inputs`` (``{name: (shape, dtype)}``).

    >>> samples = calibration_samples({"x": np.ones((2, 1, 3), np.float32)}, {"x": ((1, 3), np.dtype("float32"))})
    >>> len(samples), samples[1]["x"].shape
    (2, (1, 3))
    >>> calibration_samples({"y": np.zeros((2, 3))}, {"x": ((3,), np.dtype("float32"))})
    Traceback (most recent call last):
    tirpat.model.quantize.CalibrationError: calibration data has no array for input 'x' (it has 'y')
    """
    if isinstance(calibration, (str, os.PathLike)):
        path = pathlib.Path(calibration)
        if not path.is_file():
            raise FileNotFoundError(f"no calibration file {str(path)!r}")
        try:
            arrays = load_npz(path)
        except NotAnNpzError as err:
            raise CalibrationError(f"{str(path)!r}: {err}; calibration data is an .npz keyed by input name") from err
    elif isinstance(calibration, Mapping):
        arrays = {k: np.asarray(v) for k, v in calibration.items()}
    else:
        raise TypeError(f"calibration must be an .npz path or a dict of arrays, got {type(calibration).__name__}")
    given = ", ".join(repr(k) for k in arrays) or "nothing"
    for name in inputs:
        if name not in arrays:
            raise CalibrationError(f"calibration data has no array for input {name!r} (it has {given})")
    extra = sorted(set(arrays) - set(inputs))
    if extra:
        raise CalibrationError(f"calibration data has arrays for unknown inputs {', '.join(map(repr, extra))} "
                               f"(the model's inputs are {', '.join(map(repr, inputs))})")
    counts = set()
    for name, (shape, dtype) in inputs.items():
        a = arrays[name]
        if a.ndim != len(shape) + 1 or any(d is not None and d != n for d, n in zip(shape, a.shape[1:])):
            want = "[samples, " + ", ".join("?" if d is None else str(d) for d in shape) + "]"
            raise CalibrationError(f"calibration array {name!r} has shape {list(a.shape)}; the input needs {want} "
                                   "(a leading axis of samples, each of the input's shape)")
        if a.shape[0] == 0:
            raise CalibrationError(f"calibration array {name!r} has no samples")
        if a.dtype.kind == dtype.kind == "f":   # statistics: a float64 array (numpy's default) serves
            a = arrays[name] = a.astype(dtype)  # a float32 input; out of its range becomes inf, refused below
        if a.dtype != dtype:     # integers for a float input (or the reverse): no silent conversion
            raise CalibrationError(f"calibration array {name!r} is {a.dtype}; the input is {dtype} "
                                   f"(convert the data, e.g. array.astype(np.{dtype.name}))")
        if dtype.kind == "f":
            _check_finite(name, a)
        counts.add(a.shape[0])
    if len(counts) > 1:
        raise CalibrationError(f"calibration arrays have different numbers of samples: {sorted(counts)}")
    zero = [name for name, (_, dtype) in inputs.items() if dtype.kind == "f" and not np.any(arrays[name])]
    if zero:
        warnings.warn(f"calibration data for input {', '.join(map(repr, zero))} is zero on every sample: "
                      "its quantisation scale (and those of the tensors computed from it) then mean "
                      "nothing for real data. Calibrate on samples of real inputs.", stacklevel=3)
    n = counts.pop() if counts else 0
    return [{name: arrays[name][i] for name in inputs} for i in range(n)]


def _check_finite(name: str, array: np.ndarray) -> None:
    """A :class:`CalibrationError` naming ``name`` and counting its NaN and infinite values
    (MinMax calibration would turn them into NaN or infinite scales)."""
    nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
    if nan or inf:
        counts = " and ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "infinite")) if n)
        raise CalibrationError(f"calibration array {name!r} has {counts} value{'s' if nan + inf > 1 else ''} "
                               f"(of {array.size}); calibration needs finite data")


def _random_samples(inputs: Mapping[str, tuple]) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    for name, (shape, dtype) in inputs.items():
        if any(d is None for d in shape):
            raise CalibrationError(f"input {name!r} has a symbolic dimension; pass calibration data of real shapes")
        if dtype.kind != "f":
            raise CalibrationError(f"input {name!r} is {dtype}; random calibration is for float inputs, pass "
                                   "calibration data")
    return [{name: rng.standard_normal(shape).astype(dtype) for name, (shape, dtype) in inputs.items()}
            for _ in range(RANDOM_SAMPLES)]


def _reader(base, samples):
    """An onnxruntime ``CalibrationDataReader`` over the feed dicts ``samples``."""

    class Reader(base):
        def __init__(self) -> None:
            self._it = iter(samples)

        def get_next(self):
            return next(self._it, None)

        def rewind(self) -> None:
            self._it = iter(samples)

    return Reader()
