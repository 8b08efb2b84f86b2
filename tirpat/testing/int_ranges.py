"""Interval analysis of an integer Relax function: which values can each int32 binding take?

:func:`int_ranges` walks a Relax function's bindings in order and bounds every integer
tensor, given the ranges of its integer parameters (all of int8 by default: the worst case
of any input), with exact integer arithmetic (Python ints, no wrapping). Bounds are arrays
that broadcast against the tensor, so a per-channel requantise (a convolution's bound per
output channel times that channel's multiplier) is bounded per channel, as
``tp.integerize`` chooses its multipliers. :func:`int32_overflows` lists the bindings whose
bound leaves their dtype: for ``tp.integerize``'s output there must be none.

Covered: the operators ``tp.integerize`` emits (int8 x int8 -> int32 ``conv2d`` and
``matmul`` with constant weights, ``matmul`` of two int8 tensors, ``add``/``subtract``/
``multiply``, ``right_shift``, ``floor_divide`` by a positive constant,
``maximum``/``minimum``/``clip``/``relu``, ``sum``,
``astype``, ``quantize``, the operators that move or select int8 elements), and the
half-to-even rounding's parity ``(v >> s) - 2 * (v >> (s + 1))``, which is 0 or 1 (an
interval analysis that did not know it would see ``|v| / 2**s`` of slack). Anything else on
integers raises ``NotImplementedError`` naming it: an unbounded value is never passed over;
a right shift by the bit width or more (undefined for LLVM) raises ``ValueError``.

>>> from tvm import relax
>>> x = relax.Var("x", relax.TensorType((4,), "int8"))
>>> bb = relax.BlockBuilder()
>>> with bb.function("main", [x]):
...     with bb.dataflow():
...         y = bb.emit(relax.op.multiply(relax.op.astype(x, "int32"), relax.const(2**25, "int32")))
...         z = bb.emit_output(relax.op.astype(relax.op.clip(y, -128, 127), "int8"))
...     _ = bb.emit_func_output(z)
>>> [(name, op, lo, hi) for name, op, lo, hi in int32_overflows(bb.get()["main"])]
[('lv1', 'relax.multiply', -4294967296, 4261412864)]
"""

from __future__ import annotations

import numpy as np
from tvm import ir, relax, tirx

__all__ = ["Range", "int_ranges", "int32_overflows"]

_LIMITS = {"int8": (-(2**7), 2**7 - 1), "uint8": (0, 2**8 - 1), "int16": (-(2**15), 2**15 - 1),
           "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
#: Operators that only move, select or take maxima of elements: the result is within the
#: input's overall range.
_WITHIN = {"relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims", "relax.flatten",
           "relax.strided_slice", "relax.nn.max_pool2d", "relax.max", "relax.min", "relax.broadcast_to",
           "relax.take", "relax.image.resize2d"}


class Range:
    """Bounds ``lo <= v <= hi`` of an integer tensor: object arrays of Python ints that
    broadcast against it."""

    def __init__(self, lo, hi) -> None:
        self.lo = np.asarray(lo, dtype=object)
        self.hi = np.asarray(hi, dtype=object)

    @classmethod
    def of(cls, dtype: str) -> "Range":
        lo, hi = _LIMITS[dtype]
        return cls(lo, hi)

    @classmethod
    def exact(cls, values: np.ndarray) -> "Range":
        v = np.vectorize(int, otypes=[object])(values) if values.size else values.astype(object)
        return cls(v, v)

    def overall(self) -> "Range":
        return Range(min(self.lo.ravel()), max(self.hi.ravel()))

    def within(self, dtype: str) -> bool:
        lo, hi = _LIMITS[dtype]
        return bool(np.all(self.lo >= lo) and np.all(self.hi <= hi))

    def __add__(self, o: "Range") -> "Range":
        return Range(self.lo + o.lo, self.hi + o.hi)

    def __neg__(self) -> "Range":
        return Range(-self.hi, -self.lo)

    def __mul__(self, o: "Range") -> "Range":
        products = [self.lo * o.lo, self.lo * o.hi, self.hi * o.lo, self.hi * o.hi]
        return Range(np.minimum.reduce(np.broadcast_arrays(*products)), np.maximum.reduce(np.broadcast_arrays(*products)))

    def clip(self, lo, hi) -> "Range":
        return Range(np.minimum(np.maximum(self.lo, lo), hi), np.minimum(np.maximum(self.hi, lo), hi))


def _dtype(e) -> str:
    return str(e.ty.dtype) if isinstance(e.ty, relax.TensorType) else ""


def _scalar(e) -> int | float:
    value = getattr(e, "value", e)
    value = getattr(value, "value", value)
    return value


def int_ranges(func: relax.Function, inputs: dict | None = None) -> dict:
    """``{binding var: Range}`` for every integer binding of ``func`` (and its integer
    parameters), in order. ``inputs`` maps a parameter's name to ``(lo, hi)``; an integer
    parameter not in it may take any value of its dtype."""
    env: dict = {}
    for p in func.params:
        if _dtype(p) in _LIMITS:
            env[p] = Range(*inputs[p.name]) if inputs and p.name in inputs else Range.of(_dtype(p))
    defs: dict = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            defs[binding.var] = value
            if isinstance(value, relax.Var) and value in env:
                env[binding.var] = env[value]
            elif isinstance(value, relax.Call) and isinstance(value.op, ir.Op) and _dtype(binding.var) in _LIMITS:
                env[binding.var] = _call(value, env, defs)
            elif isinstance(value, relax.TupleGetItem) and _dtype(binding.var) in _LIMITS:
                env[binding.var] = _part(value, env, defs)
    return env


def _part(item: relax.TupleGetItem, env: dict, defs: dict) -> Range:
    """A part of a split: within its input's range."""
    source = defs.get(item.tuple_value)
    if isinstance(source, relax.Call) and isinstance(source.op, ir.Op) and str(source.op.name) == "relax.split":
        return _arg(source.args[0], env).overall()
    raise NotImplementedError(f"an item of a tuple that is not a split's: {item}")


def int32_overflows(func: relax.Function, inputs: dict | None = None) -> list:
    """``[(var name, op, lo, hi)]`` for each integer binding whose bound leaves its dtype
    (an intermediate that can wrap); empty when nothing can."""
    out = []
    params = {p.__chandle__() for p in func.params}
    for var, rng in int_ranges(func, inputs).items():
        if var.__chandle__() not in params and not rng.within(_dtype(var)):
            overall = rng.overall()
            out.append((var.name, _op_name(func, var), int(overall.lo), int(overall.hi)))
    return out


def _op_name(func, var) -> str:
    for block in func.body.blocks:
        for b in block.bindings:
            if b.var.same_as(var) and isinstance(b.value, relax.Call):
                return str(b.value.op.name)
    return ""


def _arg(e, env: dict) -> Range:
    if isinstance(e, ir.Constant):
        return Range.exact(e.value.numpy())
    if isinstance(e, relax.Var) and e in env:
        return env[e]
    raise NotImplementedError(f"an operand that is not an integer tensor bounded so far: {e}")


def _const_int(e) -> int | None:
    """The value of a one-element integer constant, else None."""
    if isinstance(e, ir.Constant) and e.value.numpy().size == 1:
        return int(e.value.numpy().reshape(()))
    return None


def _parity(call: relax.Call, defs: dict) -> bool:
    """Whether ``call`` is ``(v >> s) + (v >> (s + 1)) * -2``: a parity, 0 or 1."""
    def value(e):
        return defs.get(e, e)

    def shift_of(c) -> int | None:
        if isinstance(c, relax.Call) and str(c.op.name) == "relax.right_shift":
            return _const_int(c.args[1])
        return None

    a, b = (value(x) for x in call.args)
    for first, second in ((a, b), (b, a)):
        if not (isinstance(second, relax.Call) and str(second.op.name) == "relax.multiply"
                and _const_int(second.args[1]) == -2):
            continue
        half = value(second.args[0])
        s, s1 = shift_of(first), shift_of(half)
        if s is not None and s1 == s + 1 and first.args[0].same_as(half.args[0]):
            return True
    return False


def _call(call: relax.Call, env: dict, defs: dict) -> Range:
    op = str(call.op.name)
    args = call.args
    out_dtype = _dtype(call)
    if op == "relax.quantize":
        return Range.of(out_dtype)
    if op == "relax.astype":
        return _arg(args[0], env)        # unchanged: a narrowing that wraps leaves its dtype, and is reported
    if op == "relax.concat":
        parts = [_arg(a, env).overall() for a in args[0].fields]
        return Range(min(p.lo for p in parts), max(p.hi for p in parts))
    if op in _WITHIN:
        return _arg(args[0], env).overall()
    if op == "relax.nn.pad":
        if str(call.attrs.pad_mode) in ("reflect", "replicate"):
            return _arg(args[0], env).overall()     # elements of the input, moved
        if str(call.attrs.pad_mode) != "constant":
            raise NotImplementedError(f"a {call.attrs.pad_mode} pad")
        x, value = _arg(args[0], env).overall(), int(call.attrs.pad_value)
        return Range(min(x.lo, value), max(x.hi, value))
    if op == "relax.add":
        if _parity(call, defs):
            return Range(0, 1)
        return _arg(args[0], env) + _arg(args[1], env)
    if op == "relax.subtract":
        return _arg(args[0], env) + -_arg(args[1], env)
    if op == "relax.negative":
        return -_arg(args[0], env)
    if op == "relax.multiply":
        return _arg(args[0], env) * _arg(args[1], env)
    if op == "relax.right_shift":
        x, s = _arg(args[0], env), _arg(args[1], env)
        if not (np.all(s.lo == s.hi) and np.all(s.lo >= 0)):
            raise NotImplementedError("a right shift by a non-constant or negative amount")
        if np.any(s.lo >= 8 * np.dtype(_dtype(call)).itemsize):
            raise ValueError(f"a right shift of {_dtype(call)} by {max(s.lo.ravel())}: undefined (LLVM's poison)")
        shift = np.vectorize(lambda v, k: v >> k, otypes=[object])
        return Range(shift(x.lo, s.lo), shift(x.hi, s.lo))
    if op == "relax.floor_divide":
        x, d = _arg(args[0], env), _arg(args[1], env)
        if not (np.all(d.lo == d.hi) and np.all(d.lo > 0)):
            raise NotImplementedError("a floor division by a non-constant or non-positive divisor")
        div = np.vectorize(lambda v, k: v // k, otypes=[object])
        return Range(div(x.lo, d.lo), div(x.hi, d.lo))
    if op in ("relax.maximum", "relax.minimum"):
        a, b = _arg(args[0], env), _arg(args[1], env)
        f = np.maximum if op == "relax.maximum" else np.minimum
        return Range(f(a.lo, b.lo), f(a.hi, b.hi))
    if op == "relax.clip":
        return _arg(args[0], env).clip(int(_scalar(args[1])), int(_scalar(args[2])))
    if op == "relax.nn.relu":
        x = _arg(args[0], env)
        return Range(np.maximum(x.lo, 0), np.maximum(x.hi, 0))
    if op == "relax.sum":
        return _sum(call, _arg(args[0], env))
    if op in ("relax.nn.conv2d", "relax.matmul"):
        return _gemm(call, env, defs)
    raise NotImplementedError(f"no interval rule for {op} on integers")


def _sum(call: relax.Call, x: Range) -> Range:
    shape = [int(d) for d in call.args[0].ty.shape.values]
    axes = range(len(shape)) if call.attrs.axis is None else [int(a) % len(shape) for a in call.attrs.axis]
    lo, hi = (np.broadcast_to(v, np.broadcast_shapes(v.shape, (1,) * len(shape))) for v in (x.lo, x.hi))
    lo, hi = lo.reshape((1,) * (len(shape) - lo.ndim) + lo.shape), hi.reshape((1,) * (len(shape) - hi.ndim) + hi.shape)
    for a in sorted(axes, reverse=True):
        n = shape[a] if lo.shape[a] == 1 else 1     # a broadcast bound counts once per element
        lo = lo.sum(axis=a, keepdims=True) * n
        hi = hi.sum(axis=a, keepdims=True) * n
    if not call.attrs.keepdims:
        lo, hi = lo.squeeze(axis=tuple(axes)), hi.squeeze(axis=tuple(axes))
    return Range(lo, hi)


def _constant(e, defs: dict) -> bool:
    """Whether ``e`` is a constant, through ``permute_dims`` and ``astype``."""
    e = defs.get(e, e)
    while isinstance(e, relax.Call) and str(e.op.name) in ("relax.permute_dims", "relax.astype"):
        e = defs.get(e.args[0], e.args[0])
    return isinstance(e, ir.Constant)


def _weight(e, defs: dict) -> np.ndarray:
    """A constant weight, through a ``permute_dims`` (returned permuted) or an ``astype``."""
    e = defs.get(e, e)
    if isinstance(e, ir.Constant):
        return e.value.numpy()
    if isinstance(e, relax.Call) and str(e.op.name) == "relax.permute_dims":
        w = _weight(e.args[0], defs)
        axes = None if e.attrs.axes is None else [int(a) for a in e.attrs.axes]
        return np.transpose(w, axes)
    if isinstance(e, relax.Call) and str(e.op.name) == "relax.astype":
        return _weight(e.args[0], defs)
    raise NotImplementedError(f"a convolution or matmul whose weight is not a constant: {e}")


def _gemm(call: relax.Call, env: dict, defs: dict) -> Range:
    """Per output channel: ``sum(w+ * x_hi + w- * x_lo)`` and the converse, the input taken
    at its overall range (each product's extremes; the sum of the extremes bounds the sum)."""
    x = _arg(call.args[0], env).overall()
    if str(call.op.name) == "relax.matmul" and not _constant(call.args[1], defs):
        # two activations (attention's Q K^T): each of the K products lies within the
        # extremes of the operands' overall ranges, a product's being at a corner
        y = _arg(call.args[1], env).overall()
        corners = [int(a) * int(b) for a in (x.lo, x.hi) for b in (y.lo, y.hi)]
        k = int(call.args[0].ty.shape.values[-1])
        return Range(k * min(corners), k * max(corners))
    w = _weight(call.args[1], defs).astype(np.int64)
    pos, neg = np.maximum(w, 0), np.minimum(w, 0)
    xlo, xhi = min(int(x.lo), 0), max(int(x.hi), 0)     # zero padding adds products of 0
    if str(call.op.name) == "relax.matmul":
        # w: [..., K, N]; one bound per N (last axis of the result)
        red = tuple(range(w.ndim - 1))
        hi = (pos.sum(axis=red).astype(object) * xhi + neg.sum(axis=red).astype(object) * xlo)
        lo = (pos.sum(axis=red).astype(object) * xlo + neg.sum(axis=red).astype(object) * xhi)
        return Range(lo, hi)
    attrs = call.attrs
    o_axis = str(attrs.kernel_layout).index("O")
    c_axis = str(attrs.out_layout).index("C")
    red = tuple(a for a in range(w.ndim) if a != o_axis)
    hi = pos.sum(axis=red).astype(object) * xhi + neg.sum(axis=red).astype(object) * xlo
    lo = pos.sum(axis=red).astype(object) * xlo + neg.sum(axis=red).astype(object) * xhi
    shape = [1] * 4
    shape[c_axis] = -1
    return Range(lo.reshape(shape), hi.reshape(shape))
