"""Element-wise operations of int8 tensors on accel: a residual add, a subtract, a
squeeze-excitation multiply, each with its rescales and requantise.

:mod:`tirpat.model.integerize` writes ``q(dq(a) + dq(b))`` of two int8 tensors as int32
arithmetic on the widened operands (``astype(a, int32) * m_a + astype(b, int32) * m_b``, the
subtrahend negated first), and ``q(dq(a) * dq(b))`` as the product of the centred operands
(``(astype(a) - z_a) * (astype(b) - z_b)``), both ending in the requantise of
:func:`~tirpat.model.integerize.rules.emit_requantize` (multiply, add, shift right, clip, cast
to int8), by default in its precise form (each term multiplied by the high and the low part
of a 48-bit multiplier, :mod:`tirpat.model.integerize.fixed_point`). The
``accel.elementwise`` pattern (:func:`patterns`) takes that chain, from the int8
leaves to the int8 result (and integerize's rescale of one int8 tensor to another scale or
zero point); :func:`analyse` reads it back from the partition's legalised TIR
as a DAG of int32 operations, and :func:`lower` writes the instructions:

- each int8 leaf is LOADed into INP and widened into ACC by the GEMM array: a DWMAC with a
  weight row of ones (``acc[p, c] = inp[p, c] * 1`` into an accumulator zeroed by a LOAD of
  padding alone) for a tensor of the
  output's shape, and for an operand broadcast along the trailing dimensions (a
  squeeze-excitation's ``[1, C, 1, 1]`` scale) a GEMM with a weight tile whose first column is
  ones, reading an INP tile whose first column holds one value per row: ``acc[r, n] = s[r]``
  for every lane ``n``, a vector the ALU then broadcasts with source stride 0. The weights are
  LOADs of padding alone (no host data);
- each int32 operation is one ALU instruction, in the program's order (ADD/MUL/SHR/MAX/MIN,
  with an immediate or another ACC vector; a subtraction adds the negated operand, which int32
  wrap-around makes the same), so the device computes what TVM's llvm code computes, bit for
  bit, int32 overflow included (ISA.md, "Integer semantics"); a value read again later is
  first copied (zeroed, then ADD);
- the result is STOREd to int8, saturating (or clipped by MAX/MIN, then wrapped).

The output is laid out as ``R`` rows of ``L`` elements (``R`` the product of the leading
dimensions a broadcast operand varies along, ``L`` of the others; each row padded to whole
``tile``-lane vectors) and processed in blocks of rows that fit ACC and INP.

Fixed-point multipliers need no more than int32: :class:`~tirpat.model.integerize.fixed_point.Requantize`
chooses multipliers and shifts for which every intermediate provably fits int32, and the ALU's
MUL is int32 (wrapping, as llvm's). A constant that does not fit int32 cannot reach the
chain (Relax's int32 constants), so no multiply needs declining for its width.

>>> [name for name, _, _, _ in patterns()][:1]
['accel.elementwise']
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import ir, relax, s_tir, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

import tirpat as tp
from tirpat.model.integerize.rules import requantize_pattern
from tirpat.model.partition import origin_of
from accel.hw.config import Config
from tirpat.device.planner import access_ptr_buffer
from accel.hw.instructions import (ACC, ALU, DWMAC, GEMM, INP, INSTRUCTIONS, LOAD, STORE, WGT, AluOp, Mem,
                                   StoreMode, instruction_of)

__all__ = ["patterns", "check", "widen_per_use", "Node", "Chain", "analyse", "lower", "schedule_partition",
           "describe", "describe_operation", "rule", "broadcast_kind", "PATTERN_NAME", "BUFFER_PREFIX"]

#: The partition pattern's name (``tp.explain`` and the report show it), and the rule's.
PATTERN_NAME = "accel.elementwise"
#: The names of the scratchpad buffers :func:`lower` allocates start with it: :func:`rule` takes their calls.
BUFFER_PREFIX = "elementwise_"
_INT32_MIN, _INT32_MAX = -2**31, 2**31 - 1


# ----------------------------------------------------------------------------------------
# the Relax pattern
# ----------------------------------------------------------------------------------------
def _leaf() -> DFPattern:
    """An int8 tensor widened to int32: the chain's leaves."""
    return is_op("relax.astype")(wildcard().has_dtype("int8")).has_dtype("int32")


def _centred() -> DFPattern:
    leaf = _leaf()
    return is_op("relax.subtract")(leaf, is_const()) | leaf


def _term() -> DFPattern:
    leaf = _leaf()
    signed = is_op("relax.negative")(leaf) | leaf
    return is_op("relax.multiply")(signed, is_const()) | signed


def _accumulator() -> DFPattern:
    """What integerize's add/subtract and multiply rules requantise: a sum of two rescaled
    (maybe negated) leaves, or the product of two centred leaves."""
    return is_op("relax.add")(_term(), _term()) | is_op("relax.multiply")(_centred(), _centred())


def patterns() -> list:
    """``[(name, pattern, annotations, check)]`` of the element-wise core: a requantised
    (:func:`~tirpat.model.integerize.rules.requantize_pattern`) sum or product of int8 tensors,
    then one int8 tensor requantised (a rescale) or moved to another zero point.

    >>> name, pattern, annotations, check_fn = patterns()[0]
    >>> name, type(pattern).__name__
    ('accel.elementwise', 'CallPattern')
    """
    return list(_patterns())


def _clamped(x: DFPattern) -> DFPattern:
    return is_op("relax.minimum")(is_op("relax.maximum")(x, is_const()), is_const()) | x


def _precise(term) -> DFPattern:
    """integerize's precise requantise (:func:`~tirpat.model.integerize.rules.emit_requantize`
    with a split multiplier) of the int32 terms ``term()`` matches: ``(sum_i x_i * m_hi_i +
    ((sum_i x_i * m_lo_i + L) >> k) + H) >> (s - k)``, clipped, cast to int8. Each term is
    multiplied twice; a part that is zero is left out with its product, so a sum may have one
    product (and the high sum none), and so is an add of a zero constant. The terms are
    matched apart (the high and low products of
    one term may read two casts of one int8 tensor, as :func:`widen_per_use` gives them):
    :func:`analyse` reads the TIR back as one DAG whatever the casts."""
    def products() -> DFPattern:
        product = lambda: is_op("relax.multiply")(term(), is_const())    # noqa: E731
        return is_op("relax.add")(product(), product()) | product()

    def plus(x: DFPattern) -> DFPattern:
        return is_op("relax.add")(x, is_const()) | x

    low = is_op("relax.right_shift")(plus(products()), is_const())
    high = plus(is_op("relax.add")(products(), low) | low)
    return is_op("relax.astype")(is_op("relax.clip")(is_op("relax.right_shift")(high, is_const()), wildcard(),
                                                     wildcard()))


@functools.lru_cache(maxsize=None)
def _patterns() -> tuple:
    two, one = _accumulator(), _leaf()
    # one tensor requantised to another scale (integerize's rescale), or moved to another zero
    # point at the same scale (an add of the zero points' difference)
    shifted = is_op("relax.astype")(is_op("relax.clip")(is_op("relax.add")(one, is_const()), wildcard(), wildcard()))
    # the precise requantise of a sum of two (maybe negated) leaves, of a product of two centred
    # ones, of one leaf (a rescale); a single term may be clamped first
    signed = lambda: is_op("relax.negative")(_leaf()) | _leaf()      # noqa: E731
    product = lambda: _clamped(is_op("relax.multiply")(_centred(), _centred()))   # noqa: E731
    precise = tuple((PATTERN_NAME, _precise(term), {}, check)
                    for term in (signed, product, lambda: _clamped(_leaf())))
    # a half-to-even requantise adds the input zero points' offset before its parity
    # (emit_requantize), which requantize_pattern leaves to the producer: taken here
    return precise + (
            (PATTERN_NAME, requantize_pattern(two | is_op("relax.add")(two, is_const())), {"core": two}, check),
            (PATTERN_NAME, requantize_pattern(one | is_op("relax.add")(one, is_const())) | shifted, {"core": one},
             check))


def _dtype(expr) -> str:
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else type(ty).__name__


def _shape(expr) -> list | None:
    ty = expr.ty
    if not (isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)):
        return None
    dims = ty.shape.values
    return [int(d) for d in dims] if all(isinstance(d, tirx.IntImm) for d in dims) else None


def broadcast_kind(shape, out) -> tuple[str, int] | None:
    """How a tensor of ``shape`` broadcasts against the result's ``out`` (right-aligned, as
    Relax broadcasts): ``("full", n)`` for the same shape, ``("row", k)`` when it equals
    ``out`` on the first ``k`` dimensions and is 1 on the rest (a per-channel operand of an
    NCHW tensor: k = 2), ``("scalar", 0)`` for one element; else None (the ALU's vectors run
    along the trailing dimensions, and cannot take a tensor broadcast along them but varying
    after them).

    >>> broadcast_kind([1, 8, 1, 1], [1, 8, 5, 5]), broadcast_kind([5, 5], [1, 8, 5, 5])
    (('row', 2), None)
    """
    shape = [1] * (len(out) - len(shape)) + list(shape)
    if len(shape) != len(out):
        return None
    if list(shape) == list(out):
        return "full", len(out)
    if all(d == 1 for d in shape):
        return "scalar", 0
    k = max(i for i, d in enumerate(shape) if d != 1) + 1
    if shape[:k] != list(out[:k]):
        return None
    return "row", k


def _constant(expr) -> np.ndarray | None:
    if isinstance(expr, ir.Constant) and hasattr(expr.value, "numpy"):
        return expr.value.numpy()
    return None


def _check_call(call) -> str | None:
    """Why the ALU cannot run one operation of the chain as llvm runs it, or None."""
    name = call.op.name.removeprefix("relax.")
    for operand in call.args[1:]:
        values = _constant(operand)
        if values is None:
            continue
        if values.size != 1:
            return f"{name} with a constant of {values.size} elements; the element-wise core takes scalar constants"
        value = int(values.reshape(-1)[0])
        if name == "right_shift" and not 0 <= value <= 31:
            return f"right_shift by {value}; an int32 shift is defined for 0 to 31"
        if (name, value) in (("add", _INT32_MIN), ("subtract", _INT32_MIN)):
            return (f"{name}(x, {value}) overflows int32, and TVM's llvm code (no-signed-wrap arithmetic) "
                    "does not wrap it as accel's ALU does")
        if (name, value) in (("multiply", 0), ("minimum", _INT32_MIN), ("maximum", _INT32_MAX)):
            return f"{name}(x, {value}) is a constant whatever x (TVM folds it away)"
    return None


def check(ctx) -> bool | str:
    """True when accel can run the matched element-wise chain; else the reason it cannot
    (the build report gives it for the operators left on the host; ``tp.build`` warns with it)."""
    root = ctx.matched_expr
    out = _shape(root)
    if out is None:
        return "dynamic shapes; accel needs static shapes"
    kinds = set()
    for value in ctx.matched_bindings.values():
        if not isinstance(value, relax.Call):
            continue
        if value.op.name == "relax.astype" and _dtype(value.args[0]) == "int8" and _dtype(value) == "int32":
            shape = _shape(value.args[0])
            kind = broadcast_kind(shape, out) if shape is not None else None
            if kind is None:
                return (f"an int8 operand of shape {shape} broadcast against {out} along a dimension before one it "
                        "varies along; the ALU broadcasts one value per row of the trailing dimensions")
            if kind[0] == "row":
                kinds.add(kind[1])
            continue
        why = _check_call(value)
        if why is not None:
            return why
    if len(kinds) > 1:
        return f"operands broadcast along different trailing dimensions ({sorted(kinds)}); accel takes one row layout"
    if has_leaking_intermediate_variables(ctx):
        return False
    return True


#: The element-wise operations whose widened int8 operands :func:`widen_per_use` gives their own cast.
_WIDENED_FOR = ("relax.add", "relax.subtract", "relax.multiply", "relax.negative")


def widen_per_use() -> tvm.transform.Pass:
    """A Relax pass: an ``astype(x, int32)`` of an int8 ``x`` read by an element-wise add,
    subtract, multiply or negative and by something else too becomes a cast of its own for
    each of those operations, so that an element-wise partition can take the cast with its
    chain (a squeeze-excitation's input is widened once by integerize for both the average
    pool's sum and the scaling multiply: shared, the cast would leak out of the partition).
    Nothing else changes; a cast left unread is removed.

    >>> widen_per_use().info.name
    'accel.WidenPerUse'
    """
    @tvm.transform.module_pass(opt_level=0, name="accel.WidenPerUse")
    def run(mod, ctx):
        functions = {gv: f for gv, f in mod.functions.items() if isinstance(f, relax.Function)}
        uses: dict = {}
        widened: dict = {}
        for f in functions.values():
            for block in f.body.blocks:
                for b in block.bindings:
                    value = b.value
                    if isinstance(value, relax.Call) and isinstance(value.op, ir.Op):
                        if value.op.name == "relax.astype" and _dtype(value) == "int32" and \
                                _dtype(value.args[0]) == "int8":
                            widened[b.var] = value.args[0]
                        for a in value.args:
                            if isinstance(a, relax.Var):
                                uses[a] = uses.get(a, 0) + 1
                    elif isinstance(value, relax.Var):
                        uses[value] = uses.get(value, 0) + 1
            if isinstance(f.body.body, relax.Var):
                uses[f.body.body] = uses.get(f.body.body, 0) + 1
        shared = {v: x for v, x in widened.items() if uses.get(v, 0) > 1}
        if not shared:
            return mod
        rewriter = _WidenPerUse(mod, shared)
        for gv, f in functions.items():
            rewriter.builder_.update_func(gv, rewriter.visit_expr(f))
        return relax.transform.DeadCodeElimination()(rewriter.builder_.get())

    return run


@mutator
class _WidenPerUse(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, shared: dict) -> None:
        super().__init__(mod)
        self.shared = shared

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if not (isinstance(value, relax.Call) and isinstance(value.op, ir.Op) and value.op.name in _WIDENED_FOR
                and any(isinstance(a, relax.Var) and a in self.shared for a in value.args)):
            super().visit_var_binding_(binding)
            return
        args = [self.builder_.emit(relax.op.astype(self.visit_expr(self.shared[a]), "int32"))
                if isinstance(a, relax.Var) and a in self.shared else self.visit_expr(a) for a in value.args]
        new = relax.Call(value.op, args, value.attrs)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(new)))


# ----------------------------------------------------------------------------------------
# the chain in TIR
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Node:
    """One int32 value of the chain: a widened int8 ``leaf`` (a parameter buffer), or ``op``
    (an :class:`AluOp`) of ``a`` and ``b`` (a Node or an int immediate). ``shape`` is the
    value's shape, right-aligned against the output's (leading 1s added).

    >>> Node(shape=(1, 4)).is_leaf
    True
    """

    shape: tuple
    leaf: object = None
    op: AluOp | None = None
    a: "Node | None" = None
    b: "Node | int | None" = None

    @property
    def is_leaf(self) -> bool:
        return self.op is None


@dataclass
class Chain:
    """The element-wise chain of one partition: its ``root`` (the int32 value stored),
    whether the STORE saturates it to int8 (a clip to [-128, 127]) or it is within int8
    already (clipped by the chain), the output buffer and shape, and the leaves' buffers."""

    root: Node
    saturate: bool
    out: object
    shape: tuple
    leaves: list = field(default_factory=list)

    def nodes(self) -> list:
        """Every node, each once, operands before their users.

        >>> x = Node(shape=(4,), leaf="x")
        >>> [n.op for n in Chain(Node(shape=(4,), op=AluOp.MUL, a=x, b=x), True, None, (4,)).nodes()]
        [None, <AluOp.MUL: 4>]
        """
        seen, order = set(), []

        def visit(n):
            if id(n) in seen:
                return
            seen.add(id(n))
            if not n.is_leaf:
                visit(n.a)
                if isinstance(n.b, Node):
                    visit(n.b)
            order.append(n)

        visit(self.root)
        return order


def _int(e) -> int | None:
    return int(e.value) if isinstance(e, tirx.IntImm) else None


def _wrap32(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def _broadcast(a: tuple, b: tuple) -> tuple:
    return tuple(max(x, y) for x, y in zip(a, b))


class _Unsupported(Exception):
    """A chain :func:`analyse` cannot lower; the message says why."""


class _Reader:
    """Reads the legalised blocks of a chain into :class:`Node` s."""

    def __init__(self, func: tirx.PrimFunc, ndim: int) -> None:
        self.params = {p.__chandle__(): p for p in func.params if tirx.is_buffer_var(p)}
        self.ndim = ndim
        self.values: dict = {}      # intermediate buffer -> Node
        self.leaves: dict = {}

    def padded(self, buffer) -> tuple:
        shape = tuple(int(d) for d in buffer.shape)
        return (1,) * (self.ndim - len(shape)) + shape

    def load(self, load, iters) -> tuple:
        """The loaded buffer's padded shape, after checking its indices broadcast as Relax's do."""
        buf = load.source
        shape = self.padded(buf)
        n = len(iters)
        for j, (idx, d) in enumerate(zip(load.indices, buf.shape)):
            at = n - len(buf.shape) + j
            if _int(idx) == 0 and int(d) == 1:
                continue
            if not (at >= 0 and isinstance(idx, tirx.Var) and idx.same_as(iters[at])):
                raise _Unsupported(f"{buf.name} is read at {list(load.indices)}, not element-wise")
        return shape

    def value(self, e, iters) -> Node | int:
        if isinstance(e, tirx.IntImm):
            return int(e.value)
        if isinstance(e, tirx.Cast):
            inner = e.value
            if str(e.ty.dtype) != "int32":
                raise _Unsupported(f"a cast to {e.ty.dtype} inside the chain")
            if isinstance(inner, ir.TensorLoad) and str(inner.source.dtype) == "int8":
                return self.leaf(inner, iters)
            if str(inner.ty.dtype) == "int32":
                return self.value(inner, iters)
            raise _Unsupported(f"a cast from {inner.ty.dtype} to int32")
        if isinstance(e, ir.TensorLoad):
            node = self.values.get(e.source.__chandle__())
            if node is None or str(e.source.dtype) != "int32":
                raise _Unsupported(f"{e.source.name} ({e.source.dtype}) is not an int32 value of the chain")
            self.load(e, iters)
            return node
        if str(e.ty.dtype) != "int32":
            raise _Unsupported(f"{type(e).__name__} on {e.ty.dtype}: the ALU computes int32")
        if isinstance(e, tirx.Sub):
            a, b = self.value(e.a, iters), self.value(e.b, iters)
            if isinstance(b, int):
                return self.op(AluOp.ADD, a, _wrap32(-b))
            negated = self.op(AluOp.MUL, b, -1)     # -b wraps as b * -1 does: the same int32
            if isinstance(a, int):
                return negated if a == 0 else self.op(AluOp.ADD, negated, a)
            return self.op(AluOp.ADD, a, negated)
        ops = {tirx.Add: AluOp.ADD, tirx.Mul: AluOp.MUL, tirx.Max: AluOp.MAX, tirx.Min: AluOp.MIN,
               tirx.RShift: AluOp.SHR}
        op = ops.get(type(e))
        if op is None:
            raise _Unsupported(f"{type(e).__name__}: not an ALU operation (add, multiply, max, min, shift right)")
        a, b = self.value(e.a, iters), self.value(e.b, iters)
        if op is AluOp.SHR and not (isinstance(b, int) and 0 <= b <= 31):
            raise _Unsupported(f"a right shift by {b}: the ALU shifts by a constant from 0 to 31")
        return self.op(op, a, b)

    def leaf(self, load, iters) -> Node:
        buf = load.source
        if buf.__chandle__() not in self.params:
            raise _Unsupported(f"the int8 tensor {buf.name} is not an input of the partition")
        shape = self.load(load, iters)
        key = buf.__chandle__()
        if key not in self.leaves:
            self.leaves[key] = Node(shape=shape, leaf=buf)
        return self.leaves[key]

    def op(self, op: AluOp, a, b) -> Node:
        if isinstance(a, int) and isinstance(b, int):
            raise _Unsupported("an operation of two constants")
        if isinstance(a, int):
            if op is AluOp.SHR:
                raise _Unsupported("a constant shifted by a tensor")
            a, b = b, a         # add, mul, max, min commute
        if isinstance(b, int) and not _INT32_MIN <= b <= _INT32_MAX:
            raise _Unsupported(f"the constant {b} does not fit int32")
        if isinstance(b, int) and ((op is AluOp.ADD and b == _INT32_MIN) or (op is AluOp.MUL and b == 0)
                                   or (op is AluOp.MIN and b == _INT32_MIN) or (op is AluOp.MAX and b == _INT32_MAX)):
            raise _Unsupported(f"{op.name} with {b}, which llvm's code does not compute as a wrapping ALU step")
        shape = a.shape if isinstance(b, int) else _broadcast(a.shape, b.shape)
        return Node(shape=shape, op=op, a=a, b=b)


def _clip_bounds(node: Node) -> tuple | None:
    """``(x, lo, hi)`` when ``node`` is ``max(min(x, hi), lo)`` or ``min(max(x, lo), hi)``
    with constant bounds, else None."""
    if node.is_leaf or not isinstance(node.b, int) or node.a.is_leaf or not isinstance(node.a.b, int):
        return None
    pair = {node.op, node.a.op}
    if pair != {AluOp.MAX, AluOp.MIN}:
        return None
    lo, hi = (node.b, node.a.b) if node.op is AluOp.MAX else (node.a.b, node.b)
    return node.a.a, lo, hi


def analyse(func: tirx.PrimFunc) -> tuple[Chain | None, str | None]:
    """``(Chain, None)`` when ``func``'s blocks are an element-wise int32 chain on widened
    int8 inputs ending in a clip and a cast to int8 (what :func:`patterns` partitions), else
    ``(None, why not)``.

    >>> analyse(fused_add)[0].root.op                  # doctest: +SKIP
    <AluOp.SHR: 3>
    """
    try:
        return _analyse(func), None
    except _Unsupported as why:
        return None, str(why)


def _analyse(func: tirx.PrimFunc) -> Chain:
    sch = s_tir.Schedule(ir.IRModule({"main": func}))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    if not blocks:
        raise _Unsupported("no computation")
    out = blocks[-1].body.buffer if isinstance(blocks[-1].body, tirx.BufferStore) else None
    if out is None:
        raise _Unsupported("the last block does not store one value")
    reader = _Reader(func, len(out.shape))
    final = None
    for n, block in enumerate(blocks):
        store = block.body
        if not isinstance(store, tirx.BufferStore) or any(int(iv.iter_type) != 0 for iv in block.iter_vars):
            raise _Unsupported(f"block {block.name_hint} is not element-wise")
        iters = [iv.var for iv in block.iter_vars]
        if len(store.indices) != len(iters) or not all(i.same_as(v) for i, v in zip(store.indices, iters)):
            raise _Unsupported(f"block {block.name_hint} writes {store.buffer.name} at {list(store.indices)}")
        if n < len(blocks) - 1:
            node = reader.value(store.value, iters)
            if isinstance(node, int):
                raise _Unsupported(f"block {block.name_hint} stores a constant")
            if node.shape != reader.padded(store.buffer):
                raise _Unsupported(f"block {block.name_hint} broadcasts its result")
            reader.values[store.buffer.__chandle__()] = node
            continue
        if str(store.buffer.dtype) != "int8" or not isinstance(store.value, tirx.Cast):
            raise _Unsupported("the chain does not end in a cast to int8")
        root = reader.value(store.value.value, iters)
        clipped = None if isinstance(root, int) else _clip_bounds(root)
        if clipped is None or not -128 <= clipped[1] <= clipped[2] <= 127:
            raise _Unsupported("the chain does not clip its result to int8 before the cast to int8")
        # a clip to all of int8 is the saturating STORE; a narrower one runs on the ALU (MIN, MAX)
        # and leaves values the wrapping STORE keeps as they are
        saturate = clipped[1:] == (-128, 127)
        final = Chain(clipped[0] if saturate else root, saturate, store.buffer,
                      tuple(int(d) for d in store.buffer.shape), [n_.leaf for n_ in reader.leaves.values()])
    if final.root.shape != reader.padded(final.out):
        raise _Unsupported("the result broadcasts the chain's value")
    return final


# ----------------------------------------------------------------------------------------
# the instructions
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """``rows`` x ``length`` elements, rows padded to ``padded`` (whole vectors), ``block``
    rows at a time; ``kinds`` maps each node (by id) to ``full``, ``row`` or ``scalar``."""

    rows: int
    length: int
    padded: int
    block: int
    kinds: dict


def _layout(chain: Chain, config: Config) -> _Layout:
    """The rows the chain's values are laid out in, and how many a block takes: the most that
    fit ACC and INP (counted off the buffers one block allocates, doubled where the block loop
    runs more than once, as the planner doubles them)."""
    t = config.tile
    out = chain.shape
    ks = set()
    for n in chain.nodes():
        kind = broadcast_kind(n.shape, out)
        if kind is None:
            raise _Unsupported(f"a value of shape {list(n.shape)} broadcast against {list(out)} along a leading "
                               "dimension; the ALU broadcasts one value per row of the trailing dimensions")
        if kind[0] == "row":
            ks.add(kind[1])
    if len(ks) > 1:
        raise _Unsupported(f"values broadcast along different trailing dimensions ({sorted(ks)})")
    kinds = {id(n): broadcast_kind(n.shape, out)[0] for n in chain.nodes()}
    capacity = {ACC.scope: config.acc_elements, INP.scope: config.inp_elements}

    def fits(rows: int, length: int, block: int) -> bool:
        layout = _Layout(rows, length, _round(length, t), block, kinds)
        allocs = _Emitter(chain, layout, config, *_weights(t)).block(0, block, "")
        used = dict.fromkeys(capacity, 0)
        for a in allocs:
            if isinstance(a, tirx.AllocBuffer):
                used[a.buffer.scope()] += int(a.buffer.shape[0])
        copies = 2 if block < rows else 1
        return all(used[scope] * copies <= capacity[scope] for scope in capacity)

    def choose(k: int) -> _Layout | None:
        rows, length = int(np.prod(out[:k], dtype=np.int64)), int(np.prod(out[k:], dtype=np.int64))
        block = rows
        while block and not fits(rows, length, block):
            block //= 2
        return _Layout(rows, length, _round(length, t), block, kinds) if block else None

    # a broadcast operand fixes the rows; else the split that pads least, of those whose rows fit
    candidates = [c for c in map(choose, [ks.pop()] if ks else range(len(out) + 1)) if c is not None]
    if not candidates:
        raise _Unsupported(f"a row of the {'x'.join(map(str, out))} result does not fit ACC with the chain's values")
    return min(candidates, key=lambda c: (c.rows * c.padded, -c.block))


def _round(n: int, t: int) -> int:
    return -(-n // t) * t


def _tiles(elements: int, t: int) -> int:
    return -(-elements // (t * t))


class _Emitter:
    """Writes one block of rows: its buffers, LOADs, widening, ALU steps and STORE."""

    def __init__(self, chain: Chain, layout: _Layout, config: Config, ones, column) -> None:
        self.chain, self.layout, self.t = chain, layout, config.tile
        self.ones, self.column = ones, column
        self.uses: dict = {}
        for n in chain.nodes():
            if not n.is_leaf:
                for operand in (n.a, n.b):
                    if isinstance(operand, Node):
                        self.uses[id(operand)] = self.uses.get(id(operand), 0) + 1

    def block(self, row0, rows: int, tag: str) -> list:
        """The allocations and instructions of the block of ``rows`` rows from ``row0``."""
        self.stmts, self.allocs, self.tag, self.count = [], [], tag, 0
        self.row0, self.rows = row0, rows
        self.left = dict(self.uses)
        where: dict = {}
        for n in self.chain.nodes():
            where[id(n)] = self.widen(n) if n.is_leaf else self.compute(n, where)
        self.store(where[id(self.chain.root)])
        return self.allocs + self.stmts

    # regions ------------------------------------------------------------------------
    def acc(self, kind: str):
        t, lay = self.t, self.layout
        self.count += 1
        elements = _tiles(self.rows * lay.padded, t) if kind == "full" else _tiles(_round(self.rows, t) * t, t)
        if kind == "scalar":
            elements = 1
        buf = tirx.decl_buffer((elements * t * t,), "int32", f"{BUFFER_PREFIX}acc{self.count}{self.tag}", scope=ACC.scope)
        self.allocs.append(tirx.AllocBuffer(buf))
        return buf, kind

    def inp(self, tiles: int):
        self.count += 1
        buf = tirx.decl_buffer((tiles * self.t * self.t,), "int8", f"{BUFFER_PREFIX}inp{self.count}{self.tag}",
                               scope=INP.scope)
        self.allocs.append(tirx.AllocBuffer(buf))
        return buf

    def vectors(self, region) -> dict:
        """ALU fields walking ``region``'s vectors: rows of the block (outer), vectors of a row (inner)."""
        kind = region[1]
        t, lay = self.t, self.layout
        if kind == "full":
            return {"ext_out": self.rows, "ext_in": lay.padded // t, "stride_out": lay.padded, "stride_in": t}
        if kind == "row":
            return {"ext_out": self.rows, "ext_in": lay.padded // t, "stride_out": t, "stride_in": 0}
        return {"ext_out": self.rows, "ext_in": lay.padded // t, "stride_out": 0, "stride_in": 0}

    # steps --------------------------------------------------------------------------
    def widen(self, n: Node):
        """LOAD the int8 leaf into INP and widen it into ACC (zeroed, then DWMAC by ones or GEMM
        by the ones column)."""
        t, lay = self.t, self.layout
        kind = self.layout.kinds[id(n)]
        region = self.acc(kind)
        buf = region[0]
        tiles = int(buf.shape[0]) // (t * t)
        staged = self.inp(tiles)
        if kind == "full":
            self.stmts.append(LOAD[Mem.INP].call(
                host=n.leaf, elem_offset=self.row0 * lay.length, sram_addr=staged, sram_ld=lay.padded,
                rows=self.rows, cols=lay.length, dram_ld=lay.length, pad_top=0, pad_bottom=0, pad_left=0,
                pad_right=lay.padded - lay.length, pad_value=0))
        else:
            rows = self.rows if kind == "row" else 1
            self.stmts.append(LOAD[Mem.INP].call(
                host=n.leaf, elem_offset=self.row0 if kind == "row" else 0, sram_addr=staged, sram_ld=t,
                rows=rows, cols=1, dram_ld=1, pad_top=0, pad_bottom=0, pad_left=0, pad_right=t - 1, pad_value=0))
        tile = t * t
        steps = {"ext_out": tiles, "ext_in": 1, "acc_stride_out": tile, "acc_stride_in": 0}
        self.zero(buf)
        if kind == "full":
            self.stmts.append(DWMAC.call(acc_addr=buf, inp_addr=staged, wgt_addr=self.ones,
                                         acc_ld=t, inp_ld=t, inp_stride_out=tile, inp_stride_in=0, wgt_stride_out=0,
                                         wgt_stride_in=0, **steps))
        else:
            self.stmts.append(GEMM.call(acc_addr=buf, inp_addr=staged, wgt_addr=self.column,
                                        acc_ld=t, inp_ld=t, wgt_ld=t, inp_stride_out=tile, inp_stride_in=0,
                                        wgt_stride_out=0, wgt_stride_in=0, **steps))
        return region

    def alu(self, op: AluOp, dst, src=None, imm: int = 0) -> None:
        d = self.vectors(dst)
        s = self.vectors(src) if src is not None else {"stride_out": 0, "stride_in": 0}
        if dst[1] != "full":        # a row or scalar destination: one vector per row (or one in all)
            d = {"ext_out": 1 if dst[1] == "scalar" else self.rows, "ext_in": 1,
                 "stride_out": self.t if dst[1] == "row" else 0, "stride_in": 0}
        self.stmts.append(ALU[op, src is None].call(
            dst_addr=dst[0], src_addr=src[0] if src is not None else 0, imm=imm,
            ext_out=d["ext_out"], ext_in=d["ext_in"], dst_stride_out=d["stride_out"], dst_stride_in=d["stride_in"],
            src_stride_out=s["stride_out"] if src is not None else 0,
            src_stride_in=(s["stride_in"] if dst[1] == "full" else 0) if src is not None else 0))

    def copy(self, region, kind: str):
        """A fresh region of ``kind`` holding ``region``'s values (broadcast if need be)."""
        fresh = self.acc(kind)
        self.zero(fresh[0])
        self.alu(AluOp.ADD, fresh, region)
        return fresh

    def zero(self, buf) -> None:
        """Zero the ACC buffer ``buf`` with a LOAD of padding alone (no DRAM read: its issue
        cycles only, where a GEMM reset takes ``tile`` cycles a tile)."""
        t = self.t
        self.stmts.append(LOAD[Mem.ACC].call(
            host=self.chain.leaves[0], elem_offset=0, sram_addr=buf, sram_ld=t, rows=0, cols=0, dram_ld=0,
            pad_top=int(buf.shape[0]) // t, pad_bottom=0, pad_left=t, pad_right=0, pad_value=0))

    def compute(self, n: Node, where: dict):
        kind = self.layout.kinds[id(n)]
        a = where[id(n.a)]
        b = where[id(n.b)] if isinstance(n.b, Node) else n.b
        self.left[id(n.a)] -= 1
        if isinstance(n.b, Node):
            self.left[id(n.b)] -= 1
        a_free = self.left[id(n.a)] == 0 and a[1] == kind
        b_free = isinstance(n.b, Node) and self.left[id(n.b)] == 0 and b[1] == kind and not n.b is n.a
        if a_free:
            dst, src = a, b
        elif b_free and n.op is not AluOp.SHR:
            dst, src = b, a
        else:
            dst, src = self.copy(a, kind), b
        if isinstance(src, int):
            self.alu(n.op, dst, imm=src)
        else:
            self.alu(n.op, dst, src)
        return dst

    def store(self, region) -> None:
        lay, chain = self.layout, self.chain
        self.stmts.append(STORE[StoreMode.SATURATE if chain.saturate else StoreMode.WRAP].call(
            host=chain.out, elem_offset=self.row0 * lay.length, sram_addr=region[0], sram_ld=lay.padded,
            rows=self.rows, cols=lay.length, dram_ld=lay.length))


def _weights(t: int) -> tuple:
    """The WGT buffers of the widening: a row of ones (DWMAC), a tile whose first column is ones (GEMM)."""
    return (tirx.decl_buffer((t,), "int8", f"{BUFFER_PREFIX}ones", scope=WGT.scope),
            tirx.decl_buffer((t * t,), "int8", f"{BUFFER_PREFIX}column", scope=WGT.scope))


def lower(func: tirx.PrimFunc, chain: Chain, config: Config) -> tirx.PrimFunc:
    """``func`` with its body replaced by accel's instructions for ``chain`` (see the module
    docstring); raises ``ValueError`` naming the problem when its rows do not fit ACC."""
    try:
        layout = _layout(chain, config)
    except _Unsupported as why:
        raise ValueError(str(why)) from None
    t = config.tile
    host = chain.leaves[0]
    ones, column = _weights(t)
    # weights of padding alone: a row of ones (DWMAC), a tile whose first column is ones (GEMM)
    pad = {"elem_offset": 0, "rows": 0, "cols": 0, "dram_ld": 0, "pad_bottom": 0, "pad_right": 0}
    stmts = [tirx.AllocBuffer(ones), tirx.AllocBuffer(column),
             LOAD[Mem.WGT].call(host=host, sram_addr=ones, sram_ld=t, pad_top=1, pad_left=t, pad_value=1,
                                **pad),
             LOAD[Mem.WGT].call(host=host, sram_addr=column, sram_ld=t, pad_top=t, pad_left=t, pad_value=0,
                                **pad),
             LOAD[Mem.WGT].call(host=host, sram_addr=column, sram_ld=t, pad_top=t, pad_left=1, pad_value=1,
                                **pad)]
    emitter = _Emitter(chain, layout, config, ones, column)
    whole, rest = divmod(layout.rows, layout.block)
    if whole:
        v = tirx.Var("elementwise_block", "int32")
        body = emitter.block(v * layout.block, layout.block, "")
        stmts.append(tirx.For(v, tirx.IntImm("int32", 0), tirx.IntImm("int32", whole), tirx.ForKind.SERIAL,
                              tirx.SeqStmt(body) if len(body) > 1 else body[0]))
    if rest:
        stmts.append(tirx.SeqStmt(emitter.block(tirx.IntImm("int32", whole * layout.block), rest, "_rest")))
    # a block in a root block, as TVM's passes after scheduling expect of a PrimFunc's body
    # (Relax's SplitLayoutRewritePreproc, run on a real model's module, wants both)
    chain_block = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "elementwise", tirx.SeqStmt(stmts)))
    return func.with_body(s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", chain_block)))


def describe(chain: Chain, config: Config) -> str:
    """One line for the report: the chain's shape, layout and operations.

    >>> a = Node(shape=(1, 8, 3, 3), leaf=tirx.decl_buffer((1, 8, 3, 3), "int8", "a"))
    >>> root = Node(shape=(1, 8, 3, 3), op=AluOp.SHR, a=Node(shape=(1, 8, 3, 3), op=AluOp.MUL, a=a, b=5), b=3)
    >>> out = tirx.decl_buffer((1, 8, 3, 3), "int8", "out")
    >>> describe(Chain(root, True, out, (1, 8, 3, 3), [a.leaf]), Config())
    'offloaded element-wise chain: 1 int8 operand(s) (full) -> 1x8x3x3 int8 as 1 row(s) of 72, 2 ALU step(s) (MUL, SHR)'
    """
    layout = _layout(chain, config)
    ops = [n.op.name for n in chain.nodes() if not n.is_leaf]
    kinds = sorted({layout.kinds[id(n)] for n in chain.nodes() if n.is_leaf})
    return (f"offloaded element-wise chain: {len(chain.leaves)} int8 operand(s) ({', '.join(kinds)}) -> "
            f"{'x'.join(map(str, chain.shape))} int8 as {layout.rows} row(s) of {layout.length}, "
            f"{len(ops)} ALU step(s) ({', '.join(ops)})")


def describe_operation(chain: Chain) -> list:
    """What the chain computes, in words for the report: ``add``, ``subtract``, ``multiply``
    (of two tensors) or ``rescale`` (of one), then ``requantise`` when it multiplies by a
    constant or shifts.

    >>> a, b = Node(shape=(4,), leaf="a"), Node(shape=(4,), leaf="b")
    >>> total = Node(shape=(4,), op=AluOp.ADD, a=Node(shape=(4,), op=AluOp.MUL, a=a, b=3), b=b)
    >>> describe_operation(Chain(Node(shape=(4,), op=AluOp.SHR, a=total, b=2), True, None, (4,)))
    ['add', 'requantise']
    """
    nodes = [n for n in chain.nodes() if not n.is_leaf]
    negated = {id(n) for n in nodes if n.op is AluOp.MUL and n.b == -1}
    words = []
    for n in nodes:
        if isinstance(n.b, Node) and n.op is AluOp.MUL:
            words.append("multiply")
        elif isinstance(n.b, Node) and n.op is AluOp.ADD:
            words.append("subtract" if {id(n.a), id(n.b)} & negated else "add")
    words = list(dict.fromkeys(words)) or ["rescale"]
    if any(isinstance(n.b, int) and (n.op is AluOp.SHR or (n.op is AluOp.MUL and n.b != -1)) for n in nodes):
        words.append("requantise")
    return words


def schedule_partition(func: tirx.PrimFunc, config: Config) -> tirx.PrimFunc | None:
    """The element-wise partition ``func`` lowered to accel's instructions with its notes for
    the report, or None when ``func`` is no element-wise chain (it has a reduction, or it is a
    hand-written workload the chain's analysis declines); a partition of :func:`patterns`
    accel cannot run is returned as it is, its notes saying why (it runs on the CPU)."""
    sch = s_tir.Schedule(ir.IRModule({"main": func}))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    if not blocks or any(int(iv.iter_type) != 0 for b in blocks for iv in b.iter_vars):
        return None
    chain, why = analyse(func)
    if chain is None and origin_of(func) is None:
        return None     # a hand-written workload, not this pattern's partition: the GEMM scheduler's
    notes = {"host_macs": 0, "device_macs": 0, "host_steps": [], "epilogue": [], "details": []}
    if chain is not None:
        try:
            lowered = lower(func, chain, config)
            notes["details"] = [describe(chain, config)]
            notes["epilogue"] = describe_operation(chain)
            return lowered.with_attr(tp.SCHEDULE_NOTES, json.dumps(notes))
        except ValueError as err:
            why = str(err)
    notes["host_steps"] = [[blocks[-1].name_hint, f"is not offloaded: {why}"]]
    return func.with_attr(tp.SCHEDULE_NOTES, json.dumps(notes))


def _lowered_here(m) -> bool:
    """Whether the matched call is a declared instruction on :func:`lower`'s scratchpad buffers."""
    ins = instruction_of(m.node)
    if ins is None:
        return False
    args = ins.arguments_of(m.node)
    buffers = [access_ptr_buffer(args[op.name]) for op in ins.memory_operands]
    return any(b is not None and b.name.startswith(BUFFER_PREFIX) for b in buffers)


def rule() -> tp.Rewriter:
    """The rule ``accel.elementwise``: the instruction calls :func:`lower` wrote at schedule
    time (on its ``elementwise_*`` scratchpad buffers), taken as they are, so that the build
    report counts the partition as accel's.

    >>> rule().rules[0].name
    'accel.elementwise'
    """
    arities = sorted({len(ins.arguments) + 1 for ins in INSTRUCTIONS.values()})
    pattern = None
    for n in arities:
        p = tp.is_call("tirx.tvm_call_packed", *[tp.wildcard() for _ in range(n)]).where(_lowered_here)
        pattern = p if pattern is None else pattern | p
    return tp.Rewriter.from_pattern(pattern, lambda m: m.node, name=PATTERN_NAME)
