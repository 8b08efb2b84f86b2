"""MODEL on the command line: an ``.onnx`` file or a ``.py`` file defining a Relax ``IRModule``.

- ``.onnx``: read with ``onnx`` and imported by TVM's Relax ONNX frontend, weights bound as
  constants, input names kept as the ONNX graph has them (they key ``--inputs``).
- ``.py``: run with ``runpy`` (TVMScript needs the file's own module while it executes, which
  ``importlib`` loading does not give); it must define an ``IRModule`` named ``Module`` with
  a Relax function ``main``.

Every failure is a :class:`~tirpat.cli.command.CommandError` naming the file.

>>> mod = load_model("examples/models/mlp_int8.py")       # doctest: +SKIP
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

from .command import CommandError

__all__ = ["load_model", "ENTRY"]

#: The Relax function of MODEL that is compiled and run.
ENTRY = "main"


def load_model(path: str | os.PathLike):
    """MODEL (``.onnx`` or ``.py``) as a Relax ``tvm.IRModule``."""
    path = Path(path)
    if not path.exists():
        raise CommandError(f"{path}: no such file")
    if not path.is_file():
        raise CommandError(f"{path}: not a file")
    if not os.access(path, os.R_OK):
        raise CommandError(f"{path}: permission denied")
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        mod = _from_onnx(path)
    elif suffix == ".py":
        mod = _from_python(path)
    else:
        raise CommandError(f"{path}: a model is an .onnx file or a .py file defining a Relax IRModule named Module")
    return _check(mod, path)


def _from_onnx(path: Path):
    try:
        import onnx
    except ImportError:
        raise CommandError(f"{path}: reading ONNX models needs the onnx package: pip install 'tirpat[model]'") from None
    import tvm
    from google.protobuf.message import DecodeError
    from tvm.relax.frontend.onnx import from_onnx

    try:
        model = onnx.load(str(path))
    except (DecodeError, ValueError, RuntimeError) as err:
        raise CommandError(f"{path}: not an ONNX model ({_first_line(err)})") from err
    if not model.graph.node:
        raise CommandError(f"{path}: not an ONNX model (its graph has no nodes)")
    try:
        return from_onnx(model, keep_params_in_input=False, sanitize_input_names=False)
    except tvm.error.OpNotImplemented as err:
        raise CommandError(f"{path}: TVM cannot import this model: {_first_line(err)}") from err
    except Exception as err:  # noqa: BLE001 - the frontend raises many kinds; say which file and why
        raise CommandError(f"{path}: TVM's ONNX frontend failed: {type(err).__name__}: {_first_line(err)}") from err


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


def _check(mod, path: Path):
    import tvm
    from tvm import relax

    if not isinstance(mod, tvm.IRModule):
        raise CommandError(f"{path}: Module is a {type(mod).__name__}, not a tvm.IRModule")
    func = next((f for gv, f in mod.functions.items() if gv.name_hint == ENTRY), None)
    if not isinstance(func, relax.Function):
        raise CommandError(f"{path}: the IRModule has no Relax function {ENTRY!r} to compile")
    return mod


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
