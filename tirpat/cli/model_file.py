"""MODEL on the command line: an ``.onnx`` file or a ``.py`` file defining a Relax ``IRModule``.

- ``.onnx``: read with ``onnx``, pre-processed (the given input dims fixed, onnxruntime's
  basic graph optimisation, onnx's shape inference: :mod:`tirpat.model.onnx_import`; off with
  ``--no-preprocess``) and imported by TVM's Relax ONNX frontend, weights bound as
  constants. The frontend renames inputs that are not identifiers (``input.1`` becomes
  ``input_1``); ``--inputs`` takes either name (:func:`tirpat.cli.arrays.read_inputs`).
- ``.py``: run with ``runpy`` (TVMScript needs the file's own module while it executes, which
  ``importlib`` loading does not give); it must define an ``IRModule`` named ``Module`` with
  a Relax function ``main`` (or the one ``--entry`` names: ``relax.frontend.nn`` exports
  call theirs ``forward``).
- ``--input-shapes`` sets the dimensions an ONNX model leaves open (``N``, ``?``); one that
  contradicts a dimension the model fixes, a wrong rank, or two values for one named
  dimension is an error before TVM imports anything.

Every failure is a :class:`~tirpat.cli.command.CommandError` naming the file.

>>> mod = load_model("examples/models/mlp_int8.py")       # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import runpy
import warnings
from pathlib import Path

from .command import CommandError

__all__ = ["load_model", "parse_shapes", "readable", "ENTRY"]

#: The Relax function of MODEL that is compiled and run, unless ``--entry`` names another.
ENTRY = "main"


def parse_shapes(text: str) -> dict[str, list[int]]:
    """``--input-shapes`` as TVMC wrote it: ``name:[d0,d1,...]`` entries separated by spaces,
    each dimension a positive integer.

    >>> parse_shapes("x:[1,3,16,16] input.1:[8]")
    {'x': [1, 3, 16, 16], 'input.1': [8]}
    >>> parse_shapes("x:[1,0]")
    Traceback (most recent call last):
    ...
    ValueError: x:[1,0]: dimension 1 of x is 0; a dimension is a positive integer
    """
    shapes: dict[str, list[int]] = {}
    rest = text.strip()
    while rest:
        m = _SHAPE.match(rest)
        if m is None:
            raise ValueError(f"expected name:[d0,d1,...] entries separated by spaces, got {rest!r}")
        name, dims = m.group(1), (m.group(2) or "").replace(" ", "")
        if name in shapes:
            raise ValueError(f"input {name!r} is given twice")
        shapes[name] = [int(d) for d in dims.split(",")] if dims else []
        for axis, dim in enumerate(shapes[name]):
            if dim < 1:
                raise ValueError(f"{m.group(0)}: dimension {axis} of {name} is {dim}; a dimension is a positive integer")
        rest = rest[m.end():].lstrip()
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


_SHAPE = re.compile(r"([^\s:]+):\[\s*((?:[-+]?\d+\s*,\s*)*[-+]?\d+)?\s*\](?=\s|$)")


def load_model(path: str | os.PathLike, shapes: dict[str, list[int]] | None = None, entry: str = ENTRY, *,
               preprocess: bool = True):
    """MODEL (``.onnx`` or ``.py``) as a Relax ``tvm.IRModule`` with the Relax function
    ``entry``; ``shapes`` sets the open dimensions of an ONNX model's inputs (by the graph's
    input names), as ``--input-shapes`` does; ``preprocess=False`` (``--no-preprocess``)
    hands an ONNX model to TVM's frontend as it is."""
    path = readable(path)
    suffix = path.suffix.lower()
    if shapes and suffix != ".onnx":
        raise CommandError(f"{path}: --input-shapes is for .onnx models; a Relax module declares its shapes")
    if suffix == ".onnx":
        mod = _from_onnx(path, shapes, preprocess)
    elif suffix == ".py":
        mod = _from_python(path)
    else:
        raise CommandError(f"{path}: a model is an .onnx file or a .py file defining a Relax IRModule named Module")
    return _check(mod, path, entry)


def readable(path: str | os.PathLike) -> Path:
    """``path`` as a ``Path`` if it is a file this process can read, else a CommandError."""
    path = Path(path)
    if not path.exists():
        raise CommandError(f"{path}: no such file")
    if not path.is_file():
        raise CommandError(f"{path}: not a file")
    if not os.access(path, os.R_OK):
        raise CommandError(f"{path}: permission denied")
    return path


def _from_onnx(path: Path, shapes: dict[str, list[int]] | None, preprocess: bool):
    try:
        import onnx
    except ImportError:
        raise CommandError(f"{path}: reading ONNX models needs the onnx package: pip install 'tirpat[model]'") from None
    from google.protobuf.message import DecodeError

    from tirpat.model.onnx_import import OnnxImportError, import_onnx

    try:
        model = onnx.load(str(path))
    except (DecodeError, ValueError, RuntimeError) as err:
        raise CommandError(f"{path}: not an ONNX model ({_first_line(err)})") from err
    if not model.graph.node:
        raise CommandError(f"{path}: not an ONNX model (its graph has no nodes)")
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    unknown = sorted(set(shapes or ()) - set(inputs))
    if unknown:
        raise CommandError(f"{path}: --input-shapes names {', '.join(unknown)}, but the model's inputs are "
                           f"{', '.join(inputs)}")
    declared = {i.name: i for i in model.graph.input if i.name in inputs}
    _check_shapes(path, shapes or {}, declared)
    dynamic = {name: _dims(i) for name, i in declared.items()
               if name not in (shapes or {}) and not all(isinstance(d, int) for d in _dims(i))}
    if dynamic:
        example = " ".join(f"{n}:[{','.join(_placeholder(d, axis) for axis, d in enumerate(dims))}]"
                           for n, dims in dynamic.items())
        warnings.warn(f"{path}: input {', '.join(f'{n} [{_text(dims)}]' for n, dims in dynamic.items())} has dimensions not "
                      f"fixed in the model; accelerators need static shapes: give them with "
                      f"--input-shapes \"{example}\", a number in place of each name", stacklevel=2)
    try:
        return import_onnx(model, shapes, preprocess=preprocess, source=path)
    except OnnxImportError as err:
        raise CommandError(str(err)) from err


def _check_shapes(path: Path, shapes: dict[str, list[int]], declared: dict) -> None:
    """``--input-shapes`` may set only what the model leaves open: the rank and every fixed
    dimension must agree, and a named dimension (``N``) takes one value wherever it appears."""
    named: dict[str, tuple[int, str]] = {}         # dimension name -> (value, where it was given)
    for name, dims in shapes.items():
        info = declared[name]
        if not info.type.tensor_type.HasField("shape"):
            continue                                # the model declares no shape: any is taken
        model = _dims(info)
        given = f"--input-shapes {name}:[{','.join(map(str, dims))}]"
        if len(dims) != len(model):
            raise CommandError(f"{path}: {given} has {len(dims)} dimension{'s' * (len(dims) != 1)}; the model's "
                               f"input {name} has {len(model)}: [{_text(model)}]")
        for axis, (fixed, dim) in enumerate(zip(model, dims)):
            if isinstance(fixed, int) and fixed != dim:
                open_axes = [str(a) for a, d in enumerate(model) if not isinstance(d, int)]
                settable = (f"only its open dimension{'s' * (len(open_axes) > 1)} ({', '.join(open_axes)}) can be set"
                            if open_axes else f"{name}'s shape is fixed: leave it out of --input-shapes")
                raise CommandError(f"{path}: {given} contradicts the model: dimension {axis} of input {name} is "
                                   f"{fixed} in the model, {dim} given ([{_text(model)}]: {settable})")
            if isinstance(fixed, str) and fixed != "?":
                value, where = named.setdefault(fixed, (dim, f"{name} dimension {axis}"))
                if value != dim:
                    raise CommandError(f"{path}: --input-shapes gives the model's dimension {fixed!r} two values: "
                                       f"{value} ({where}) and {dim} ({name} dimension {axis})")


def _text(dims: list) -> str:
    return ", ".join(map(str, dims))


def _placeholder(dim, axis: int) -> str:
    """A dimension as ``--input-shapes`` would take it: its size, or for an open one a name to
    replace by one: the model's (``N``), or ``D<axis>`` for an unnamed or long one.

    >>> [_placeholder(d, axis) for axis, d in enumerate(["p2o.DynamicDimension.0", 3, "?", "W"])]
    ['D0', '3', 'D2', 'W']
    """
    if isinstance(dim, int):
        return str(dim)
    return dim if dim.isidentifier() and len(dim) <= 8 else f"D{axis}"


def _dims(value_info) -> list:
    """An ONNX graph input's dimensions: ints, or the names (``?``) of those not fixed."""
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
            for d in value_info.type.tensor_type.shape.dim]


def _from_python(path: Path):
    try:
        namespace = runpy.run_path(str(path), run_name=f"tirpat_model_{path.stem}")
    except SyntaxError as err:
        raise CommandError(f"{path}:{err.lineno}: {err.msg}") from err
    except Exception as err:  # noqa: BLE001 - the user's file may raise anything
        raise CommandError(f"{path}: running it raised {type(err).__name__}: {_first_line(err)}") from err
    if "Module" not in namespace:
        raise CommandError(f"{path}: defines no IRModule named Module (write `@I.ir_module class Module: ...`)")
    return namespace["Module"]


def _check(mod, path: Path, entry: str):
    import tvm
    from tvm import relax

    if not isinstance(mod, tvm.IRModule):
        raise CommandError(f"{path}: Module is a {type(mod).__name__}, not a tvm.IRModule")
    functions = sorted(gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function))
    if entry not in functions:
        found = (f"its Relax functions are {', '.join(functions)}: name one with --entry" if functions
                 else "it has no Relax function at all (a model is a Relax function; PrimFuncs alone are not)")
        raise CommandError(f"{path}: the IRModule has no Relax function {entry!r} to compile; {found}")
    return mod


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
