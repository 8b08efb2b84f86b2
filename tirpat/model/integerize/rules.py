"""The integerising rewrite rules: QDQ patterns of TVM's ONNX import -> integer Relax.

Each rule is a ``tvm.relax.dpl`` pattern around one float operator that sits between
``dequantize`` and ``quantize`` and a callback that builds its integer form:

========================  ==================================================================
float (QDQ)               integer
========================  ==================================================================
ConvTranspose, stride =   a 1x1 conv2d to one channel per output channel and kernel tap,
kernel (+bias)            as conv2d below, then a pixel shuffle of the int8 result
                          (reshape, permute_dims, reshape)
conv2d / matmul (+bias)   int8 x int8 -> int32, int32 bias add (the input's zero point's
                          term folded in; a padded conv pads with that zero point first),
                          requantise epilogue
 (+ReLU/Clip)              (ReLU and Clip become the requantise's output bounds)
matmul of two int8        int8 x int8 -> int32 of the two tensors (zero points as one add of
activations               row and column sums), requantised; when float code reads the
                          result (a softmax), times float32 ``s_a s_b`` instead
add / subtract of two     both rescaled to a common fixed-point scale in int32, added (a
tensors                   subtrahend negated), requantised
multiply of two tensors   the int32 product of the centred operands, requantised
ReLU / Clip               ``clip`` on int8 (folded into the producer's requantise later)
max_pool2d, max, min,     the same op on int8: the dequantize moves after them (they commute
reshape, permute_dims,    with it), and ``q(dq(x))`` remains: a rescale
squeeze, expand_dims,
flatten, strided_slice,
nearest resize2d
avg_pool2d / mean         int32 window sums (``sum`` over a reshape for disjoint windows, else
                          a depthwise all-ones conv2d) less ``z_x`` per element present,
                          requantised by ``1 / count``
concat (2 to 8 inputs)    each input requantised to the output's scale, concatenated
quantize(dequantize(x))   ``x``, or a requantise when the scales differ (an add when only
                          the zero points do)
dequantize of uint8       dequantize of int8 ``x - 128`` with zero point ``z - 128``
any other element-wise    a 256-entry int8 table computed at compile time, ``take(table,
function of one tensor    x + 128)`` (:mod:`.tables`: sigmoid, HardSwish, GELU's erf, tanh...)
========================  ==================================================================

A requantise is emitted by :func:`emit_requantize` as the ALU-only chain of
:mod:`.fixed_point` (``maximum``/``minimum`` clamp if needed, ``multiply``, ``add``,
``right_shift``, ``clip``, ``astype``) and matched by :func:`requantize_pattern`.

A site a rule cannot make exact stays in float, and :class:`Declined` says why: the pass
collects those reasons. Activations may have zero points (tp.quantize's symmetric int8 has
0, onnxruntime's default uint8 or asymmetric int8 do not): a first rule shifts uint8 tensors
to int8 (``x - 128``, ``z - 128``); each rule then takes the zero points exactly (a
conv2d/matmul's input one in its bias, a padded conv padding with it, the output one in the
requantise's rounding constant, an average's as ``z_x`` times the elements present, a
weight's as an all-ones convolution's window sums). Weight zero points that differ by
channel, and a bias's that is not 0, are declined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.dpl import DFPattern, PatternMatchingRewriter, is_const, is_op, is_tuple, wildcard
from tvm.relax.expr_functor import PyExprMutator

from .fixed_point import INT32_MAX, Requantize

__all__ = ["Declined", "Rule", "all_rules", "rewrite_sites", "emit_requantize", "requantize_pattern", "clip_fold_rule",
           "dequantized_matmul_rule", "emit_table", "quantized_table", "dims_of", "same_dims", "prim_number",
           "COMMUTING_OPS", "MAXIMA", "moves_elements", "conv_transpose_declines"]

INT8_MIN, INT8_MAX = -128, 127
#: |x| <= 128 for any int8 x: the bound used for an activation whose producer is unknown.
INT8_MAGNITUDE = 128


class Declined(Exception):
    """A matched site that cannot be integerised exactly; the message says why."""


@dataclass
class Rule:
    """One rewrite: a name (for reports), a DPL pattern and ``build(match) -> Expr``."""

    name: str
    pattern: DFPattern
    build: Callable[["Match"], relax.Expr]

    def rewriter(self, declined: dict) -> PatternMatchingRewriter:
        """A ``PatternMatchingRewriter`` whose declines are recorded in ``declined``
        (``{(rule name, reason): count}``)."""

        def callback(orig, matches):
            try:
                return self.build(Match(orig, matches))
            except Declined as why:
                _count(declined, self.name, why)
                return orig

        return PatternMatchingRewriter.from_pattern(self.pattern, callback)


def _count(declined: dict, name: str, why: Declined) -> None:
    key = (name, str(why))
    declined[key] = declined.get(key, 0) + 1


def rewrite_sites(mutator: PyExprMutator, mod: tvm.IRModule, name: str, declined: dict,
                  plan: Callable[[relax.Expr, dict], object]) -> tvm.IRModule:
    """``mod`` with its Relax functions rewritten by ``mutator`` where ``plan(value, bindings)``
    planned a site: the plans go to ``mutator.plans`` (keyed by the bound variable) for its
    ``visit_var_binding_`` to read. ``plan`` returns None for a value that is not a site and
    raises :class:`Declined` for one it cannot rewrite (counted in ``declined`` under ``name``).
    With no site the same ``mod`` comes back, unvisited.

    >>> mod = tvm.IRModule()
    >>> rewrite_sites(None, mod, "none", {}, lambda value, bindings: None) is mod
    True
    """
    functions = {gv: f for gv, f in mod.functions.items() if isinstance(f, relax.Function)}
    bindings = {b.var: b.value for f in functions.values() for block in f.body.blocks for b in block.bindings
                if isinstance(b, relax.VarBinding)}
    plans = {}
    for var, value in bindings.items():
        try:
            found = plan(value, bindings)
        except Declined as why:
            _count(declined, name, why)
            continue
        if found is not None:
            plans[var] = found
    if not plans:
        return mod
    mutator.plans.update(plans)
    for gv, func in functions.items():
        mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


class Match:
    """A match: the matched expression and the bound sub-expressions by pattern."""

    def __init__(self, orig: relax.Expr, matches) -> None:
        self.orig = orig
        self._matches = matches

    def __getitem__(self, pattern: DFPattern) -> relax.Expr:
        return self._matches[pattern]

    def get(self, pattern: DFPattern | None):
        return None if pattern is None else self._matches.get(pattern)


# ----------------------------------------------------------------------------------------
# pattern building blocks
# ----------------------------------------------------------------------------------------
class Dequantized:
    """``dequantize(x, scale, zero_point)``; ``const=True`` requires ``x`` to be a constant."""

    def __init__(self, const: bool = False) -> None:
        self.x = is_const() if const else wildcard()
        self.scale, self.zero_point = is_const(), is_const()
        self.pattern = is_op("relax.dequantize")(self.x, self.scale, self.zero_point)

    def scales(self, m: Match) -> np.ndarray:
        """A weight's or bias's scale as float64 (0-d or 1-d); ``x`` must be int8/int32 (the
        caller takes the zero point)."""
        dtype = _dtype(m[self.x])
        if dtype not in ("int8", "int32"):
            raise Declined(f"a dequantize of {dtype} (the integer form is for int8 tensors)")
        return _values(m[self.scale]).astype(np.float64)

    def activation(self, m: Match) -> tuple[float, int]:
        """The per-tensor scale and zero point of an int8 activation (a uint8 one has been
        shifted to int8 by :func:`_uint8_rule`)."""
        if _dtype(m[self.x]) != "int8":
            raise Declined(f"an activation of {_dtype(m[self.x])} (the integer form is for int8)")
        scale = _scalar(_values(m[self.scale]).astype(np.float64), "an activation's scale")
        return scale, _zero_point(m[self.zero_point])

    def axis(self, m: Match) -> int:
        return int(m[self.pattern].attrs.axis)


class Quantized:
    """``quantize(body, scale, zero_point)`` to int8, per tensor."""

    def __init__(self, body: DFPattern) -> None:
        self.scale, self.zero_point = is_const(), is_const()
        self.pattern = is_op("relax.quantize")(body, self.scale, self.zero_point)

    def activation(self, m: Match) -> tuple[float, int]:
        """The per-tensor scale and zero point of the int8 result."""
        call = m[self.pattern]
        if str(call.attrs.out_dtype) != "int8":
            raise Declined(f"a quantize to {call.attrs.out_dtype} (the integer form is for int8)")
        scale = _scalar(_values(m[self.scale]).astype(np.float64), "an activation's scale")
        return scale, _zero_point(m[self.zero_point])


class Activation:
    """An optional ReLU or Clip around ``body``: the output bounds it imposes."""

    def __init__(self, body: DFPattern) -> None:
        self.relu = is_op("relax.nn.relu")(body)
        self.clip_lo, self.clip_hi = wildcard(), wildcard()
        self.clip = is_op("relax.clip")(body, self.clip_lo, self.clip_hi)
        self.pattern = self.relu | self.clip | body

    def bounds(self, m: Match, scale: float, zero_point: int) -> tuple[int, int]:
        """``[lo, hi]`` in output steps: ``q(relu(v)) == clip(q(v), z, 127)`` and
        ``q(clip(v, a, b)) == clip(q(v), q(a), q(b))`` since rounding is monotone."""
        if m.get(self.relu) is not None:
            return _clip_int8(zero_point), INT8_MAX
        if m.get(self.clip) is not None:
            lo, hi = prim_number(m[self.clip_lo]), prim_number(m[self.clip_hi])
            return (_clip_int8(np.round(np.float32(lo) / np.float32(scale)) + zero_point),
                    _clip_int8(np.round(np.float32(hi) / np.float32(scale)) + zero_point))
        return INT8_MIN, INT8_MAX

    def apply(self, m: Match, v: np.ndarray) -> np.ndarray:
        """The ReLU or Clip on float32 values ``v``, as onnxruntime computes it."""
        if m.get(self.relu) is not None:
            return np.maximum(v, np.float32(0))
        if m.get(self.clip) is not None:
            lo, hi = np.float32(prim_number(m[self.clip_lo])), np.float32(prim_number(m[self.clip_hi]))
            return np.minimum(np.maximum(v, lo), hi)
        return v


def _commutative(op: str, a: DFPattern, b: DFPattern) -> DFPattern:
    return is_op(op)(a, b) | is_op(op)(b, a)


# ----------------------------------------------------------------------------------------
# value helpers
# ----------------------------------------------------------------------------------------
def _dtype(e: relax.Expr) -> str:
    return str(e.ty.dtype)


def dims_of(e: relax.Expr) -> tuple:
    """The tensor's dimensions: an ``int`` where static, the ``PrimExpr`` where symbolic (a
    batch ``N``). The integer arithmetic depends on the weights and on the dimensions an
    operator reduces or counts, never on the others: each rule asks :func:`_static` for those.

    >>> dims_of(relax.Var("x", relax.TensorType((tirx.Var("n", "int64"), 3), "int8")))
    (n, 3)
    """
    shape = getattr(e.ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None:
        raise Declined("a tensor of unknown rank" if shape is None else f"a tensor whose shape {shape} is unknown")
    return tuple(int(d) if isinstance(d, tirx.IntImm) else d for d in values)


def _static(dims: tuple, axes, what: str) -> list[int]:
    """``dims`` at ``axes``, which must be static for ``what``'s integer form."""
    dynamic = [str(dims[a]) for a in axes if not isinstance(dims[a], int)]
    if dynamic:
        raise Declined(f"{what} over a dynamic dimension ({', '.join(dynamic)} in {list(map(str, dims))}); "
                       "give the model's inputs static sizes")
    return [dims[a] for a in axes]


def same_dims(a: tuple, b: tuple) -> bool:
    """Whether two :func:`dims_of` tuples are the same dimensions (symbolic ones included).

    >>> same_dims((1, 4), (1, 4)), same_dims((1, 4), (4, 1))
    (True, False)
    """
    return tvm_ffi.structural_equal(list(a), list(b))


def _values(c: relax.Expr) -> np.ndarray:
    return c.value.numpy()


def _scalar(v: np.ndarray, what: str) -> float:
    if v.size != 1:
        raise Declined(f"{what} is per-channel ({v.size} values); activations must be quantised per tensor")
    return float(v.reshape(()))


def _zero(zp: relax.Expr, what: str) -> None:
    if np.any(_values(zp) != 0):
        raise Declined(f"{what} with a non-zero zero point")


def _weight_zero_point(zp: relax.Expr) -> int:
    """A weight's zero point: one integer (per tensor, or the same for every channel)."""
    values = _values(zp).astype(np.int64).reshape(-1)
    if np.any(values != values[0]):
        raise Declined("a weight with zero points that differ by channel (the integer form takes one)")
    return int(values[0])


def _zero_point(zp: relax.Expr) -> int:
    """An activation's zero point: one integer."""
    return int(round(_scalar(_values(zp), "an activation's zero point")))


def prim_number(e: relax.Expr) -> float:
    """The number in a constant scalar argument (an ``IntImm``/``FloatImm``, or a
    ``PrimValue`` holding one); a ``Declined`` otherwise.

    >>> prim_number(tirx.FloatImm("float32", 6.0))
    6.0
    """
    value = getattr(e, "value", None)
    value = getattr(value, "value", value)
    if not isinstance(value, (int, float)):
        raise Declined(f"a clip bound that is not a constant: {e}")
    return float(value)


def _clip_int8(v) -> int:
    return int(np.clip(v, INT8_MIN, INT8_MAX))


def _const(v, dtype: str) -> relax.Expr:
    return relax.const(np.asarray(v).astype(dtype), dtype)


def _constant(v) -> relax.Expr:
    """An int32 constant of a requantise: ``v``, or 0-d where all its values are one
    (:func:`emit_requantize`)."""
    v = np.asarray(v)
    return _const(v.flat[0] if v.size and np.all(v == v.flat[0]) else v, "int32")


def _along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """``v`` (0-d or one value per channel) shaped to broadcast along ``axis`` of an ndim tensor."""
    v = np.asarray(v)
    if v.ndim == 0 or v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis] = v.size
    return v.reshape(shape)


# ----------------------------------------------------------------------------------------
# the requantise
# ----------------------------------------------------------------------------------------
def emit_requantize(accs: list[relax.Expr], rq: Requantize) -> relax.Expr:
    """The int8 Relax expression of ``rq`` applied to the int32 accumulators ``accs``.

    Constants keep the shapes of ``rq``'s arrays (0-d: an immediate after legalisation;
    ``[1, C, 1, 1]`` or ``[C]``: a per-channel vector), but for a vector of one value
    (per-channel scales give the additive constants their shape, all equal when no input has
    a zero point): 0-d, the same sums, which a device applies as an immediate instead of
    staging and reading a vector.
    """
    accs = list(accs)
    if rq.clamp is not None:
        accs[0] = relax.op.minimum(relax.op.maximum(accs[0], _constant(-rq.clamp)), _constant(rq.clamp))
    if rq.split:
        return _emit_split(accs, rq)
    terms = [acc if m.ndim == 0 and m == 1 else relax.op.multiply(acc, _constant(m))
             for acc, m in zip(accs, rq.multipliers)]
    v = terms[0]
    for t in terms[1:]:
        v = relax.op.add(v, t)
    offset = np.asarray(rq.offset)
    if rq.shift and rq.half_even:
        if np.any(offset != 0):          # before the parity, which reads the true value
            v = relax.op.add(v, _constant(offset))
        floor = relax.op.right_shift(v, _const(rq.shift, "int32"))
        half = relax.op.right_shift(v, _const(rq.shift + 1, "int32"))
        parity = relax.op.add(floor, relax.op.multiply(half, _const(-2, "int32")))
        v = relax.op.add(relax.op.add(v, parity), _const(rq.constant, "int32"))
        v = relax.op.right_shift(v, _const(rq.shift, "int32"))
    elif rq.shift:
        v = relax.op.right_shift(relax.op.add(v, _constant(offset + rq.constant)), _const(rq.shift, "int32"))
    return relax.op.astype(relax.op.clip(v, rq.lo, rq.hi), "int8")


def _emit_split(accs: list[relax.Expr], rq: Requantize) -> relax.Expr:
    """The precise form of :mod:`.fixed_point` (``rq.split > 0``) on the (clamped) accumulators:
    ``((sum acc * m_hi + ((sum acc * m_lo + L) >> k) + H) >> (s - k))``, clipped and narrowed.

    A part that is zero for every channel is left out with its product (``x * 0`` is wasted
    work, and a constant that backends decline); :meth:`Requantize.choose` never leaves every
    low part zero, but a high part is zero for a multiplier below ``2**(k - s)``. So is an
    add of a constant zero (``L`` is, wherever ``k < s``: the rounding ``2**(s-1)`` and the
    zero point's ``z_y * 2**s`` are multiples of ``2**k``): one ALU step less on a device."""
    def plus(v: relax.Expr, constant: np.ndarray) -> relax.Expr:
        return relax.op.add(v, _constant(constant)) if np.any(constant) else v

    def total(products: list) -> relax.Expr | None:
        products = [relax.op.multiply(acc, _constant(part)) for acc, part in products if np.any(part)]
        if not products:
            return None
        v = products[0]
        for p in products[1:]:
            v = relax.op.add(v, p)
        return v

    high, low = rq.split_constants
    lows = total([(acc, lo) for acc, (_, lo) in zip(accs, rq.parts)])
    highs = total([(acc, hi) for acc, (hi, _) in zip(accs, rq.parts)])
    if lows is None:        # t = L >> k = 0 (0 <= L < 2**k)
        v = highs
    else:
        t = relax.op.right_shift(plus(lows, low), _const(rq.split, "int32"))
        v = t if highs is None else relax.op.add(highs, t)
    v = relax.op.right_shift(plus(v, high), _const(rq.shift - rq.split, "int32"))
    return relax.op.astype(relax.op.clip(v, rq.lo, rq.hi), "int8")


def requantize_pattern(acc: DFPattern | None = None) -> DFPattern:
    """The Relax form :func:`emit_requantize` gives for one accumulator: a pattern an int8
    backend can append to its GEMM/conv patterns to take the whole epilogue (the precise
    form's too, which reads the accumulator twice).

    >>> from tvm.relax.dpl import is_op, wildcard
    >>> conv = is_op("relax.nn.conv2d")(wildcard(), wildcard())
    >>> pattern = requantize_pattern(conv | is_op("relax.add")(conv, wildcard()))
    """
    acc = wildcard() if acc is None else acc
    clamped = is_op("relax.minimum")(is_op("relax.maximum")(acc, is_const()), is_const())
    scaled = is_op("relax.multiply")(clamped | acc, is_const()) | clamped | acc
    half_up = is_op("relax.right_shift")(is_op("relax.add")(scaled, is_const()), is_const())
    floor, half = is_op("relax.right_shift")(scaled, is_const()), is_op("relax.right_shift")(scaled, is_const())
    parity = is_op("relax.add")(floor, is_op("relax.multiply")(half, is_const()))
    half_even = is_op("relax.right_shift")(is_op("relax.add")(is_op("relax.add")(scaled, parity), is_const()),
                                           is_const())
    # the precise form: one pattern for the (clamped) accumulator, so both products read the same
    # (an add of a constant zero is left out, and a high part of zero with its product)
    source = clamped | acc
    low_product = is_op("relax.multiply")(source, is_const())
    low = is_op("relax.right_shift")(is_op("relax.add")(low_product, is_const()) | low_product, is_const())
    high = is_op("relax.add")(is_op("relax.multiply")(source, is_const()), low) | low
    split = is_op("relax.right_shift")(is_op("relax.add")(high, is_const()) | high, is_const())
    return is_op("relax.astype")(is_op("relax.clip")(half_up | half_even | split | scaled, wildcard(), wildcard()))


def _requantize_int8(x: relax.Expr, source: tuple[float, int], target: tuple[float, int], lo: int,
                     hi: int, precise: bool) -> relax.Expr:
    """An int8 tensor at ``source`` (scale, zero point) as int8 at ``target``, clipped to [lo, hi]
    (``precise``: :meth:`Requantize.choose`'s)."""
    (in_scale, zx), (out_scale, zy) = source, target
    # a constant (ViT's class token, concatenated with the patches) is requantised here: as a
    # chain of calls it would start with a cast, which partitioning leaves unfolded, and be
    # offloaded, and TVM's FoldConstant would then run the device partition at compile time
    value = x.value.numpy().astype(np.int64) if isinstance(x, tvm.ir.Constant) else None
    if np.float32(in_scale) == np.float32(out_scale):
        if zx != zy:        # the same scale: a shift of the integers by the zero points' difference
            if value is not None:
                return _const(np.clip(value + (zy - zx), lo, hi), "int8")
            moved = relax.op.add(relax.op.astype(x, "int32"), _const(zy - zx, "int32"))
            return relax.op.astype(relax.op.clip(moved, lo, hi), "int8")
        if (lo, hi) == (INT8_MIN, INT8_MAX):
            return x
        return relax.op.clip(x, lo, hi) if value is None else _const(np.clip(value, lo, hi), "int8")
    rq = Requantize.choose([in_scale / out_scale], [INT8_MAGNITUDE], lo, hi, [zx], zy, precise)
    if value is not None:
        return _const(rq.apply([value]), "int8")
    return emit_requantize([relax.op.astype(x, "int32")], rq)


def quantized_table(fn: Callable[[np.ndarray], np.ndarray], source: tuple[float, int],
                    target: tuple[float, int]) -> np.ndarray:
    """The int8 table ``t[x + 128] = q(fn(dq(x)))`` for every int8 ``x``: ``dq`` is float32 ``(x -
    z_x) * s_x`` at ``source = (s_x, z_x)``, ``q`` rounds ``v / s_y`` half to even and adds
    ``z_y`` at ``target``, saturating. ``fn`` takes and gives float32 arrays. A ``Declined`` if
    ``fn`` is NaN at some input.

    >>> quantized_table(lambda v: v * np.float32(2), (0.5, 0), (0.5, 0))[[0, 127, 128, 129, 255]].tolist()
    [-128, -2, 0, 2, 127]
    """
    (sx, zx), (sy, zy) = source, target
    x = np.arange(INT8_MIN, INT8_MAX + 1, dtype=np.int32)
    with np.errstate(all="ignore"):         # a NaN is declined below; an infinity saturates
        v = np.broadcast_to(np.asarray(fn(np.float32(x - zx) * np.float32(sx)), np.float32), x.shape)
        steps = np.rint(v / np.float32(sy)).astype(np.float64) + zy
    if np.any(np.isnan(v)):
        raise Declined(f"the function is NaN at input(s) {x[np.isnan(v)][:4].tolist()}")
    return np.clip(steps, INT8_MIN, INT8_MAX).astype(np.int8)


def emit_table(x: relax.Expr, table: np.ndarray) -> relax.Expr:
    """The int8 ``table[x + 128]`` for an int8 tensor ``x`` (a 256-entry lookup).

    >>> x = relax.Var("x", relax.TensorType((4,), "int8"))
    >>> str(emit_table(x, np.zeros(256, np.int8)).op.name)
    'relax.take'
    """
    index = relax.op.add(relax.op.astype(x, "int32"), _const(128, "int32"))
    # mode "clip": the index is within [0, 255] anyway, and "fast" makes TOPI warn at each legalisation
    return relax.op.take(_const(table, "int8"), index, axis=0, mode="clip")


def _uniform(x: relax.Expr) -> bool:
    """Whether ``x`` is a constant with one value (a scalar, or the same everywhere)."""
    if not isinstance(x, tvm.ir.Constant):
        return False
    v = _values(x)
    return v.size > 0 and bool(np.all(v == v.reshape(-1)[0]))


def _with_constant(m: "Match", a: "Dequantized", b: "Dequantized", call: relax.Call, act: "Activation",
                   q: "Quantized", fn: Callable) -> relax.Expr | None:
    """The table of ``q(act(fn(dq(x), c)))`` when one operand of ``call`` is a dequantized
    constant ``c`` with one value and the other, ``x``, has the result's shape (``fn(v, c)``
    with the operands in the call's order); else None. Exact where the float operator is, as
    onnxruntime computes it, where a fixed-point rescale of the constant would not be."""
    out = dims_of(call)
    for var, const in ((a, b), (b, a)):
        if _uniform(m[const.x]) and not _uniform(m[var.x]) and same_dims(dims_of(m[var.x]), out):
            scale, zero_point = const.activation(m)
            c = (np.float32(int(_values(m[const.x]).reshape(-1)[0]) - zero_point)) * np.float32(scale)
            first = var is a

            def f(v, c=c, first=first):
                return act.apply(m, fn(v, c) if first else fn(c, v))

            return emit_table(m[var.x], quantized_table(f, var.activation(m), q.activation(m)))
    return None


def _choose(reals, bounds, lo, hi, input_zero_points=None, zero_point: int = 0, precise: bool = False) -> Requantize:
    try:
        return Requantize.choose(reals, bounds, lo, hi, input_zero_points, zero_point, precise)
    except ValueError as err:
        raise Declined(str(err)) from None


# ----------------------------------------------------------------------------------------
# conv2d and matmul
# ----------------------------------------------------------------------------------------
class _Gemm:
    """``q(act(op(dq(x), weight) [+ bias]))`` where ``weight`` is a dequantized constant."""

    def __init__(self, op: str, transposed_weight: bool) -> None:
        self.x = Dequantized()
        self.w = Dequantized(const=True)
        weight = self.w.pattern
        self.permute = None
        if transposed_weight:
            self.permute = is_op("relax.permute_dims")(self.w.pattern)
            weight = self.permute | self.w.pattern
        self.op = is_op(op)(self.x.pattern, weight)
        self.b = Dequantized(const=True)
        self.reshape = is_op("relax.reshape")(self.b.pattern, wildcard())
        self.biased = _commutative("relax.add", self.op, self.reshape | self.b.pattern)
        self.act = Activation(self.biased | self.op)
        self.q = Quantized(self.act.pattern)


def _bias(m: Match, g: _Gemm, acc_scale: np.ndarray, channels: int, out_ndim: int, axis: int) -> np.ndarray | None:
    """The int32 bias per output channel at the accumulator's scale, or None."""
    if m.get(g.b.pattern) is None:
        return None
    _zero(m[g.b.zero_point], "a bias")
    b = _values(m[g.b.x]).astype(np.int64).reshape(-1)
    shaped = m[g.reshape] if m.get(g.reshape) is not None else m[g.b.pattern]
    shape = dims_of(shaped)
    expect = [1] * out_ndim
    expect[axis] = channels
    padded = [1] * (out_ndim - len(shape)) + list(shape)
    while len(padded) > out_ndim and padded[0] == 1:    # the float matmul's batch of one, flattened
        padded.pop(0)
    if not same_dims(padded, expect) and b.size != 1:
        raise Declined(f"a bias of shape {list(shape)} that is not one value per output channel")
    sb = g.b.scales(m)
    acc = np.broadcast_to(acc_scale, (channels,)).astype(np.float32)
    b = np.broadcast_to(b, (channels,))
    sb = np.broadcast_to(sb, (channels,)).astype(np.float32)
    if np.array_equal(sb, acc):   # onnxruntime quantises a bias at exactly s_x * s_w
        return b
    rescaled = np.round(b * (sb.astype(np.float64) / acc.astype(np.float64)))
    if np.any(np.abs(rescaled) > INT32_MAX):
        raise Declined("the bias does not fit int32 at the accumulator's scale")
    return rescaled.astype(np.int64)


def _finish_gemm(m: Match, g: _Gemm, acc: relax.Expr, w: np.ndarray, w_scale: np.ndarray,
                 w_channel_axis: int, out_axis: int, window_sums: Callable[[], relax.Expr],
                 precise: bool, out_dims: tuple | None = None, taps: int = 1) -> relax.Expr:
    """Bias, bounds and requantise shared by conv2d and matmul.

    The zero points join the bias: over a window of ``K`` products,
    ``sum (w - z_w)(x - z_x) = sum w x - z_w sum x - z_x sum w + K z_w z_x``, so per output
    channel the bias takes ``- z_x * (sum w - K z_w)`` (``acc`` must read ``z_x`` wherever the
    float model reads 0: a padded convolution pads its input with ``z_x``, see
    :func:`_conv_rule`). A weight zero point ``z_w`` (onnxruntime's default quantises weights
    it finds in ``Constant`` nodes as uint8 activations) also needs ``sum x`` per window:
    ``window_sums()`` gives it, added as ``- z_w * sum x`` (a reduction ``1 / C_out`` the
    size of the operator's own). ``out_dims``: ``acc``'s dimensions where they are not the
    float operator's (a matmul computed on its input flattened to 2-D). ``taps``: ``acc``'s
    channels per channel of the float operator's bias (a ConvTranspose computed as one
    column per output channel and kernel tap)."""
    (sx, zx), (sy, zy) = g.x.activation(m), g.q.activation(m)
    out_dims = dims_of(m[g.op]) if out_dims is None else out_dims
    zw = _weight_zero_point(m[g.w.zero_point])
    channels = w.shape[w_channel_axis]
    if w_scale.size not in (1, channels):
        raise Declined(f"{w_scale.size} weight scales for {channels} output channels")
    out_ndim = len(out_dims)
    out_axis %= out_ndim
    acc_scale = np.float32(sx) * w_scale.astype(np.float32)       # what onnxruntime computes
    bias = _bias(m, g, acc_scale if acc_scale.size == 1 else acc_scale[::taps], channels // taps, out_ndim, out_axis)
    if bias is not None and taps > 1:
        bias = np.repeat(np.broadcast_to(bias, (channels // taps,)), taps)
    per_channel = np.moveaxis(w.astype(np.int64), w_channel_axis, 0).reshape(channels, -1)
    window = per_channel.shape[1]
    if zx:
        bias = (np.zeros(channels, np.int64) if bias is None else np.broadcast_to(bias, (channels,))) \
            - zx * (per_channel.sum(axis=1) - window * zw)
        if np.all(bias == bias[0]):
            bias = bias[:1]
    bound = INT8_MAGNITUDE * np.abs(per_channel).sum(axis=1)
    term = None if bias is None else _const(_along(bias if bias.size > 1 else bias.reshape(()), out_axis, out_ndim),
                                            "int32")
    if bias is not None:
        bound = bound + np.abs(bias)
    if zw:
        # the weight zero point's term and the bias as one operand of the output's shape: one
        # add on the accumulator, per element (an int8 backend's epilogue takes it)
        bound = bound + abs(zw) * INT8_MAGNITUDE * window
        sums = relax.op.multiply(window_sums(), _const(-zw, "int32"))
        term = sums if term is None else relax.op.add(sums, term)
        term = relax.op.broadcast_to(term, list(out_dims))
    if term is not None:
        acc = relax.op.add(acc, term)
    if np.any(bound > INT32_MAX):
        raise Declined("the int32 accumulator could overflow (the reduction is too long for int8 x int8 -> int32)")
    lo, hi = g.act.bounds(m, sy, zy)
    # the real multiplier of the float32 scales (onnxruntime's float32 sum of dequantized
    # products is within float32's error of it), not of their float32 product
    real = np.float64(np.float32(sx)) * w_scale.astype(np.float32).astype(np.float64) / np.float64(np.float32(sy))
    if real.size == 1:
        rq = _choose([real.reshape(())], [bound.max()], lo, hi, zero_point=zy, precise=precise)
    else:
        rq = _choose([_along(real, out_axis, out_ndim)], [_along(bound, out_axis, out_ndim)], lo, hi, zero_point=zy,
                     precise=precise)
    return emit_requantize([acc], rq)


def _per_channel_axis(m: Match, d: Dequantized, want: int, ndim: int, what: str) -> np.ndarray:
    scales = d.scales(m)
    if scales.size > 1 and d.axis(m) % ndim != want % ndim:
        raise Declined(f"the {what}'s scales vary along axis {d.axis(m)}, not along its output channels")
    return scales.reshape(-1) if scales.size > 1 else scales.reshape(())


def _conv_rule(precise: bool) -> Rule:
    g = _Gemm("relax.nn.conv2d", transposed_weight=False)

    def build(m: Match) -> relax.Expr:
        call = m[g.op]
        attrs = call.attrs
        w = _values(m[g.w.x])
        if w.dtype != np.int8:
            raise Declined(f"a {w.dtype} weight (the integer form is int8 x int8)")
        kernel_layout, out_layout = str(attrs.kernel_layout), str(attrs.out_layout)
        w_axis, out_axis = kernel_layout.index("O"), out_layout.index("C")
        w_scale = _per_channel_axis(m, g.w, w_axis, w.ndim, "weight")
        x, padding = m[g.x.x], [int(p) for p in attrs.padding]
        _, zx = g.x.activation(m)
        if zx and any(padding):
            # the float model pads with 0.0, i.e. with z_x in the integers: pad so, then the
            # zero point's term is the same at every position and joins the bias
            data_layout = str(attrs.data_layout)
            top, left, bottom, right = padding
            widths = [0] * (2 * len(data_layout))
            widths[2 * data_layout.index("H"):2 * data_layout.index("H") + 2] = [top, bottom]
            widths[2 * data_layout.index("W"):2 * data_layout.index("W") + 2] = [left, right]
            x, padding = relax.op.nn.pad(x, widths, pad_value=float(zx)), [0, 0, 0, 0]
        acc = relax.op.nn.conv2d(x, m[g.w.x], strides=attrs.strides, padding=padding,
                                 dilation=attrs.dilation, groups=attrs.groups, data_layout=attrs.data_layout,
                                 kernel_layout=kernel_layout, out_layout=out_layout, out_dtype="int32")
        def window_sums() -> relax.Expr:
            # sum x over each window of each group: an all-ones convolution with one output
            # channel per group, which broadcasts against the output's channels when there
            # is one group or one output channel per group
            groups, channels = int(attrs.groups), w.shape[w_axis]
            if (str(attrs.data_layout), kernel_layout, out_layout) != ("NCHW", "OIHW", "NCHW") \
                    or groups not in (1, channels):
                raise Declined("a weight zero point on a convolution that is not NCHW/OIHW with one group or "
                               "one output channel per group")
            kh, kw = w.shape[2:]
            if groups == 1 or w.shape[1] != 1 or kh == 1 or kw == 1:
                ones = _const(np.ones((groups, *w.shape[1:])), "int8")
                return relax.op.nn.conv2d(x, ones, strides=attrs.strides, padding=padding, dilation=attrs.dilation,
                                          groups=groups, out_dtype="int32")
            # one channel per group (depthwise): a box sum, separable into a column sum and a
            # row sum (kh + kw additions per output, not kh * kw)
            (sh, sw), (dh, dw) = [int(v) for v in attrs.strides], [int(v) for v in attrs.dilation]
            top, left, bottom, right = padding
            columns = relax.op.nn.conv2d(x, _const(np.ones((groups, 1, kh, 1)), "int8"), strides=[sh, 1],
                                         padding=[top, 0, bottom, 0], dilation=[dh, 1], groups=groups,
                                         out_dtype="int32")
            return relax.op.nn.conv2d(columns, _const(np.ones((groups, 1, 1, kw)), "int32"), strides=[1, sw],
                                      padding=[0, left, 0, right], dilation=[1, dw], groups=groups,
                                      out_dtype="int32")

        return _finish_gemm(m, g, acc, w, w_scale, w_axis, out_axis, window_sums, precise)

    return Rule("conv2d", g.q.pattern, build)


def conv_transpose_declines(call: relax.Call) -> str | None:
    """None when the ``conv2d_transpose`` ``call`` has an integer form (NCHW/IOHW, one group,
    no dilation: any kernel, stride, padding and output padding), else why not.

    >>> x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    >>> w = relax.Var("w", relax.TensorType((4, 2, 3, 3), "float32"))
    >>> conv_transpose_declines(relax.op.nn.conv2d_transpose(x, w, strides=2)) is None
    True
    >>> conv_transpose_declines(relax.op.nn.conv2d_transpose(x, w, strides=2, dilation=2))
    'a dilated ConvTranspose (dilation (2, 2))'
    """
    attrs = call.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if layouts != ("NCHW", "IOHW", "NCHW"):
        return f"a ConvTranspose in layouts {'/'.join(layouts)} (the integer form is NCHW/IOHW)"
    if int(attrs.groups) != 1:
        return f"a grouped ConvTranspose (groups = {int(attrs.groups)})"
    if any(int(d) != 1 for d in attrs.dilation):
        return f"a dilated ConvTranspose (dilation {tuple(int(d) for d in attrs.dilation)})"
    return None


def _phases(kernel: int, stride: int, size: int, pad_before: int, pad_after: int, output_padding: int) -> tuple:
    """One axis of a ConvTranspose as its stride's phases: ``(taps, pad_after_input, crop)``.

    Output pixel ``s*q + r`` of the uncropped transposed convolution is ``sum_t x[q - t] *
    w[r + s*t]`` over ``taps = ceil(k / s)`` taps (a tap past the kernel weighs nothing): a
    convolution with ``taps`` taps over the input padded by ``taps - 1`` before and
    ``pad_after_input`` after (enough rows for the output padding), one output channel per
    output channel and phase ``r``; the phases' pixel shuffle gives ``s`` rows per input row,
    of which the ConvTranspose keeps ``crop = (first, count)``.

    >>> _phases(3, 2, 5, 1, 1, 1)      # k3 s2 p1 op1 on 5 rows: 2 taps, 10 output rows from row 1
    (2, 1, (1, 10))
    >>> _phases(2, 2, 4, 0, 0, 0)      # stride = kernel: one tap, a pixel shuffle and no crop
    (1, 0, (0, 8))
    """
    taps = -(-kernel // stride)
    count = (size - 1) * stride + kernel - pad_before - pad_after + output_padding
    # the convolution gives size + after rows, the shuffle s times as many: as many as the crop reads
    after = max(taps - 1, -(-(pad_before + count) // stride) - size)
    return taps, after, (pad_before, count)


def _conv_transpose_rule(precise: bool) -> Rule:
    """``q(conv2d_transpose(dq(x), dq(w)) [+ bias])``: a convolution over the stride's
    phases, then a pixel shuffle of the int8 result and a crop (:func:`_phases`).

    Each output pixel ``s*q + r`` reads ``ceil(k / s)`` taps of ``x`` (per axis), so the
    ConvTranspose is a convolution to ``C_out * s_h * s_w`` channels ``(co, r_h, r_w)`` with
    ``ceil(k_h / s_h) x ceil(k_w / s_w)`` taps (int8 x int8 -> int32, zero points, bias and
    requantise as for a conv2d; a tap past the kernel weighs ``z_w``, nothing), then a pixel
    shuffle (``reshape``, ``permute_dims``, ``reshape``: channel ``(co, r_h, r_w)`` at pixel
    ``(q_h, q_w)`` to ``(co, s_h*q_h + r_h, s_w*q_w + r_w)``) and the padding's crop
    (``strided_slice``). With stride = kernel and no padding that is a 1x1 convolution and the
    shuffle alone: every product is one of the ConvTranspose's; otherwise the phases' taps past
    the kernel add ``(s * ceil(k / s) / k)**2`` times its MACs at most (1.8x for k = 3, s = 2)."""
    g = _Gemm("relax.nn.conv2d_transpose", transposed_weight=False)

    def build(m: Match) -> relax.Expr:
        call = m[g.op]
        why = conv_transpose_declines(call)
        if why is not None:
            raise Declined(why)
        w = _values(m[g.w.x])
        if w.dtype != np.int8:
            raise Declined(f"a {w.dtype} weight (the integer form is int8 x int8)")
        attrs = call.attrs
        cin, cout, kh, kw = w.shape
        x = m[g.x.x]
        n, _, h, wd = dims_of(x)
        (sh, sw) = (int(s) for s in attrs.strides)
        top, left, bottom, right = (int(p) for p in attrs.padding)
        oph, opw = (int(p) for p in attrs.output_padding)
        th, after_h, (row0, rows) = _phases(kh, sh, h, top, bottom, oph)
        tw, after_w, (col0, cols) = _phases(kw, sw, wd, left, right, opw)
        zw = _weight_zero_point(m[g.w.zero_point])
        # the phase weights [C_out, s_h, s_w, C_in, t_h, t_w], taps flipped (a convolution reads
        # x[q - t] as x_padded[q + (taps - 1 - t)]); a tap past the kernel weighs z_w: nothing
        padded = np.full((cin, cout, th * sh, tw * sw), zw, np.int64)
        padded[:, :, :kh, :kw] = w
        phases = padded.reshape(cin, cout, th, sh, tw, sw)[:, :, ::-1, :, ::-1, :]
        phased = np.ascontiguousarray(phases.transpose(1, 3, 5, 0, 2, 4)).reshape(cout * sh * sw, cin, th, tw)
        phased = phased.astype(np.int8)
        phase_count = sh * sw
        w_scale = _per_channel_axis(m, g.w, 1, w.ndim, "weight")
        _, zx = g.x.activation(m)
        padding = [th - 1, tw - 1, after_h, after_w]
        if zx and any(padding):
            # the float model's missing pixels are 0.0, i.e. z_x in the integers (as _conv_rule pads)
            x, padding = relax.op.nn.pad(x, [0, 0, 0, 0, th - 1, after_h, tw - 1, after_w], pad_value=float(zx)), \
                [0, 0, 0, 0]
        acc = relax.op.nn.conv2d(x, _const(phased, "int8"), padding=padding, out_dtype="int32")
        qh, qw = h + after_h, wd + after_w         # the convolution's output rows and columns

        def window_sums() -> relax.Expr:
            # sum x over each window of taps (the padding, if any, is z_x as above)
            return relax.op.nn.conv2d(x, _const(np.ones((1, cin, th, tw)), "int8"), padding=padding,
                                      out_dtype="int32")

        y = _finish_gemm(m, g, acc, phased, np.repeat(w_scale, phase_count) if w_scale.size > 1 else w_scale, 0, 1,
                         window_sums, precise, out_dims=(n, cout * phase_count, qh, qw), taps=phase_count)
        shuffled = relax.op.permute_dims(relax.op.reshape(y, [n, cout, sh, sw, qh, qw]), [0, 1, 4, 2, 5, 3])
        y = relax.op.reshape(shuffled, [n, cout, qh * sh, qw * sw])
        if (row0, rows, col0, cols) != (0, qh * sh, 0, qw * sw):
            y = relax.op.strided_slice(y, axes=[2, 3], begin=[row0, col0], end=[row0 + rows, col0 + cols])
        return y

    return Rule("conv2d_transpose", g.q.pattern, build)


def _matmul_rule(precise: bool) -> Rule:
    g = _Gemm("relax.matmul", transposed_weight=True)

    def build(m: Match) -> relax.Expr:
        w = _values(m[g.w.x])
        if w.dtype != np.int8 or w.ndim != 2:
            raise Declined(f"a {w.dtype} weight of rank {w.ndim} (the integer form is int8 x int8, 2-D weights)")
        transposed = m.get(g.permute) is not None
        if transposed and [int(a) for a in m[g.permute].attrs.axes] != [1, 0]:
            raise Declined("a weight permutation that is not a transpose")
        # the weight as [N, K]: the GEMM's natural layout (the matmul reads it transposed)
        w_nk = w if transposed else w.T
        w_scale = _per_channel_axis(m, g.w, 0 if transposed else 1, 2, "weight")
        x, dims = m[g.x.x], dims_of(m[g.x.x])
        # a batch of matrices times one weight ([1, L, K] x [K, N], a transformer's linear
        # layers) is one GEMM of the rows: computed on x flattened to 2-D, whose matmul an
        # int8 GEMM takes with its epilogue, and the int8 result shaped back
        flat = len(dims) > 2 and all(isinstance(d, int) for d in dims)
        if flat:
            x = relax.op.reshape(x, [int(np.prod(dims[:-1])), dims[-1]])
        acc = relax.op.matmul(x, relax.op.permute_dims(_const(np.ascontiguousarray(w_nk), "int8")),
                              out_dtype="int32")
        def window_sums() -> relax.Expr:
            return relax.op.sum(relax.op.astype(x, "int32"), axis=[-1], keepdims=True)

        out_dims = (int(np.prod(dims[:-1])), w_nk.shape[0]) if flat else None
        y = _finish_gemm(m, g, acc, w_nk, w_scale, 0, -1, window_sums, precise, out_dims)
        return relax.op.reshape(y, list(dims_of(m[g.q.pattern]))) if flat else y

    return Rule("matmul", g.q.pattern, build)


class _ActivationMatmul:
    """``matmul(dq(a), dq(b))`` of two int8 tensors (attention's ``Q K^T`` and ``softmax V``):
    ``b`` as dequantized, or through the ``permute_dims`` TVM's importer writes for a
    transpose after the dequantize."""

    def __init__(self) -> None:
        self.a, self.b = Dequantized(), Dequantized()
        self.permute = is_op("relax.permute_dims")(self.b.pattern)
        self.op = is_op("relax.matmul")(self.a.pattern, self.permute | self.b.pattern)

    def core(self, m: Match) -> tuple[relax.Expr, int, float]:
        """The int32 ``sum (a - z_a)(b - z_b)``, the bound on its magnitude and the float32
        ``s_a * s_b`` of one unit of it.

        The int8 x int8 product stays a plain matmul (what an int8 GEMM takes) and the zero
        points join as one add on it: ``sum (a - z_a)(b - z_b) = sum a b - z_b sum_k a - z_a
        sum_k b + K z_a z_b``, exact in int32 wherever the result fits (two's-complement
        wrapping of the terms cancels)."""
        (sa, za), (sb, zb) = self.a.activation(m), self.b.activation(m)
        x, b = m[self.a.x], m[self.b.x]
        y, axes = b, None
        if m.get(self.permute) is not None:
            axes = m[self.permute].attrs.axes
            y = relax.op.permute_dims(b, axes)
            rank = len(dims_of(b))
            axes = list(reversed(range(rank))) if axes is None else [int(a) % rank for a in axes]
        dx = dims_of(x)
        if len(dx) < 2 or len(dims_of(m[self.b.x])) < 2:
            raise Declined("a matrix-vector product (the integer form is for matrices)")
        (k,) = _static(dx, [len(dx) - 1], "a matmul")
        acc = relax.op.matmul(x, y, out_dtype="int32")
        terms = []
        if zb:
            rows = relax.op.sum(relax.op.astype(x, "int32"), axis=[-1], keepdims=True)
            terms.append(relax.op.multiply(rows, _const(-zb, "int32")))
        if za:
            # summed in b's own layout (the axis the permutation makes K), then permuted: the
            # GEMM's permute_dims must have the matmul as its only reader for an int8
            # backend to take it with the matmul
            columns = relax.op.sum(relax.op.astype(b, "int32"), axis=[axes[-2] if axes else -2], keepdims=True)
            if axes:
                columns = relax.op.permute_dims(columns, axes)
            terms.append(relax.op.multiply(columns, _const(-za, "int32")))
        if za and zb:
            terms.append(_const(k * za * zb, "int32"))
        if terms:
            term = terms[0]
            for t in terms[1:]:
                term = relax.op.add(term, t)
            # one operand of the output's shape: a single add on the accumulator, per element
            acc = relax.op.add(acc, relax.op.broadcast_to(term, list(dims_of(m[self.op]))))
        bound = k * (INT8_MAGNITUDE + abs(za)) * (INT8_MAGNITUDE + abs(zb))
        if bound > INT32_MAX:
            raise Declined(f"the int32 accumulator could overflow (a reduction of {k} products of int8 tensors)")
        return acc, bound, float(np.float32(sa) * np.float32(sb))


def _activation_matmul_rule(precise: bool) -> Rule:
    """``q(act(matmul(dq(a), dq(b))))`` of two int8 activations: the int32 core of
    :meth:`_ActivationMatmul.core` requantised by ``s_a s_b / s_y`` (int8 out)."""
    g = _ActivationMatmul()
    act = Activation(g.op)
    q = Quantized(act.pattern)

    def build(m: Match) -> relax.Expr:
        (sa, _), (sb, _), (sy, zy) = g.a.activation(m), g.b.activation(m), q.activation(m)
        acc, bound, _ = g.core(m)
        lo, hi = act.bounds(m, sy, zy)
        # the real multiplier of the float32 scales, as :func:`_finish_gemm` takes it
        real = np.float64(np.float32(sa)) * np.float64(np.float32(sb)) / np.float64(np.float32(sy))
        return emit_requantize([acc], _choose([real], [bound], lo, hi, zero_point=zy, precise=precise))

    return Rule("matmul of activations", q.pattern, build)


def dequantized_matmul_rule() -> Rule:
    """``matmul(dq(a), dq(b))`` of two int8 tensors whose result feeds float code (a softmax):
    the int32 core times float32 ``s_a s_b``, the dequantize of the integer result. It is the
    float matmul up to float32 rounding (the float one rounds each product and partial sum;
    this one rounds once), and the multiply-accumulates are integer. Not in :func:`all_rules`:
    :func:`~tirpat.model.integerize.integerize` runs it after them, on what they left.

    >>> dequantized_matmul_rule().name
    'matmul of activations to float'
    """
    g = _ActivationMatmul()

    def build(m: Match) -> relax.Expr:
        dtype = _dtype(m[g.op])
        if dtype != "float32":
            raise Declined(f"a matmul to {dtype} (the dequantized integer form gives float32)")
        acc, _, unit = g.core(m)
        return relax.op.multiply(relax.op.astype(acc, "float32"), _const(unit, "float32"))

    return Rule("matmul of activations to float", g.op, build)


# ----------------------------------------------------------------------------------------
# elementwise: add, ReLU/Clip, rescale
# ----------------------------------------------------------------------------------------
def _add_rule(precise: bool) -> Rule:
    """``q(act(dq(a) + dq(b)))`` or ``-``: both operands rescaled to a common fixed-point scale
    in int32 and summed (a subtrahend negated first: ``-b`` is ``b`` at the negated zero point,
    so every multiplier stays positive), requantised."""
    a, b = Dequantized(), Dequantized()
    add = is_op("relax.add")(a.pattern, b.pattern)
    subtract = is_op("relax.subtract")(a.pattern, b.pattern)
    act = Activation(add | subtract)
    q = Quantized(act.pattern)

    def build(m: Match) -> relax.Expr:
        (sa, za), (sb, zb), (sy, zy) = a.activation(m), b.activation(m), q.activation(m)
        call = m.get(add) if m.get(add) is not None else m[subtract]
        table = _with_constant(m, a, b, call, act, q, np.add if m.get(add) is not None else np.subtract)
        if table is not None:
            return table
        out = dims_of(call)
        if not same_dims(dims_of(m[a.x]), out) and not same_dims(dims_of(m[b.x]), out):
            raise Declined(f"{_op_word(call)} whose operands both broadcast")
        lo, hi = act.bounds(m, sy, zy)
        second = relax.op.astype(m[b.x], "int32")
        if m.get(add) is None:
            second, zb = relax.op.negative(second), -zb
        rq = _choose([sa / sy, sb / sy], [INT8_MAGNITUDE, INT8_MAGNITUDE], lo, hi, [za, zb], zy, precise)
        return emit_requantize([relax.op.astype(m[a.x], "int32"), second], rq)

    return Rule("add", q.pattern, build)


def _op_word(call: relax.Call) -> str:
    return {"relax.add": "an add", "relax.subtract": "a subtract", "relax.multiply": "a multiply"}[str(call.op.name)]


def _multiply_rule(precise: bool) -> Rule:
    """``q(act(dq(a) * dq(b)))`` of two int8 tensors (a squeeze-excitation's scaling, HardSwish's
    ``x * hardsigmoid(x)``, an affine constant): the int32 product ``(a - z_a)(b - z_b)``
    (at most ``(128 + |z_a|)(128 + |z_b|)``, far within int32) requantised by ``s_a s_b / s_y``."""
    a, b = Dequantized(), Dequantized()
    multiply = is_op("relax.multiply")(a.pattern, b.pattern)
    act = Activation(multiply)
    q = Quantized(act.pattern)

    def build(m: Match) -> relax.Expr:
        (sa, za), (sb, zb), (sy, zy) = a.activation(m), b.activation(m), q.activation(m)
        table = _with_constant(m, a, b, m[multiply], act, q, np.multiply)
        if table is not None:
            return table
        out = dims_of(m[multiply])
        if not same_dims(dims_of(m[a.x]), out) and not same_dims(dims_of(m[b.x]), out):
            raise Declined("a multiply whose operands both broadcast")
        lo, hi = act.bounds(m, sy, zy)

        def centred(x: relax.Expr, z: int) -> relax.Expr:
            x = relax.op.astype(x, "int32")
            return relax.op.subtract(x, _const(z, "int32")) if z else x

        product = relax.op.multiply(centred(m[a.x], za), centred(m[b.x], zb))
        bound = (INT8_MAGNITUDE + abs(za)) * (INT8_MAGNITUDE + abs(zb))
        return emit_requantize([product], _choose([sa * sb / sy], [bound], lo, hi, zero_point=zy, precise=precise))

    return Rule("multiply", q.pattern, build)


def _activation_rule(precise: bool) -> Rule:
    x = Dequantized()
    act = Activation(x.pattern)
    q = Quantized(act.relu | act.clip)

    def build(m: Match) -> relax.Expr:
        sx, sy = x.activation(m), q.activation(m)
        lo, hi = act.bounds(m, *sy)
        return _requantize_int8(m[x.x], sx, sy, lo, hi, precise)

    return Rule("relu/clip", q.pattern, build)


def _rescale_rule(precise: bool) -> Rule:
    x = Dequantized()
    q = Quantized(x.pattern)

    def build(m: Match) -> relax.Expr:
        return _requantize_int8(m[x.x], x.activation(m), q.activation(m), INT8_MIN, INT8_MAX, precise)

    return Rule("rescale", q.pattern, build)


def clip_fold_rule() -> Rule:
    """``clip(astype(clip(v, lo, hi), int8), a, b)`` -> ``astype(clip(v, max(lo, a), min(hi, b)))``:
    a ReLU or Clip on a requantised tensor becomes the requantise's bounds."""
    v, lo, hi, a, b = wildcard(), wildcard(), wildcard(), wildcard(), wildcard()
    inner = is_op("relax.clip")(v, lo, hi)
    pattern = is_op("relax.clip")(is_op("relax.astype")(inner), a, b)

    def build(m: Match) -> relax.Expr:
        if _dtype(m.orig) != "int8" or _dtype(m[v]) != "int32":
            raise Declined("not a clip of a requantised int8 tensor")
        new_lo, new_hi = max(prim_number(m[lo]), prim_number(m[a])), min(prim_number(m[hi]), prim_number(m[b]))
        if new_lo > new_hi:
            raise Declined("empty clip range")
        return relax.op.astype(relax.op.clip(m[v], int(new_lo), int(new_hi)), "int8")

    return Rule("fold clip", pattern, build)


# ----------------------------------------------------------------------------------------
# pooling and layout
# ----------------------------------------------------------------------------------------
def _unary_rule(name: str, ops: tuple[str, ...], body: Callable, precise: bool) -> Rule:
    """A rule for ``q(op(dq(x), ...))`` with ``op`` one of ``ops`` and per-tensor scales;
    ``body(call, x, (s_x, z_x), (s_y, z_y), precise)`` builds the integer form from the matched call."""
    x = Dequantized()
    op = None
    for name_ in ops:
        p = is_op(name_)(x.pattern, varg_default_wildcard=True)
        op = p if op is None else op | p
    q = Quantized(op)

    def build(m: Match) -> relax.Expr:
        return body(m[op], m[x.x], x.activation(m), q.activation(m), precise)

    return Rule(name, q.pattern, build)


def _with_input(call: relax.Call, x: relax.Expr) -> relax.Call:
    """``call`` with its first argument replaced by ``x``."""
    return relax.Call(call.op, [x, *call.args[1:]], call.attrs)




def _mean(call, x, sx, sy, precise):
    attrs = call.attrs
    dims = dims_of(x)
    axes = range(len(dims)) if attrs.axis is None else [int(a) % len(dims) for a in attrs.axis]
    count = int(np.prod(_static(dims, axes, "a mean")))
    total = relax.op.sum(relax.op.astype(x, "int32"), axis=attrs.axis, keepdims=bool(attrs.keepdims))
    return _average(total, np.array(count), np.array(count), count, sx, sy, precise)


def _average(total: relax.Expr, counts: np.ndarray, present: np.ndarray, window: int, source: tuple[float, int],
             target: tuple[float, int], precise: bool) -> relax.Expr:
    """int8 ``round((total - z_x * present) * s_x / (s_y * counts)) + z_y`` for int32 window
    sums ``total`` of ``present`` input elements each (padding reads 0; ``counts`` and
    ``present`` broadcast against ``total``): the mean of ``x - z_x``. ``window`` is the
    number of terms each sum adds (the kernel's size): the bound of ``|total|`` everywhere, as
    an interval analysis of the window sum finds it, border windows included.

    When the scale is kept (``sx == sy``, as onnxruntime quantises pools) the mean of
    integers ties often (a sum of 3 over 6 elements): it is computed exactly, rounding half
    to even, as ``q + clip(2r + (q & 1) - count, 0, 1)`` with ``q, r`` the floor quotient and
    remainder (``q & 1`` as ``q - 2 * (q >> 1)``); the fixed-point requantise's inexact
    ``1 / count`` would round every tie the same way. Otherwise a requantise."""
    (sx, zx), (sy, zy) = source, target
    if zx:
        total = relax.op.add(total, _const(-zx * present, "int32"))
    if np.float32(sx) != np.float32(sy):
        real = sx / (sy * counts.astype(np.float64))
        bound = INT8_MAGNITUDE * window + abs(zx) * present
        return emit_requantize([total], _choose([real], [bound], INT8_MIN, INT8_MAX, zero_point=zy, precise=precise))
    count = _const(counts, "int32")
    q = relax.op.floor_divide(total, count)
    r = relax.op.subtract(total, relax.op.multiply(q, count))
    parity = relax.op.subtract(q, relax.op.multiply(relax.op.right_shift(q, _const(1, "int32")), _const(2, "int32")))
    beyond_half = relax.op.subtract(relax.op.add(relax.op.multiply(r, _const(2, "int32")), parity), count)
    rounded = relax.op.add(q, relax.op.clip(beyond_half, 0, 1))
    if zy:
        rounded = relax.op.add(rounded, _const(zy, "int32"))
    # a mean of int8 values is within int8 (q = 127 never rounds up), but no bound on q and
    # on the rounding apart shows it: the clip states it, so the narrowing provably never wraps
    return relax.op.astype(relax.op.clip(rounded, INT8_MIN, INT8_MAX), "int8")


def _window_counts(size, kernel, stride, pad_before, pad_after, include_pad) -> np.ndarray:
    """How many elements each output position of a 1-D pooling window averages."""
    out = (size + pad_before + pad_after - kernel) // stride + 1
    start = np.arange(out) * stride - pad_before
    if include_pad:
        return np.full(out, kernel)
    return np.minimum(start + kernel, size) - np.maximum(start, 0)


def _avg_pool(call, x, sx, sy, precise):
    attrs = call.attrs
    if str(attrs.layout) != "NCHW" or str(attrs.out_layout) != "NCHW":
        raise Declined(f"an average pool in layout {attrs.layout} (the integer form is NCHW)")
    if bool(attrs.ceil_mode) or any(int(d) != 1 for d in attrs.dilation):
        raise Declined("an average pool with ceil_mode or dilation")
    dims = dims_of(x)
    n, c = dims[:2]                   # may be symbolic: they only carry the windows
    h, w = _static(dims, (2, 3), "an average pool")
    (kh, kw), (sh, sw) = [int(k) for k in attrs.pool_size], [int(s) for s in attrs.strides]
    top, left, bottom, right = [int(p) for p in attrs.padding]
    include = bool(attrs.count_include_pad)
    counts = np.outer(_window_counts(h, kh, sh, top, bottom, include),
                      _window_counts(w, kw, sw, left, right, include))
    present = np.outer(_window_counts(h, kh, sh, top, bottom, False), _window_counts(w, kw, sw, left, right, False))
    if (sh, sw) == (kh, kw) and not any((top, left, bottom, right)) and h % kh == 0 and w % kw == 0:
        # disjoint windows tiling the input: sums over the axes of a reshape (adds, no multiplies)
        tiles = relax.op.reshape(relax.op.astype(x, "int32"), [n, c, h // kh, kh, w // kw, kw])
        total = relax.op.sum(tiles, axis=[3, 5])
    else:
        # window sums: a depthwise conv2d with an all-ones kernel (its zero padding adds
        # nothing; the zero point's term counts the elements present)
        (c,) = _static(dims, (1,), "an overlapping average pool (a depthwise convolution)")
        ones = _const(np.ones((c, 1, kh, kw)), "int8")
        total = relax.op.nn.conv2d(x, ones, strides=[sh, sw], padding=[top, left, bottom, right], groups=c,
                                   out_dtype="int32")
    # one count per output position, or one for all
    def positions(v):
        return v.reshape(1, 1, *v.shape) if np.any(v != v.flat[0]) else np.array(v.flat[0])

    return _average(total, positions(counts), positions(present), kh * kw, sx, sy, precise)


#: Operators that commute with quantize and dequantize: maxima and element moves (a resize
#: only when it picks the nearest element: see :func:`moves_elements`).
COMMUTING_OPS = ("relax.nn.max_pool2d", "relax.max", "relax.min", "relax.reshape", "relax.permute_dims",
                  "relax.squeeze", "relax.expand_dims", "relax.flatten", "relax.strided_slice",
                  "relax.image.resize2d")


#: Those of :data:`COMMUTING_OPS` that take maxima or minima: they commute with a function only
#: if it is monotone (non-decreasing).
MAXIMA = ("relax.nn.max_pool2d", "relax.max", "relax.min")


def moves_elements(call: relax.Call) -> None:
    """A ``Declined`` unless ``call`` (one of :data:`COMMUTING_OPS`) gives each output element
    one input element's value (or a maximum or minimum of them): a resize must be
    nearest-neighbour, and not crop (its ``tf_crop_and_resize`` writes ``extrapolation_value``
    outside the input).

    >>> x = relax.Var("x", relax.TensorType((1, 1, 2, 2), "int8"))
    >>> moves_elements(relax.op.image.resize2d(x, (4, 4), method="linear"))
    Traceback (most recent call last):
    ...
    tirpat.model.integerize.rules.Declined: a linear resize (interpolation: only a nearest one moves elements)
    """
    if str(call.op.name) != "relax.image.resize2d":
        return
    method, mode = str(call.attrs.method), str(call.attrs.coordinate_transformation_mode)
    if method != "nearest_neighbor":
        raise Declined(f"a {method} resize (interpolation: only a nearest one moves elements)")
    if mode == "tf_crop_and_resize":
        raise Declined("a resize that crops (it writes its extrapolation value outside the input)")


def _dequantize_later_rule() -> Rule:
    """``op(dq(x), ...)`` -> ``dq(op(x, ...))`` for an operator that commutes with the
    dequantize (a maximum, since a positive scale is monotone; an operator that only moves
    elements): the operator runs on int8, and a chain of them between a dequantize and a
    quantize (a global max pool then a flatten) ends as ``q(dq(...))``, a rescale."""
    x = Dequantized()
    op = None
    for name in COMMUTING_OPS:
        p = is_op(name)(x.pattern, varg_default_wildcard=True)
        op = p if op is None else op | p
    dequantize = x.pattern

    def build(m: Match) -> relax.Expr:
        x.activation(m)            # any zero point: a positive scale keeps the order
        moves_elements(m[op])
        dq = m[dequantize]
        return relax.op.dequantize(_with_input(m[op], m[x.x]), dq.args[1], dq.args[2],
                                   out_dtype=str(dq.attrs.out_dtype))

    return Rule("dequantize later", op, build)


def _split_rule() -> Rule:
    """``split(dq(x))`` -> ``(dq(split(x)[0]), dq(split(x)[1]), ...)``: a split moves elements, so
    each part is the int8 part dequantized (its quantize then meets it as a rescale). The
    tuple's items are resolved by :class:`_Canonicalised`."""
    x = Dequantized()
    split = is_op("relax.split")(x.pattern)

    def build(m: Match) -> relax.Expr:
        x.activation(m)
        call, dq = m[split], m[x.pattern]
        parts = relax.Call(call.op, [m[x.x]], call.attrs)
        count = len(call.ty.fields)
        return relax.Tuple([relax.op.dequantize(relax.TupleGetItem(parts, i), dq.args[1], dq.args[2],
                                                axis=int(dq.attrs.axis), out_dtype=str(dq.attrs.out_dtype))
                            for i in range(count)])

    return _Canonicalised("split", split, build)


class _Canonicalised(Rule):
    """A rule whose result is a tuple: after it, ``CanonicalizeBindings`` resolves each
    ``t[i]`` of that tuple to its item, so that the item's users match the other rules."""

    def rewriter(self, declined: dict) -> Callable[[tvm.IRModule], tvm.IRModule]:
        rewrite = super().rewriter(declined)
        return lambda mod: relax.transform.CanonicalizeBindings()(rewrite(mod))


def _concat_rule(arity: int, precise: bool) -> Rule:
    """``q(concat(dq(x_1), ..., dq(x_n)))``: each input rescaled to the output's scale, then
    concatenated as int8."""
    xs = [Dequantized() for _ in range(arity)]
    concat = is_op("relax.concat")(is_tuple([x.pattern for x in xs]))
    q = Quantized(concat)

    def build(m: Match) -> relax.Expr:
        sy = q.activation(m)
        parts = [_requantize_int8(m[x.x], x.activation(m), sy, INT8_MIN, INT8_MAX, precise) for x in xs]
        return relax.op.concat(parts, axis=m[concat].attrs.axis)

    return Rule("concat", q.pattern, build)


def _uint8_rule() -> Rule:
    """``dq(x_u8, s, z)`` -> ``dq(x_i8, s, z - 128)`` with ``x_i8 = x_u8 - 128``: the same
    real values (``s * (x - z)``), now on int8, the operand type of the integer rules. A
    uint8 ``quantize`` feeding it (the QDQ pair of an activation) becomes an int8 quantize
    with the zero point ``z - 128``: ``clip(round(v / s) + z, 0, 255) - 128`` is
    ``clip(round(v / s) + z - 128, -128, 127)``. A constant is shifted here; any other uint8
    tensor (a uint8 model input) by ``astype`` and ``subtract`` on the host."""
    x = wildcard()
    dequantize = is_op("relax.dequantize")(x, is_const(), is_const())

    def build(m: Match) -> relax.Expr:
        dq = m[dequantize]
        source = m[x]
        if _dtype(source) != "uint8":
            return dq
        zp = _values(dq.args[2]).astype(np.int64)
        if isinstance(source, tvm.ir.Constant):
            shifted = _const(_values(source).astype(np.int64) - 128, "int8")
        elif (isinstance(source, relax.Call) and isinstance(source.op, tvm.ir.Op)
              and str(source.op.name) == "relax.quantize" and isinstance(source.args[2], tvm.ir.Constant)):
            q_zp = _values(source.args[2]).astype(np.int64) - 128
            shifted = relax.op.quantize(source.args[0], source.args[1], _const(q_zp, "int8"),
                                        axis=int(source.attrs.axis), out_dtype="int8")
        else:
            shifted = relax.op.astype(relax.op.subtract(relax.op.astype(source, "int32"), _const(128, "int32")),
                                      "int8")
        return relax.op.dequantize(shifted, dq.args[1], _const(zp - 128, "int8"), axis=int(dq.attrs.axis),
                                   out_dtype=str(dq.attrs.out_dtype))

    return Rule("uint8 to int8", dequantize, build)


def all_rules(precise: bool = False) -> list[Rule]:
    """Every integerising rule, most specific first (the shift of uint8 tensors to int8 before all);
    ``precise``: each requantise in :mod:`.fixed_point`'s precise form where it is more precise.

    >>> [rule.name for rule in all_rules()][:3]
    ['uint8 to int8', 'conv2d', 'conv2d_transpose']
    """
    return [_uint8_rule(), _conv_rule(precise), _conv_transpose_rule(precise), _matmul_rule(precise),
            _activation_matmul_rule(precise),
            _add_rule(precise), _multiply_rule(precise),
            _unary_rule("avg_pool2d", ("relax.nn.avg_pool2d",), _avg_pool, precise),
            _unary_rule("mean", ("relax.mean",), _mean, precise),
            *[_concat_rule(n, precise) for n in range(2, 9)], _split_rule(),
            _dequantize_later_rule(), _activation_rule(precise), _rescale_rule(precise)]
