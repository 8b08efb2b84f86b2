"""Differential tests of a backend: a Relax module built with ``tp.build`` for a target
computes, call after call, bit for bit what ``tvm.compile(mod, "llvm")`` computes.

:func:`assert_matches_llvm` is the whole test: build, run over several calls (a backend
that plans or caches on later calls is exercised too) and compare every output with llvm's;
it returns the compiled model, whose ``report`` and ``stats`` the test then inspects.
:func:`llvm_reference` is llvm's side alone (for a test whose build must warn or raise
first), and :func:`random_inputs` draws arguments for a module's entry function.
"""

from __future__ import annotations

import warnings
from typing import Callable, Mapping, Sequence, Union

import numpy as np
import tvm
from tvm import relax

from ..model.build import build
from ..model.compiled import CompiledModel
from ..model.target import CompositeTarget

__all__ = ["INPUT_RANGES", "Inputs", "assert_matches_llvm", "llvm_reference", "random_inputs"]

#: the half-open range each integer dtype's inputs are drawn from: int8 spans its range; int32
#: inputs (biases, mostly) stay small enough that adding one to an accumulator cannot overflow
INPUT_RANGES: Mapping[str, tuple[int, int]] = {"int8": (-128, 128), "int32": (-5000, 5000)}

#: one call's arguments, the same for every call; or a function of the call's index giving them
Inputs = Union[Sequence[np.ndarray], Callable[[int], Sequence[np.ndarray]]]


def _entry(mod: tvm.IRModule, entry: str) -> relax.Function:
    if not isinstance(mod, tvm.IRModule) or entry not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError(f"expected an IRModule with a Relax function {entry!r}, got {type(mod).__name__}")
    if not isinstance(mod[entry], relax.Function):
        raise ValueError(f"{entry} is a {type(mod[entry]).__name__}, not a Relax function: these helpers run "
                         "Relax models")
    return mod[entry]


def random_inputs(mod: tvm.IRModule, rng: np.random.Generator | int, *, entry: str = "main",
                  ranges: Mapping[str, tuple[int, int]] | None = None) -> list[np.ndarray]:
    """Random arguments for ``mod[entry]``: one array per parameter, of its static shape and dtype.

    Parameters
    ----------
    mod
        A Relax module whose entry function has tensor parameters of static shape.
    rng
        A numpy generator, or a seed for one; arrays are drawn in parameter order.
    entry
        The function whose parameters to fill.
    ranges
        ``{dtype: (low, high)}`` half-open ranges for integer dtypes; default
        :data:`INPUT_RANGES`, and an integer dtype it lacks spans its whole range. Float
        inputs are standard normal.

    Returns
    -------
    list of numpy.ndarray
        One argument per parameter.

    >>> from tvm import relax
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((2, 3), "int8"))
    >>> b = relax.Var("b", relax.TensorType((3,), "int32"))
    >>> with bb.function("main", [x, b]):
    ...     _ = bb.emit_func_output(relax.op.add(relax.op.astype(x, "int32"), b))
    >>> [(a.shape, str(a.dtype)) for a in random_inputs(bb.get(), 0)]
    [((2, 3), 'int8'), ((3,), 'int32')]
    """
    rng = np.random.default_rng(rng) if isinstance(rng, (int, np.integer)) else rng
    ranges = INPUT_RANGES if ranges is None else ranges
    out = []
    for p in _entry(mod, entry).params:
        ty = p.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None or not all(
                isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
            raise ValueError(f"parameter {p.name} of {entry} is not a tensor of static shape ({ty}): "
                             "pass the inputs")
        shape, dtype = [int(d) for d in ty.shape.values], str(ty.dtype)
        if dtype.startswith("float"):
            out.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.startswith(("int", "uint")):
            info = np.iinfo(dtype)
            lo, hi = ranges.get(dtype, (int(info.min), int(info.max) + 1))
            out.append(rng.integers(lo, hi, shape, dtype=dtype))
        else:
            raise ValueError(f"parameter {p.name} of {entry} is {dtype}: no random inputs for it, pass them")
    return out


def _flat(value) -> list[np.ndarray]:
    """A model's or a VM's result as a list of numpy arrays (a tuple: its fields in order)."""
    if isinstance(value, (list, tuple, tvm.ir.Array)):
        return [a for v in value for a in _flat(v)]
    return [value.numpy() if hasattr(value, "numpy") else np.asarray(value)]


def llvm_reference(mod: tvm.IRModule, entry: str = "main") -> Callable[..., list[np.ndarray]]:
    """``mod`` compiled by ``tvm.compile(mod, "llvm")``, as a function of numpy arrays
    returning the entry's outputs as a list of numpy arrays (a tuple result flattened).

    >>> from tvm import relax
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((3,), "int8"))
    >>> with bb.function("main", [x]):
    ...     _ = bb.emit_func_output(relax.Tuple([relax.op.negative(x), x]))
    >>> [a.tolist() for a in llvm_reference(bb.get())(np.array([1, -2, 3], "int8"))]
    [[-1, 2, -3], [1, -2, 3]]
    """
    _entry(mod, entry)
    run = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())[entry]
    return lambda *args: _flat(run(*[tvm.runtime.tensor(np.asarray(a)) for a in args]))


def assert_matches_llvm(mod: tvm.IRModule, target: str | CompositeTarget, *, calls: int = 3,
                        inputs: Inputs | None = None, seed: int = 0, reference: tvm.IRModule | None = None,
                        strict: bool = False, quiet: bool = True) -> CompiledModel:
    """Build ``mod`` with ``tp.build(mod, target)``, run it ``calls`` times and assert that
    every output equals, bit for bit and in shape and dtype, what ``tvm.compile(reference,
    "llvm")`` computes from the same arguments.

    Parameters
    ----------
    mod
        The Relax module to build (its ``main``).
    target
        What ``tp.build`` takes: a ``tp.CompositeTarget`` or a string such as ``"mybackend, llvm"``.
    calls
        How many times to run the built model (and llvm's), at least 1.
    inputs
        The arguments of every call; or a function of the call's index (0, 1, ...) returning
        that call's; default: :func:`random_inputs` of ``mod`` drawn once from ``seed``.
    seed
        Seeds the default inputs.
    reference
        The module llvm computes the expected outputs with, when it is not ``mod`` (say,
        the integer module ``tp.integerize()`` makes of a QDQ model that ``tp.build`` takes).
    strict
        Passed to ``tp.build``: an operator a backend declines raises instead of warning.
    quiet
        Silence the build's warnings (``tp.OffloadWarning``: what stays on the host is in the
        report; a QDQ model's integerize warnings). False: they reach the caller's filters.

    Returns
    -------
    tirpat.model.compiled.CompiledModel
        The built model after its last call: ``report`` and ``stats`` (that call's) to inspect.

    Raises
    ------
    AssertionError
        An output differs from llvm's; the message names the call and the output.
    ValueError
        ``calls`` is below 1, ``mod`` has no Relax ``main``, or inputs cannot be drawn for
        it (pass them).
    >>> from tvm import relax
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((2, 3), "int8"))
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         out = bb.emit_output(relax.op.add(x, x))
    ...     _ = bb.emit_func_output(out)
    >>> model = assert_matches_llvm(bb.get(), "llvm", calls=2)
    >>> model(np.array([[1, 2, 3], [-4, 5, 127]], "int8")).tolist()      # int8 wraps, as llvm's does
    [[2, 4, 6], [-8, 10, -2]]
    """
    if calls < 1:
        raise ValueError(f"calls must be at least 1, not {calls}")
    if inputs is None:
        drawn = random_inputs(mod, seed)
        inputs = lambda _: drawn  # noqa: E731
    elif not callable(inputs):
        given = list(inputs)
        inputs = lambda _: given  # noqa: E731
    expect = llvm_reference(mod if reference is None else reference)
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        model = build(mod, target, strict=strict)
    for call in range(calls):
        args = list(inputs(call))
        want, got = expect(*args), _flat(model(*args))
        assert len(got) == len(want), f"call {call}: {len(got)} outputs, llvm's {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_array_equal(g, w, err_msg=f"call {call}, output {i} differs from llvm's", strict=True)
    return model
