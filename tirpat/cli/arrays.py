"""A model's inputs and outputs as ``.npz`` files: ``--inputs`` keyed by input name, seeded
random inputs without it, outputs written as ``output_0``, ``output_1``, ... in order.

``inputs`` below are the model's input specs: objects with ``name``, ``shape`` (a tuple,
``None`` for a dimension not fixed at compile time) and ``dtype`` (``CompiledModel.inputs``).

>>> from collections import namedtuple
>>> Spec = namedtuple("Spec", "name shape dtype")
>>> x, = random_inputs([Spec("x", (2, 3), "int8")], seed=0)
>>> x.shape, x.dtype
((2, 3), dtype('int8'))
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from tirpat.model.npz import NotAnNpzError, load_npz

from .command import CommandError

__all__ = ["read_inputs", "random_inputs", "write_outputs", "flat_outputs", "output_names", "describe_array"]


def _spec_text(spec) -> str:
    dims = ", ".join("?" if d is None else str(d) for d in spec.shape)
    return f"{spec.name}: {spec.dtype}[{dims}]"


def read_inputs(path: str | os.PathLike, inputs: Sequence) -> list[np.ndarray]:
    """The arrays of the ``.npz`` at ``path`` in the order of ``inputs``, each checked for
    its name, shape and dtype (no silent conversion: a wrong one is an error naming it)."""
    expected = ", ".join(_spec_text(s) for s in inputs)
    try:
        arrays = load_npz(path)
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None
    except NotAnNpzError as err:
        raise CommandError(f"{path}: {err}; the model takes {expected}") from err
    names = [s.name for s in inputs]
    spelled = {_frontend_name(n): n for n in names}     # "input.1" and "input_1" are one input
    renamed: dict[str, str] = {}
    for key in list(arrays):
        name = key if key in names else spelled.get(_frontend_name(key), _frontend_name(key))
        if name in renamed:
            raise CommandError(f"{path}: {renamed[name]!r} and {key!r} both give input {name!r}")
        renamed[name] = key
    arrays = {name: arrays[key] for name, key in renamed.items()}
    missing = [n for n in names if n not in arrays]
    extra = sorted(set(arrays) - set(names))
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"no array for input {', '.join(map(repr, missing))}")
        if extra:
            problems.append(f"the model has no input {', '.join(map(repr, extra))}")
        raise CommandError(f"{path}: {'; '.join(problems)} (the model takes {expected})")
    out = []
    for spec in inputs:
        a = arrays[spec.name]
        shape_ok = a.ndim == len(spec.shape) and all(d is None or d == g for d, g in zip(spec.shape, a.shape))
        if not shape_ok or str(a.dtype) != spec.dtype:
            raise CommandError(f"{path}: input {spec.name!r} is {a.dtype}{list(a.shape)}; "
                               f"the model takes {_spec_text(spec)}")
        out.append(a)
    return out


def _frontend_name(name: str) -> str:
    """The name TVM's ONNX frontend gives an input called ``name`` (``input.1`` -> ``input_1``,
    ``0`` -> ``input_0``), so that ``--inputs`` may use the ONNX graph's own names (and, for a
    Relax input called ``fc1.weight``, the name its printed form shows, ``fc1_weight``)."""
    name = name.replace(".", "_")
    return name if name[:1].isalpha() or name[:1] == "_" else f"input_{name}"


def random_inputs(inputs: Sequence, seed: int = 0) -> list[np.ndarray]:
    """Seeded random arrays for ``inputs``: integers over the dtype's range (at most
    [-128, 127], so that int32 inputs stay small), floats from a standard normal, bools fair."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in inputs:
        if any(d is None for d in spec.shape):
            raise CommandError(f"input {_spec_text(spec)} has a dimension not fixed at compile time: "
                               f"give its values with --inputs")
        dtype = np.dtype(spec.dtype)
        if dtype == np.bool_:
            out.append(rng.integers(0, 2, spec.shape).astype(bool))
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            out.append(rng.integers(max(info.min, -128), min(info.max, 127), spec.shape, dtype=dtype, endpoint=True))
        elif np.issubdtype(dtype, np.floating):
            out.append(rng.standard_normal(spec.shape).astype(dtype))
        else:
            raise CommandError(f"input {_spec_text(spec)}: no random values for dtype {dtype}: give --inputs")
    return out


def flat_outputs(result) -> list[np.ndarray]:
    """A model's result as its list of output arrays, nested tuples flattened in order.

    >>> [a.tolist() for a in flat_outputs((np.zeros(2), (np.ones(1), 3)))]
    [[0.0, 0.0], [1.0], 3]
    """
    if isinstance(result, (tuple, list)):
        return [a for item in result for a in flat_outputs(item)]
    return [np.asarray(result)]


def output_names(count: int) -> list[str]:
    """``output_0``, ``output_1``, ...: the keys outputs are written under."""
    return [f"output_{i}" for i in range(count)]


def write_outputs(path: str | os.PathLike, outputs: Sequence[np.ndarray]) -> None:
    """Write ``outputs`` to the ``.npz`` at ``path`` (exactly that path) as ``output_<i>``."""
    try:
        with open(path, "wb") as f:
            np.savez(f, **dict(zip(output_names(len(outputs)), outputs)))
    except OSError as err:
        raise CommandError(f"{path}: cannot write the outputs ({err.strerror})") from err


def describe_array(name: str, a: np.ndarray) -> str:
    """One line about an array: name, dtype, shape and its range.

    >>> describe_array("output_0", np.arange(6, dtype=np.int32).reshape(2, 3))
    'output_0: int32[2, 3]  min 0  max 5  mean 2.5'
    """
    head = f"{name}: {a.dtype}[{', '.join(map(str, a.shape))}]"
    if a.size == 0 or not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
        return head
    values = a.astype(np.float64)
    return f"{head}  min {values.min():.6g}  max {values.max():.6g}  mean {values.mean():.6g}"
