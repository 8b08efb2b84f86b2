"""Unary functions of one int8 tensor as a 256-entry lookup table.

A QDQ model computes an activation such as sigmoid, HardSwish's ``clip(x/6 + 1/2, 0, 1)``,
GELU's ``erf(x / sqrt 2)``, tanh or exp as ``quantize(f(dequantize(x)))``, ``f`` a chain of
element-wise float operators whose other operands are constants. Whatever ``f`` is, the result
is a function of the int8 ``x`` alone, which takes 256 values: it is a table, computed here at
compile time, and the site becomes ``take(table, x + 128)`` between int8 tensors (an int8
accelerator's lookup table, loaded once).

The table is what onnxruntime's exact QDQ execution computes for the same chain: the
dequantize as float32 ``(x - z_x) * s_x``, each operator in float32, the quantize as
``round_half_even(v / s_y) + z_y`` saturated to int8. Arithmetic operators (add, multiply,
divide, clip, max, min) are bit-exact with onnxruntime. Sigmoid is onnxruntime's own: MLAS's
logistic, a rational approximation whose ``p / q + 0.5`` cancels near 0, off the true
sigmoid by up to 1.8e-7, which is many steps of a small output scale (a detector's
probability map quantised at 1.3e-6: 26% of its elements one step off with the true
function). Computed as its fused multiply-add kernels do (x86-64 with FMA3, ARM64), it is
bit-equal to onnxruntime's on all but about 1 in 300,000 float32 inputs. The other
transcendental ones are evaluated in float64 and rounded to float32 (the exact function,
where onnxruntime's vectorised approximations may differ in the last bit): those can differ
by one step, only where the value lies within that approximation's error of a rounding tie.

A site is taken when the float region under the ``quantize`` reads one dequantized tensor
(any number of times, e.g. ``x * sigmoid(x)``) through operators of :data:`EVALUATED`,
LeakyRelu and PRelu with one slope (and ``call_tir`` of the TE ``maximum``/``minimum``... that TVM's ONNX frontend emits for a Clip
whose bounds are not constants) with constant scalars, and through a ``quantize`` then
``dequantize`` of such a function of the same tensor (HardSwish exported as ``x *
HardSigmoid(x)`` quantises the gate before the multiply; the chain, each quantize rounded as
onnxruntime rounds it, is still one table) or through another rule's table lookup read only
there (a table of a table is one table). It declines, saying why, when the
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
    """``fn`` of its operands (one, or Pow's two) evaluated in float64, the result rounded to
    float32 (the exact function)."""
    return lambda *xs: fn(*(np.asarray(x, np.float64) for x in xs)).astype(_f32)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


#: MLAS's logistic (onnxruntime's Sigmoid, from Eigen): ``x`` clamped to [-18, 18], then
#: ``p(x) / q(x) + 0.5`` with these float32 coefficients, highest power first (odd powers in p).
_LOGISTIC_P = (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
               2.48287947061529e-01)
_LOGISTIC_Q = (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
               1.16817656904453e-01, 9.93151921023180e-01)


def _fma(a, b, c) -> np.ndarray:
    """float32 ``a * b + c`` rounded once, as a fused multiply-add: the product of two float32
    is exact in float64; the sum's float64 rounding then float32's differs from one rounding
    only when the first lands on a tie of the second."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(_f32)


def _logistic(x) -> np.ndarray:
    """onnxruntime's Sigmoid of float32 ``x``: MLAS's logistic kernel with fused multiply-adds.

    >>> _logistic(np.float32([-16.0, 0.0, 3.0])).tolist()       # the true values: 1.13e-07, 0.5, 0.9526
    [5.960464477539063e-08, 0.5, 0.9525741338729858]
    """
    v = np.clip(_f32(x), _f32(-18), _f32(18))
    v2 = v * v
    p, q = _f32(_LOGISTIC_P[0]), _f32(_LOGISTIC_Q[0])
    for a in _LOGISTIC_P[1:]:
        p = _fma(p, v2, _f32(a))
    for b in _LOGISTIC_Q[1:]:
        q = _fma(q, v2, _f32(b))
    return np.clip(p * v / q + _f32(0.5), _f32(0), _f32(1))


#: Relax operator -> its float32 numpy evaluation, on numpy arrays (a table's 256 inputs, or
#: constant scalars). Arithmetic in float32, as onnxruntime computes it.
EVALUATED: dict[str, Callable] = {
    "relax.add": lambda a, b: _f32(a) + _f32(b),
    "relax.subtract": lambda a, b: _f32(a) - _f32(b),
    "relax.multiply": lambda a, b: _f32(a) * _f32(b),
    "relax.divide": lambda a, b: _f32(a) / _f32(b),
    "relax.maximum": lambda a, b: np.maximum(_f32(a), _f32(b)),
    "relax.minimum": lambda a, b: np.minimum(_f32(a), _f32(b)),
    "relax.power": _exact(np.power),
    "relax.negative": lambda a: -_f32(a),
    "relax.abs": lambda a: np.abs(_f32(a)),
    "relax.square": lambda a: _f32(a) * _f32(a),
    "relax.floor": lambda a: np.floor(_f32(a)),
    "relax.ceil": lambda a: np.ceil(_f32(a)),
    "relax.nn.relu": lambda a: np.maximum(_f32(a), _f32(0)),
    "relax.sigmoid": _logistic,
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

#: the operators a table may compute (:meth:`_Region.call`): a function of one int8 tensor
#: made of these is one table where a quantize reads its result
TABULATED = frozenset(EVALUATED) | {"relax.clip", "relax.astype", "relax.nn.leakyrelu", "relax.nn.prelu"}

#: TE element-wise functions TVM's frontend emits as ``call_tir`` (``cls.maximum1``...)
_TE_NAMES = re.compile(r"^(add|subtract|multiply|divide|maximum|minimum)\d*$")


class _NotATable(Exception):
    """The quantize's input is not an element-wise function of a dequantized tensor (another
    rule's site, or float computation the pass does not touch): skipped without a word."""


class _Region:
    """The float region under one ``quantize``: evaluates it on the 256 values of its one
    dequantized int8 input (``leaf``), following variables through ``bindings``."""

    def __init__(self, bindings: dict, single_use: frozenset = frozenset()) -> None:
        self.bindings = bindings
        #: variables read once: a table lookup among them is folded into the table (one with
        #: other users stays, and folding it would only add a second lookup of its input)
        self.single_use = single_use
        self.leaf = self.source = None
        self.memo: dict = {}
        self.ops = 0
        #: quantizes inside the region (each followed by a dequantize): folded into the table
        self.nested = 0

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
        if name in ("relax.nn.leakyrelu", "relax.nn.prelu"):
            # onnxruntime: x where x >= 0 (PRelu: > 0; equal at 0), else slope * x, in float32
            slope = _f32(call.attrs.alpha) if name == "relax.nn.leakyrelu" else self.slope(operands[1])
            self.ops += 1
            x = _f32(self.value(operands[0]))
            return np.where(x >= 0, x, slope * x).astype(_f32)
        fn = EVALUATED.get(name)
        if fn is None:
            raise _NotATable()
        self.ops += 1
        return fn(*[self.value(a) for a in operands])

    def slope(self, alpha: relax.Expr) -> np.float32:
        """A PRelu's one slope: a constant, maybe reshaped (as TVM's ONNX frontend writes it)."""
        while isinstance(alpha, relax.Var) and alpha in self.bindings:
            alpha = self.bindings[alpha]
            if isinstance(alpha, relax.Call) and str(alpha.op.name) in ("relax.reshape", "relax.expand_dims",
                                                                         "relax.squeeze"):
                alpha = alpha.args[0]
        if not isinstance(alpha, tvm.ir.Constant):
            raise _NotATable()
        values = alpha.value.numpy()
        if values.size and np.any(values != values.reshape(-1)[0]):
            raise Declined(f"a PRelu with {values.size} different slopes (one table per channel)")
        return _f32(values.reshape(-1)[0])

    def dequantize(self, call: relax.Call):
        x, scale, zero_point = call.args
        if not isinstance(scale, tvm.ir.Constant) or not isinstance(zero_point, tvm.ir.Constant):
            raise _NotATable()
        s, z = _scalar_constant(scale), _scalar_constant(zero_point)
        if isinstance(x, tvm.ir.Constant):
            return _f32(np.int64(_scalar_constant(x)) - z) * _f32(s)
        inner = self.requantized(x)
        if inner is not None:
            return _f32(inner - int(z)) * _f32(s)
        if self.leaf is not None and not x.same_as(self.leaf):
            raise Declined("the float region reads two tensors (a function of two int8 tensors is not one table)")
        if str(x.ty.dtype) != "int8":
            raise Declined(f"a dequantize of {x.ty.dtype} (the table is indexed by int8)")
        if self.source is not None and self.source != (float(s), int(z)):
            raise Declined("the float region dequantizes its tensor at two scales")
        self.leaf, self.source = x, (float(s), int(z))
        return _f32(np.arange(INT8_MIN, INT8_MAX + 1) - int(z)) * _f32(s)

    def requantized(self, x: relax.Expr) -> np.ndarray | None:
        """The int8 values of ``x`` when it is itself ``quantize(g(dequantize(leaf)))``, ``g``
        element-wise, as onnxruntime computes it (HardSwish exported as ``x *
        HardSigmoid(x)`` quantises the HardSigmoid before the multiply): the whole chain is
        still a function of the one int8 leaf, i.e. one table; likewise when ``x`` is a table
        lookup read only here (:meth:`looked_up`). None when ``x`` is neither (then ``x`` is the
        leaf candidate); the region's state is left as it was."""
        q = self.bindings.get(x) if isinstance(x, relax.Var) else None
        lookup = _lookup(q, self.bindings) if x in self.single_use else None
        if lookup is not None:
            return self.looked_up(*lookup)
        if not (isinstance(q, relax.Call) and isinstance(q.op, tvm.ir.Op) and str(q.op.name) == "relax.quantize"
                and str(q.attrs.out_dtype) == "int8" and all(isinstance(a, tvm.ir.Constant) for a in q.args[1:])):
            return None
        saved = (self.leaf, self.source, dict(self.memo), self.ops, self.nested)
        try:
            v = _f32(self.value(q.args[0]))
            if np.any(np.isnan(v)):
                raise Declined("NaN inside")
        except (_NotATable, Declined):
            v = None                # e.g. a convolution's output, or two tensors: x is an int8 leaf
        # a 0-d value is a constant's (every function of the leaf has its 256 values)
        if v is None or np.ndim(v) == 0:
            self.leaf, self.source, self.memo, self.ops, self.nested = saved
            return None
        self.nested += 1
        s, z = _f32(_scalar_constant(q.args[1])), int(_scalar_constant(q.args[2]))
        return np.clip(np.rint(v / s).astype(np.float64) + z, INT8_MIN, INT8_MAX).astype(np.int64)


    def looked_up(self, table: np.ndarray, y: relax.Expr) -> np.ndarray | None:
        """The int8 values of ``table[y + 128]`` (an earlier rule's table, e.g. of an add of a
        constant) when ``y`` is the leaf or a function of it: a table of a table is one table.
        None if ``y`` cannot be (it is another tensor than the leaf)."""
        inner = self.requantized(y)
        if inner is None:
            if self.leaf is not None and not y.same_as(self.leaf):
                return None
            self.leaf, inner = y, np.arange(INT8_MIN, INT8_MAX + 1)
        self.nested += 1
        self.ops += 1
        return table[inner + 128].astype(np.int64)


def _lookup(call, bindings: dict) -> tuple[np.ndarray, relax.Expr] | None:
    """``(table, y)`` if ``call`` is :func:`~.rules.emit_table`'s ``take(table, astype(y,
    int32) + 128)`` of an int8 ``y``, else None."""
    def bound(e):
        return bindings.get(e, e) if isinstance(e, relax.Var) else e

    def op(e, name):
        return isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and str(e.op.name) == name

    if not (op(call, "relax.take") and isinstance(call.args[0], tvm.ir.Constant)):
        return None
    table = call.args[0].value.numpy()
    index = bound(call.args[1])
    if not (table.dtype == np.int8 and table.shape == (256,) and op(index, "relax.add")
            and isinstance(index.args[1], tvm.ir.Constant) and int(index.args[1].value.numpy()) == 128):
        return None
    cast = bound(index.args[0])
    if not (op(cast, "relax.astype") and str(cast.args[0].ty.dtype) == "int8"):
        return None
    return table, cast.args[0]


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

    With ``nested_only`` it takes only the sites whose chain quantizes and dequantizes inside
    (HardSwish as ``x * HardSigmoid(x)``) and declines nothing: run before the rules of two
    quantised tensors, which would otherwise make the multiply a fixed-point product of ``x``
    and a table of ``x`` (two operators, one step from onnxruntime) instead of one table.

    >>> rule = TableRule()
    >>> rule.name, callable(rule.rewriter({}))
    ('table', True)
    """

    name = "table"

    def __init__(self, nested_only: bool = False) -> None:
        self.nested_only = nested_only

    def rewriter(self, declined: dict) -> Callable[[tvm.IRModule], tvm.IRModule]:
        """A module -> module rewrite whose declines are counted in ``declined``."""
        return lambda mod: _TableMutator(mod, declined, self.nested_only).rewrite()


@mutator
class _TableMutator(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, declined: dict, nested_only: bool) -> None:
        super().__init__(mod)
        self.mod, self.declined, self.plans, self.nested_only = mod, declined, {}, nested_only

    def rewrite(self) -> tvm.IRModule:
        """The module with every table site rewritten (the same module if there is none)."""
        uses: dict = {}
        for f in self.mod.functions.values():
            if isinstance(f, relax.Function):
                relax.analysis.post_order_visit(f.body, lambda e: uses.__setitem__(e, uses.get(e, 0) + 1)
                                                if isinstance(e, relax.Var) else None)
        self.single_use = frozenset(v for v, n in uses.items() if n == 1)
        return rewrite_sites(self, self.mod, TableRule.name, self.declined, self._site)

    def _site(self, value: relax.Expr, bindings: dict) -> tuple | None:
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and str(value.op.name) == "relax.quantize"):
            return None
        try:
            return self.plan(value, bindings, self.single_use)
        except _NotATable:
            return None
        except Declined:
            if self.nested_only:            # the other rules may take the site: not a decline
                return None
            raise

    def plan(self, q: relax.Call, bindings: dict, single_use: frozenset) -> tuple[relax.Var, np.ndarray, list]:
        """The int8 input, the table and the moves (outermost first) for the quantize ``q``."""
        body, scale, zero_point = q.args
        if (str(q.attrs.out_dtype) != "int8" or not isinstance(scale, tvm.ir.Constant)
                or not isinstance(zero_point, tvm.ir.Constant)):
            raise _NotATable()
        # element moves and maxima over the function's values (a max pool after a division):
        # they commute with it (maxima if it is monotone), so they run on the table's int8
        # output: the lookup follows its producer (a convolution's requantise, which accel's
        # LUT takes in the convolution's partition) and the moves stay between int8 tensors
        moves = []
        while True:
            call = bindings.get(body, body)
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                    and str(call.op.name) in COMMUTING_OPS):
                break
            moves.append(call)
            body = call.args[0]
        region = _Region(bindings, single_use)
        with np.errstate(all="ignore"):     # NaN and infinities: judged on the table
            out = region.value(body)
        if region.leaf is None or region.ops == 0 or (self.nested_only and region.nested == 0):
            raise _NotATable()              # constants only, or a bare rescale: other rules' sites
        if not same_dims(dims_of(region.leaf), dims_of(moves[-1].args[0] if moves else q)):
            raise Declined("the function broadcasts its input to another shape")
        for call in moves:
            moves_elements(call)
        if any(str(c.op.name) in MAXIMA for c in moves) and np.any(np.diff(np.broadcast_to(out, (256,))) < 0):
            raise Declined("a maximum of a function that is not monotone (they do not commute)")
        target = (float(_scalar_constant(scale)), int(_scalar_constant(zero_point)))
        # the source scale only places dq(x), which the region has computed: none if the leaf
        # is only read through a table lookup
        table = quantized_table(lambda _: out, region.source or (1.0, 0), target)
        return region.leaf, table, moves

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        plan = self.plans.get(binding.var)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        x, table, moves = plan
        value = emit_table(self.visit_expr(x), table)
        for call in reversed(moves):
            value = relax.Call(call.op, [self.builder_.emit(value), *call.args[1:]], call.attrs)
        # the quantize's own variable keeps its name and type: its users need no change
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))
