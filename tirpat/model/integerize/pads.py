"""A Pad of a dequantized tensor, as TVM's ONNX frontend imports it, on the int8 tensor.

The frontend imports ONNX ``Pad`` (a Conv's asymmetric padding, as Paddle exports it) as a
``call_tir`` of TOPI's ``pad`` (``mirror_pad`` for ``reflect``, ``replicate_pad`` for ``edge``), not as
``relax.nn.pad``, so neither the pad widths nor the value are operator attributes. A pad only
moves elements and writes a constant ``c``, so ``pad(dq(x), c) == dq(pad(x, q(c)))`` whenever
``c`` is exactly a quantised value (``0.0`` is: it is ``z_x``); a reflect or edge pad only moves
elements, ``pad(dq(x)) == dq(pad(x))`` always; the convolution after it then meets ``dq``
directly and becomes integer. The widths, and ``c`` or the mode, are read by running the
PrimFunc once at compile time on distinct values (a function that is not exactly such a pad
of its input is left alone).

>>> pad_of(np.arange(1.0, 7.0).reshape(1, 2, 3), np.pad(np.arange(1.0, 7.0).reshape(1, 2, 3), [(0, 0), (1, 0), (0, 2)]))
([0, 1, 0], [0, 0, 2], 0.0)
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .rules import INT8_MAX, INT8_MIN, Declined, dims_of, rewrite_sites

__all__ = ["PadRule", "pad_of", "moved_pad_of"]

#: The PrimFunc names TVM's frontend gives TOPI's pads (``pad``, ``pad1``, ``mirror_pad``, ``replicate_pad``...)
_PAD_NAME = re.compile(r"^(mirror_|replicate_)?pad\d*$")
#: The pad modes other than a constant that only move elements: numpy's name -> relax.nn.pad's
#: (whose "edge" is silently a constant pad)
_MOVES = {"reflect": "reflect", "edge": "replicate"}


def pad_of(x: np.ndarray, y: np.ndarray) -> tuple[list[int], list[int], float] | None:
    """``(before, after, value)`` if ``y`` is ``x`` padded with one constant (``x``'s values
    distinct from it), else None."""
    if y.ndim != x.ndim or any(b < a for a, b in zip(x.shape, y.shape)):
        return None
    corner = np.argwhere(y == x.flat[0])
    if len(corner) != 1:
        return None
    before = [int(i) for i in corner[0]]
    after = [int(b - a - s) for a, b, s in zip(x.shape, y.shape, before)]
    if min(after) < 0:
        return None
    inner = tuple(slice(s, s + n) for s, n in zip(before, x.shape))
    if not np.array_equal(y[inner], x):
        return None
    rest = np.ones(y.shape, bool)
    rest[inner] = False
    values = np.unique(y[rest])
    if values.size > 1:
        return None
    return before, after, float(values[0]) if values.size else 0.0


def moved_pad_of(x: np.ndarray, y: np.ndarray) -> tuple[list[int], list[int], str] | None:
    """``(before, after, mode)`` if ``y`` is ``x`` padded by reflection or by repeating its edge
    (``mode``: ``reflect`` or ``edge``, as numpy and ``relax.nn.pad`` name them), else None.

    >>> x = np.arange(6.0).reshape(2, 3)
    >>> moved_pad_of(x, np.pad(x, [(0, 1), (2, 1)], mode="reflect"))
    ([0, 2], [1, 1], 'reflect')
    """
    extra = [b - a for a, b in zip(x.shape, y.shape)]
    if y.ndim != x.ndim or min(extra) < 0:
        return None
    # x's first element lands where its value is in y (x's values are distinct): a few places
    # to try, not every split of the widths (each a pad of the whole tensor)
    starts = np.argwhere(y == x.flat[0]) if x.size else np.zeros((1, x.ndim), int)
    for before in (tuple(int(b) for b in start) for start in starts):
        if any(b > e for b, e in zip(before, extra)):
            continue
        widths = [(b, e - b) for b, e in zip(before, extra)]
        for mode in _MOVES:
            if mode == "reflect" and any(b >= n or e - b >= n for (b, _), e, n in zip(widths, extra, x.shape)):
                continue        # numpy would reflect twice; ONNX's reflect reads within the tensor
            if np.array_equal(np.pad(x, widths, mode=mode), y):
                return list(before), [e - b for b, e in zip(before, extra)], mode
    return None


class PadRule:
    """``call_tir(pad, dq(x))`` -> ``dq(nn.pad(x))`` (the module docstring). Like
    :class:`~.rules.Rule` it has a ``name`` and ``rewriter(declined)``.

    >>> rule = PadRule()
    >>> rule.name, callable(rule.rewriter({}))
    ('pad', True)
    """

    name = "pad"

    def rewriter(self, declined: dict) -> Callable[[tvm.IRModule], tvm.IRModule]:
        """A module -> module rewrite whose declines are counted in ``declined``."""
        return lambda mod: _PadMutator(mod, declined).rewrite()


@mutator
class _PadMutator(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, declined: dict) -> None:
        super().__init__(mod)
        self.mod, self.declined, self.plans = mod, declined, {}

    def rewrite(self) -> tvm.IRModule:
        return rewrite_sites(self, self.mod, PadRule.name, self.declined, self._site)

    def _site(self, value: relax.Expr, bindings: dict) -> tuple | None:
        dq = self._pad_of_dequantize(value, bindings)
        return None if dq is None else self.plan(value, dq)

    def _pad_of_dequantize(self, value, bindings: dict) -> relax.Call | None:
        """The dequantize a ``call_tir`` of a pad reads, if ``value`` is one."""
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and str(value.op.name) == "relax.call_tir" and isinstance(value.args[0], relax.GlobalVar)
                and _PAD_NAME.match(value.args[0].name_hint) and isinstance(value.args[1], relax.Tuple)
                and len(value.args[1].fields) == 1):
            return None
        source = value.args[1].fields[0]
        dq = bindings.get(source, source)
        if (isinstance(dq, relax.Call) and isinstance(dq.op, tvm.ir.Op) and str(dq.op.name) == "relax.dequantize"
                and all(isinstance(a, tvm.ir.Constant) for a in dq.args[1:])):
            return dq
        return None

    def plan(self, call: relax.Call, dq: relax.Call) -> tuple:
        x = dq.args[0]
        if str(x.ty.dtype) != "int8":
            raise Declined(f"a pad of a dequantized {x.ty.dtype} tensor (the integer form is for int8)")
        in_dims, out_dims = dims_of(dq), dims_of(call)
        if not all(isinstance(d, int) for d in (*in_dims, *out_dims)):
            raise Declined("a pad of a tensor with dynamic dimensions")
        scale, zero_point = (c.value.numpy().astype(np.float64).reshape(-1) for c in dq.args[1:])
        if scale.size != 1 or zero_point.size != 1:
            raise Declined("a pad of a per-channel quantised tensor")
        x_values, y_values = _run(self.mod[call.args[0]], in_dims, out_dims)
        widths = lambda before, after: [w for pair in zip(before, after) for w in pair]   # noqa: E731
        moved = moved_pad_of(x_values, y_values)
        if moved is not None:
            before, after, mode = moved
            return x, widths(before, after), mode, dq
        found = pad_of(x_values, y_values)
        if found is None:
            raise Declined(f"a call of {call.args[0].name_hint} that is not a constant, reflect or edge pad of its input")
        before, after, value = found
        steps = np.float32(value) / np.float32(scale[0])
        if steps != np.round(steps) or not INT8_MIN <= steps + zero_point[0] <= INT8_MAX:
            raise Declined(f"a pad with {value}, not a value of the int8 tensor's scale")
        return x, widths(before, after), float(steps + zero_point[0]), dq

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        plan = self.plans.get(binding.var)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        x, widths, value, dq = plan
        # value: the constant's int8 value, or the mode of a pad that moves elements
        padded = self.builder_.emit(relax.op.nn.pad(self.visit_expr(x), widths, pad_mode=_MOVES[value])
                                    if value in _MOVES else relax.op.nn.pad(self.visit_expr(x), widths, pad_value=value))
        new = relax.op.dequantize(padded, dq.args[1], dq.args[2], axis=int(dq.attrs.axis),
                                  out_dtype=str(dq.attrs.out_dtype))
        # the pad's variable keeps its name and type: its users need no change
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(new)))


def _run(func: tvm.tirx.PrimFunc, in_dims: tuple, out_dims: tuple) -> tuple[np.ndarray, np.ndarray]:
    """``func``'s input and output, run once on llvm with distinct inputs (1, 2, 3, ...)."""
    x = np.arange(1, int(np.prod(in_dims)) + 1, dtype=np.float32).reshape(in_dims)
    y = np.zeros(out_dims, np.float32)
    built = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")
    out = tvm.runtime.tensor(y)
    built["main"](tvm.runtime.tensor(x), out)
    return x, out.numpy()
