"""Unary functions of one int8 tensor as a 256-entry lookup table.

A QDQ model computes an activation such as sigmoid, HardSwish's ``clip(x/6 + 1/2, 0, 1)``,
GELU's ``erf(x / sqrt 2)``, tanh or exp as ``quantize(f(dequantize(x)))``, ``f`` a chain of
element-wise float operators whose other operands are constants. Whatever ``f`` is, the result
is a function of the int8 ``x`` alone, which takes 256 values: it is a table, computed here at
compile time, and the site becomes ``take(table, x + 128)`` between int8 tensors (an int8
accelerator's lookup table, loaded once).

The table is what onnxruntime's exact QDQ execution computes for the same chain: the
dequantize as float32 ``(x - z_x) * s_x``, each operator in float32 (the transcendental ones
evaluated in float64 and rounded to float32: the exact function, where onnxruntime's
vectorised approximations may differ in the last bit), the quantize as ``round_half_even(v /
s_y) + z_y`` saturated to int8. Arithmetic operators (add, multiply, divide, clip, max, min)
are bit-exact with onnxruntime; a transcendental one can differ by one step, only where its
value lies within onnxruntime's approximation error of a rounding tie.

A site is taken when the float region under the ``quantize`` reads one dequantized tensor
(any number of times, e.g. ``x * sigmoid(x)``) through operators of :data:`EVALUATED` (and
``call_tir`` of the TE ``maximum``/``minimum``... that TVM's ONNX frontend emits for a Clip
whose bounds are not constants) with constant scalars. It declines, saying why, when the
region reads two tensors, a constant varies by element, or the function is NaN somewhere.

>>> x = np.arange(-128, 128).astype(np.int8)
>>> table = quantized_table(lambda v: np.maximum(v, np.float32(0)), (0.1, 0), (0.1, 0))
>>> bool(np.array_equal(table, np.maximum(x, 0)))
True
"""

from __future__ import annotations

import math
import re
from typing import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .rules import (COMMUTING_OPS, INT8_MAX, INT8_MIN, MAXIMA, Declined, dims_of, emit_table, moves_elements,
                    prim_number, quantized_table, rewrite_sites, same_dims)

__all__ = ["TableRule", "quantized_table", "EVALUATED"]

_f32 = np.float32


def _exact(fn: Callable) -> Callable:
    """``fn`` evaluated in float64, the result rounded to float32 (the exact function)."""
    return lambda x: fn(np.asarray(x, np.float64)).astype(_f32)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


#: Relax operator -> its float32 numpy evaluation, on numpy arrays (a table's 256 inputs, or
#: constant scalars). Arithmetic in float32, as onnxruntime computes it.
EVALUATED: dict[str, Callable] = {
    "relax.add": lambda a, b: _f32(a) + _f32(b),
    "relax.subtract": lambda a, b: _f32(a) - _f32(b),
    "relax.multiply": lambda a, b: _f32(a) * _f32(b),
    "relax.divide": lambda a, b: _f32(a) / _f32(b),
    "relax.maximum": lambda a, b: np.maximum(_f32(a), _f32(b)),
    "relax.minimum": lambda a, b: np.minimum(_f32(a), _f32(b)),
    "relax.power": _exact(lambda a, b: np.power(a, np.asarray(b, np.float64))),
    "relax.negative": lambda a: -_f32(a),
    "relax.abs": lambda a: np.abs(_f32(a)),
    "relax.square": lambda a: _f32(a) * _f32(a),
    "relax.floor": lambda a: np.floor(_f32(a)),
    "relax.ceil": lambda a: np.ceil(_f32(a)),
    "relax.nn.relu": lambda a: np.maximum(_f32(a), _f32(0)),
    "relax.sigmoid": _exact(_sigmoid),
    "relax.tanh": _exact(np.tanh),
    "relax.exp": _exact(np.exp),
    "relax.log": _exact(np.log),
    "relax.sqrt": _exact(np.sqrt),
    "relax.rsqrt": _exact(lambda a: 1.0 / np.sqrt(a)),
    "relax.erf": _exact(_erf),
    "relax.nn.silu": _exact(lambda a: a * _sigmoid(a)),
    "relax.nn.gelu": _exact(lambda a: 0.5 * a * (1.0 + _erf(a / math.sqrt(2.0)))),
    "relax.nn.gelu_tanh": _exact(lambda a: 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi)
                                                                      * (a + 0.044715 * a**3)))),
    "relax.isnan": lambda a: np.isnan(_f32(a)),
    "relax.where": lambda c, a, b: np.where(c, _f32(a), _f32(b)),
}

#: TE element-wise functions TVM's frontend emits as ``call_tir`` (``cls.maximum1``...)
_TE_NAMES = re.compile(r"^(add|subtract|multiply|divide|maximum|minimum)\d*$")


class _NotATable(Exception):
    """The quantize's input is not an element-wise function of a dequantized tensor (another
    rule's site, or float computation the pass does not touch): skipped without a word."""


class _Region:
    """The float region under one ``quantize``: evaluates it on the 256 values of its one
    dequantized int8 input (``leaf``), following variables through ``bindings``."""

    def __init__(self, bindings: dict) -> None:
        self.bindings = bindings
        self.leaf = self.source = None
        self.memo: dict = {}
        self.ops = 0

    def value(self, e: relax.Expr):
        if e in self.memo:
            return self.memo[e]
        if isinstance(e, relax.Var):
            if e not in self.bindings:
                raise _NotATable()
            out = self.value(self.bindings[e])
        elif isinstance(e, tvm.ir.Constant):
            out = _scalar_constant(e)
        elif isinstance(e, relax.Call):
            out = self.call(e)
        else:
            raise _NotATable()
        self.memo[e] = out
        return out

    def call(self, call: relax.Call):
        if isinstance(call.op, tvm.ir.Op) and str(call.op.name) == "relax.dequantize":
            return self.dequantize(call)
        if isinstance(call.op, tvm.ir.Op) and str(call.op.name) == "relax.call_tir":
            callee, args = call.args[0], call.args[1]
            match = _TE_NAMES.match(callee.name_hint) if isinstance(callee, relax.GlobalVar) else None
            if match is None or not isinstance(args, relax.Tuple) or len(args.fields) != 2:
                raise _NotATable()
            name, operands = f"relax.{match.group(1)}", list(args.fields)
        elif isinstance(call.op, tvm.ir.Op):
            name, operands = str(call.op.name), list(call.args)
        else:
            raise _NotATable()
        if name == "relax.clip":
            self.ops += 1
            lo, hi = _f32(prim_number(operands[1])), _f32(prim_number(operands[2]))
            return np.minimum(np.maximum(_f32(self.value(operands[0])), lo), hi)
        if name == "relax.astype":
            if str(call.attrs.dtype) != "float32":
                raise _NotATable()
            return _f32(self.value(operands[0]))
        fn = EVALUATED.get(name)
        if fn is None:
            raise _NotATable()
        self.ops += 1
        return fn(*[self.value(a) for a in operands])

    def dequantize(self, call: relax.Call):
        x, scale, zero_point = call.args
        if not isinstance(scale, tvm.ir.Constant) or not isinstance(zero_point, tvm.ir.Constant):
            raise _NotATable()
        s, z = _scalar_constant(scale), _scalar_constant(zero_point)
        if isinstance(x, tvm.ir.Constant):
            return _f32(np.int64(_scalar_constant(x)) - z) * _f32(s)
        if self.leaf is not None and not x.same_as(self.leaf):
            raise Declined("the float region reads two tensors (a function of two int8 tensors is not one table)")
        if str(x.ty.dtype) != "int8":
            raise Declined(f"a dequantize of {x.ty.dtype} (the table is indexed by int8)")
        if self.source is not None and self.source != (float(s), int(z)):
            raise Declined("the float region dequantizes its tensor at two scales")
        self.leaf, self.source = x, (float(s), int(z))
        return _f32(np.arange(INT8_MIN, INT8_MAX + 1) - int(z)) * _f32(s)


def _scalar_constant(c: tvm.ir.Constant):
    """The one value of a constant (a scalar, or the same value everywhere)."""
    v = c.value.numpy()
    if v.size == 0 or np.any(v != v.reshape(-1)[0]):
        raise Declined(f"a constant of {v.size} different values (one table per element)")
    return v.reshape(-1)[0]


class TableRule:
    """``quantize(f(dequantize(x)))`` -> ``take(table, x + 128)`` (the module docstring).

    Not a DPL pattern: ``f`` is any chain, so the rule follows the bindings itself. Like
    :class:`~.rules.Rule` it has a ``name`` and ``rewriter(declined)``.

    >>> rule = TableRule()
    >>> rule.name, callable(rule.rewriter({}))
    ('table', True)
    """

    name = "table"

    def rewriter(self, declined: dict) -> Callable[[tvm.IRModule], tvm.IRModule]:
        """A module -> module rewrite whose declines are counted in ``declined``."""
        return lambda mod: _TableMutator(mod, declined).rewrite()


@mutator
class _TableMutator(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, declined: dict) -> None:
        super().__init__(mod)
        self.mod, self.declined, self.plans = mod, declined, {}

    def rewrite(self) -> tvm.IRModule:
        """The module with every table site rewritten (the same module if there is none)."""
        return rewrite_sites(self, self.mod, TableRule.name, self.declined, self._site)

    def _site(self, value: relax.Expr, bindings: dict) -> tuple | None:
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and str(value.op.name) == "relax.quantize"):
            return None
        try:
            return self.plan(value, bindings)
        except _NotATable:
            return None

    def plan(self, q: relax.Call, bindings: dict) -> tuple[relax.Var, np.ndarray, list]:
        """The int8 input, the table and the moves (outermost first) for the quantize ``q``."""
        body, scale, zero_point = q.args
        if (str(q.attrs.out_dtype) != "int8" or not isinstance(scale, tvm.ir.Constant)
                or not isinstance(zero_point, tvm.ir.Constant)):
            raise _NotATable()
        # element moves and maxima over the function's values (a max pool after a division):
        # they commute with it (maxima if it is monotone), so they run on the int8 input first
        moves = []
        while True:
            call = bindings.get(body, body)
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                    and str(call.op.name) in COMMUTING_OPS):
                break
            moves.append(call)
            body = call.args[0]
        region = _Region(bindings)
        with np.errstate(all="ignore"):     # NaN and infinities: judged on the table
            out = region.value(body)
        if region.leaf is None or region.ops == 0:
            raise _NotATable()              # constants only, or a bare rescale: other rules' sites
        if not same_dims(dims_of(region.leaf), dims_of(moves[-1].args[0] if moves else q)):
            raise Declined("the function broadcasts its input to another shape")
        for call in moves:
            moves_elements(call)
        if any(str(c.op.name) in MAXIMA for c in moves) and np.any(np.diff(np.broadcast_to(out, (256,))) < 0):
            raise Declined("a maximum of a function that is not monotone (they do not commute)")
        target = (float(_scalar_constant(scale)), int(_scalar_constant(zero_point)))
        table = quantized_table(lambda _: out, region.source, target)
        return region.leaf, table, moves

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        plan = self.plans.get(binding.var)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        x, table, moves = plan
        x = self.visit_expr(x)
        for call in reversed(moves):
            x = self.builder_.emit(relax.Call(call.op, [x, *call.args[1:]], call.attrs))
        take = self.builder_.normalize(emit_table(x, table))
        # the quantize's own variable keeps its name and type: its users need no change
        self.builder_.emit_normalized(relax.VarBinding(binding.var, take))
