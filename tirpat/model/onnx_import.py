"""ONNX models as exported, into Relax: pre-processing by onnxruntime, then TVM's ONNX frontend.

Models exported by other frameworks (Paddle, PyTorch) compute shapes in the graph
(``Shape -> Gather -> Concat -> Reshape``), declare open dimensions as names, ``?`` or
``dim_value: -1``, and keep BatchNormalization apart from the convolution before it. TVM's
ONNX frontend needs a ``Reshape``'s new shape as a constant, and its ``tvm.compile`` needs
static shapes, so :func:`import_onnx` pre-processes the model first (``preprocess=True``,
the default; ``tirpat compile --no-preprocess`` skips it):

1. the inputs' dimensions given in ``input_shapes`` are written into the graph's input
   declarations (an open one left open is declared by name: ``-1`` is not a dimension);
2. onnxruntime optimises the graph at ``ORT_ENABLE_BASIC`` and saves it
   (``SessionOptions.optimized_model_filepath``): constant folding computes the shapes, and
   BatchNormalization, Identity and Dropout are folded or removed. The basic level only
   writes standard ONNX operators and leaves a QDQ model's DequantizeLinear weights in
   int8 (onnxruntime does not constant-fold DequantizeLinear);
3. onnx's shape inference annotates the tensors.

After the frontend, :func:`static_gathers` rewrites what its ``Gather`` leaves (PyTorch's
ViT picks q, k and v by one): the negative-index fix-up reads the data's shape at run time
(``shape_of``, kept on the host and listed in the report) though the shape is static, and
the gather's ``take`` has mode ``"fast"``, for which TOPI prints a warning about segfaults
each time it is compiled.

An error from TVM's frontend or from ``tvm.compile`` is an :class:`OnnxImportError` naming
the model (its file where there is one), saying that it came from TVM, and naming the ONNX
node (name and operator) the frontend was converting.

>>> import numpy as np, onnx
>>> from onnx import helper, numpy_helper, TensorProto
>>> nodes = [helper.make_node("Shape", ["x"], ["s"]),
...          helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
...          helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
...          helper.make_node("Concat", ["n1", "rest"], ["shape"], axis=0),
...          helper.make_node("Reshape", ["x", "shape"], ["y"])]
>>> consts = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
...           numpy_helper.from_array(np.array([-1], np.int64), "rest")]
>>> graph = helper.make_graph(nodes, "flatten", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 2, 3])],
...                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
>>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
>>> mod = import_onnx(model, {"x": [4, 2, 3]})
>>> mod["main"].ret_ty
R.Tensor((4, 6), dtype="float32")
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import pathlib
import tempfile
import traceback
import warnings
from typing import Mapping, Sequence, Union

from .tvm_noise import filtered_native_stderr

__all__ = ["import_onnx", "preprocess_onnx", "declare_inputs", "static_gathers", "OnnxImportError", "tvm_failure"]

ModelLike = Union[str, os.PathLike, "onnx.ModelProto"]  # noqa: F821 - onnx is optional


class OnnxImportError(ValueError):
    """A model that onnxruntime's pre-processing or TVM (its ONNX frontend, or ``tvm.compile``
    on what it imported) could not take; the message names the model, the tool and, where it
    can be known, the ONNX node."""


def import_onnx(model: ModelLike, input_shapes: Mapping[str, Sequence[int]] | None = None, *,
                preprocess: bool = True, source: str | os.PathLike | None = None):
    """``model`` (an ``.onnx`` path or an ``onnx.ModelProto``) as a Relax ``IRModule``, weights
    bound as constants.

    Parameters
    ----------
    model
        A float or QDQ ONNX model, as a path or a ``ModelProto``.
    input_shapes
        ``{input name: dims}`` for the dimensions the model leaves open (each positive).
    preprocess
        Run the pre-processing of this module's docstring first (default). ``False`` hands
        the model to TVM's frontend as it is.
    source
        What error messages call the model (default: its path, or ``"the model"``).

    Raises :class:`OnnxImportError` when TVM's frontend fails, ``ValueError`` when
    ``input_shapes`` names no input of the model or gives a wrong rank. Warns when
    onnxruntime cannot load the model (an operator it lacks) and TVM imported it without
    pre-processing.
    """
    import onnx
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    proto, name = _load(onnx, model, source)
    shapes = {k: [int(d) for d in v] for k, v in (input_shapes or {}).items()}
    _check_names(proto, shapes, name)
    skipped = None
    if preprocess:
        try:
            proto = preprocess_onnx(proto, shapes, source=name)
        except OnnxImportError as err:      # TVM may still take it (an operator onnxruntime lacks)
            skipped, proto = str(err), declare_inputs(proto, shapes, copy=True)
    else:
        proto = declare_inputs(proto, shapes, copy=True)
    shown = io.StringIO()       # the frontend prints the failing operator's inputs to stdout
    # a failed frontend's builder logs "BlockBuilder destroyed with remaining blocks!" when it
    # is freed (with `err`, or at exit, after the error): freed here, with that line dropped
    with filtered_native_stderr():
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(shown):
                warnings.filterwarnings("ignore", message="Renaming name", category=UserWarning)
                mod = from_onnx(proto, shape_dict=shapes or None, keep_params_in_input=False)
            if skipped:
                warnings.warn(f"{skipped}; imported without pre-processing", stacklevel=2)
            return static_gathers(mod)
        except tvm.error.OpNotImplemented as err:
            message = f"{name}: TVM cannot import this model: {_first_line(err)}"
        except Exception as err:  # noqa: BLE001 - the frontend raises many kinds; say which model, node and why
            hint = " (pre-processing was off: it computes shapes the frontend needs)" if not preprocess else ""
            message = (f"{name}: TVM's ONNX frontend failed{_where(_failing_node(err))}: {type(err).__name__}: "
                       f"{_first_line(err)}{hint}")
        gc.collect()
    raise OnnxImportError(message)


def tvm_failure(err: BaseException, source: str | os.PathLike) -> OnnxImportError | None:
    """An :class:`OnnxImportError` for ``err`` raised inside TVM (by ``tvm.compile`` on an
    imported model: its innermost frame is TVM's Python or C++ code), naming ``source``;
    None for an error tirpat raised itself, which already says what it means."""
    import tvm
    import tvm_ffi

    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return None
    innermost = frames[-1].filename
    packages = [pathlib.Path(p.__file__).resolve().parent for p in (tvm, tvm_ffi)]
    inside = (not innermost.endswith(".py")       # TVM's C++ frames (tvm_ffi lists them) and its Cython
              or any(pathlib.Path(innermost).resolve().is_relative_to(p) for p in packages))
    if not inside:
        return None
    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    return OnnxImportError(f"{source}: TVM failed to compile it: {type(err).__name__}: {text}")


def preprocess_onnx(model: "onnx.ModelProto", input_shapes: Mapping[str, Sequence[int]] | None = None,  # noqa: F821
                    *, source: str = "the model") -> "onnx.ModelProto":  # noqa: F821
    """``model`` with ``input_shapes`` declared, optimised by onnxruntime at
    ``ORT_ENABLE_BASIC`` and annotated by onnx's shape inference (a new ``ModelProto``;
    ``model`` is left as it was). Raises :class:`OnnxImportError` when onnxruntime
    cannot load the model (:func:`import_onnx` then warns and imports it as it is)."""
    import onnx
    import onnxruntime as ort

    declared = declare_inputs(model, dict(input_shapes or {}), copy=True)
    del declared.graph.value_info[:]    # annotations of the open dims; re-inferred below
    with tempfile.TemporaryDirectory(prefix="tirpat-onnx-") as tmp:
        given, optimised = pathlib.Path(tmp, "given.onnx"), pathlib.Path(tmp, "basic.onnx")
        onnx.save(declared, str(given))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(optimised)
        options.log_severity_level = 3      # its warnings are about running, not about the saved graph
        try:
            ort.InferenceSession(str(given), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # noqa: BLE001 - onnxruntime raises its own kinds
            raise OnnxImportError(f"{source}: onnxruntime cannot load the model to pre-process it: "
                                  f"{_first_line(err)}") from None
        result = onnx.load(str(optimised))
    return onnx.shape_inference.infer_shapes(result)


def static_gathers(mod):
    """``mod`` with each ``shape_to_tensor(shape_of(x))`` of a static shape a constant (the
    index arithmetic after it then folds at build time) and each ``take`` of mode ``"fast"``
    given mode ``"clip"``: the same values for the in-bounds indices ONNX requires, a clamp
    instead of a stray read for others, and no TOPI warning.

    >>> import tvm
    >>> from tvm.script import relax as R
    >>> @R.function
    ... def f(x: R.Tensor((3, 4), "float32")):
    ...     with R.dataflow():
    ...         s = R.shape_to_tensor(R.shape_of(x))
    ...         y = R.take(x, R.const(1, "int64"), axis=0, mode="fast")
    ...         R.output(s, y)
    ...     return (s, y)
    >>> s, y = (b.value for b in static_gathers(tvm.IRModule({"main": f}))["main"].body.blocks[0].bindings)
    >>> s.value.numpy(), y.attrs.mode
    (array([3, 4]), 'clip')
    """
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    shape_to_tensor, shape_of, take = (tvm.ir.Op.get(f"relax.{n}") for n in ("shape_to_tensor", "shape_of", "take"))

    def static_dims(expr) -> list[int] | None:
        shape = expr.args[0].ty.shape if isinstance(expr, relax.Call) and expr.op.same_as(shape_of) else None
        if isinstance(shape, relax.ShapeExpr) and all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
            return [int(d) for d in shape.values]
        return None

    @mutator
    class _Rewriter(PyExprMutator):
        def visit_call_(self, call):  # noqa: N802 - PyExprMutator's name
            call = super().visit_call_(call)
            if call.op.same_as(shape_to_tensor):
                arg = call.args[0]
                dims = static_dims(self.lookup_binding(arg) if isinstance(arg, relax.Var) else arg)
                if dims is not None:
                    return relax.const(np.array(dims, dtype=np.int64), "int64")
            if call.op.same_as(take) and call.attrs.mode == "fast":
                return relax.op.take(call.args[0], call.args[1], call.attrs.axis, mode="clip")
            return call

    rewriter = _Rewriter(mod)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, relax.analysis.remove_all_unused(rewriter.visit_expr(func)))
    return rewriter.builder_.get()


def _load(onnx, model, source):
    if isinstance(model, onnx.ModelProto):
        return model, str(source) if source is not None else "the model"
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"an ONNX model is a path or an onnx.ModelProto, got {type(model).__name__}")
    path = pathlib.Path(model)
    name = str(source) if source is not None else str(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file {str(path)!r}")
    try:
        return onnx.load(str(path)), name
    except Exception as err:  # noqa: BLE001 - protobuf raises several kinds
        raise ValueError(f"{name}: not an ONNX model ({_first_line(err)})") from err


def _inputs(proto) -> dict:
    initialisers = {i.name for i in proto.graph.initializer}
    return {i.name: i for i in proto.graph.input if i.name not in initialisers}


def _check_names(proto, shapes: dict[str, list[int]], name: str) -> None:
    inputs = _inputs(proto)
    for key, dims in shapes.items():
        if key not in inputs:
            raise ValueError(f"{name}: input_shapes names {key!r}, but the model's inputs are "
                             f"{', '.join(map(repr, inputs))}")
        declared = inputs[key].type.tensor_type
        if declared.HasField("shape") and len(declared.shape.dim) != len(dims):
            raise ValueError(f"{name}: input_shapes gives {key} {len(dims)} dimensions; the model's has "
                             f"{len(declared.shape.dim)}")
        if any(d < 1 for d in dims):
            raise ValueError(f"{name}: input_shapes gives {key} the shape {dims}; a dimension is a positive integer")


def declare_inputs(model, shapes: Mapping[str, Sequence[int]], *, copy: bool = True):
    """``model`` (a copy unless ``copy`` is False) with the inputs' dims in ``shapes`` fixed
    and every other open dimension declared by name (``-1`` or ``0`` becomes
    ``<input>_<axis>``; ONNX has no ``-1`` dimension, and onnxruntime would take it as a size)."""
    if copy:
        model = type(model).FromString(model.SerializeToString())
    for name, value in _inputs(model).items():
        given = shapes.get(name)
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if given is not None:
                dim.Clear()
                dim.dim_value = given[axis]
            elif not dim.dim_param and dim.dim_value < 1:
                dim.Clear()
                dim.dim_param = f"{name}_{axis}"
    return model


def _failing_node(err: BaseException):
    """The ONNX node TVM's frontend was converting when ``err`` was raised (its converter
    loop's ``node``), or None."""
    tb = err.__traceback__
    node = None
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "_construct_nodes" and "node" in tb.tb_frame.f_locals:
            node = tb.tb_frame.f_locals["node"]
        tb = tb.tb_next
    return node if node is not None and hasattr(node, "op_type") else None


def _where(node) -> str:
    if node is None:
        return ""
    if node.name:
        return f" at node {node.name!r} ({node.op_type})"
    return f" at the {node.op_type} node that computes {node.output[0]!r}"


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
