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
  padding alone) for a tensor of the output's shape, or for one row that the ALU repeats for
  every row (source stride 0 between rows: a per-channel ``[C]`` gamma or bias of a
  ``[1, L, C]`` tensor, a bias row); for one value per row (a squeeze-excitation's
  ``[1, C, 1, 1]`` scale) or one in all, a GEMM with a weight tile whose first column is
  ones, reading an INP tile whose first column holds one value per row: ``acc[r, n] = s[r]``
  for every lane ``n``, a vector the ALU then broadcasts along the row (source stride 0
  between vectors). The weights are LOADs of padding alone (no host data);
- each int32 operation is one ALU step, in the program's order (ADD/MUL/SHR/MAX/MIN,
  with an immediate or another ACC vector; a subtraction adds the negated operand, which int32
  wrap-around makes the same; the steps on one block run as ALU chains,
  :mod:`accel.compiler.chains`), so the device computes what TVM's llvm code computes, bit for
  bit, int32 overflow included (ISA.md, "Integer semantics"); a value read again later is
  first copied (zeroed, then ADD);
- the result is STOREd to int8, saturating (or clipped by MAX/MIN, then wrapped).

The output is laid out as ``R`` rows of ``L`` elements (``R`` the product of its leading
dimensions, ``L`` of the others, each row padded to whole ``tile``-lane vectors), split where
every operand is the whole result, one value per row, one row or one value
(:func:`broadcast_kind`; of those splits the one that pads least), and processed in blocks of
rows that fit ACC and INP, a row cut into equal pieces of whole vectors when one does not fit;
what does not vary along the rows (a bias row and its rescale) is computed once per piece,
before the blocks of rows that read it. A table activation after the chain (or of an int8
tensor alone: integerize's ``take(table, x + 128)``) is one LUT over the result, its table
LOADed into WGT once.

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
from accel.compiler.patterns import table
from accel.compiler.prelowered import calls_rule
from accel.hw.config import Config
from accel.hw.instructions import (ACC, ALU, DWMAC, GEMM, INP, LOAD, LUT, LUT_ENTRIES, STORE, WGT, AluOp, Mem,
                                   StoreMode)

__all__ = ["patterns", "check", "widen_per_use", "Node", "Chain", "analyse", "lower", "schedule_partition",
           "describe", "describe_operation", "rule", "broadcast_kind", "row_splits", "KINDS", "PATTERN_NAME",
           "BUFFER_PREFIX"]

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
    precise = tuple((_precise(term), {}) for term in (signed, product, lambda: _clamped(_leaf())))
    # a half-to-even requantise adds the input zero points' offset before its parity
    # (emit_requantize), which requantize_pattern leaves to the producer: taken here (after a
    # one-leaf rescale's multiply: an exact multiplier such as 0.5 or 1.0 with an input zero point)
    chains = ((requantize_pattern(two | is_op("relax.add")(two, is_const())), {"core": two}),
              (requantize_pattern(one | is_op("relax.add")(one | is_op("relax.multiply")(one, is_const()), is_const()))
               | shifted, {"core": one}))
    every = precise + chains
    # a table activation (integerize's take(table, x + 128)) after the chain, or of an int8 tensor
    # alone: accel's LUT. Listed first: the longer match wins
    looked_up = tuple((PATTERN_NAME, table(chain), notes, check) for chain, notes in every)
    alone = (PATTERN_NAME, table(wildcard().has_dtype("int8")), {"core": one}, check)
    return looked_up + tuple((PATTERN_NAME, chain, notes, check) for chain, notes in every) + (alone,)


def _dtype(expr) -> str:
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else type(ty).__name__


def _shape(expr) -> list | None:
    ty = expr.ty
    if not (isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)):
        return None
    dims = ty.shape.values
    return [int(d) for d in dims] if all(isinstance(d, tirx.IntImm) for d in dims) else None


#: How an operand is laid out against the result's ``rows x length`` elements (:func:`broadcast_kind`).
KINDS = ("full", "row", "column", "scalar")


def broadcast_kind(shape, out, split: int) -> str | None:
    """How a tensor of ``shape`` broadcasts against the result's ``out`` (right-aligned, as
    Relax broadcasts) when the result is laid out as rows of its dimensions from ``split`` on
    (the dimensions before ``split`` number the rows): ``"full"`` for the result's shape,
    ``"row"`` for one value per row (a squeeze-excitation's ``[1, C, 1, 1]`` against
    ``[1, C, H, W]`` split at 2), ``"column"`` for one row repeated (a per-channel ``[C]``
    against ``[1, L, C]`` split at 2: a bias row), ``"scalar"`` for one value in all; else
    None: it varies along some dimensions of the rows (or of a row) but not all, which the
    ALU's two strides (one per row, one per vector of a row) cannot walk.

    >>> broadcast_kind([1, 8, 1, 1], [1, 8, 5, 5], 2), broadcast_kind([5, 5], [1, 8, 5, 5], 2)
    ('row', 'column')
    >>> broadcast_kind([1, 8, 1, 5], [1, 8, 5, 5], 2) is None
    True
    """
    shape = [1] * (len(out) - len(shape)) + [int(d) for d in shape]
    if len(shape) != len(out) or any(d not in (1, o) for d, o in zip(shape, out)):
        return None
    live = [i for i, o in enumerate(out) if o != 1]     # a dimension of 1 is in no row's way

    def varies(dims):       # along all of dims, none of them, or (None) some
        along = [shape[i] != 1 for i in dims]
        return False if not any(along) else True if all(along) else None

    if not live or all(shape[i] == out[i] for i in live):
        return "full"
    rows, cols = varies([i for i in live if i < split]), varies([i for i in live if i >= split])
    if rows is None or cols is None:
        return None
    return {(True, False): "row", (False, True): "column", (False, False): "scalar"}[(rows, cols)]


def row_splits(shapes, out) -> list[int]:
    """The splits of ``out``'s dimensions into rows and a row (see :func:`broadcast_kind`)
    at which every one of ``shapes`` is laid out as one of :data:`KINDS`, fewest rows first.

    >>> row_splits([[120], [1, 40, 120]], [1, 40, 120]), row_splits([[1, 8, 1, 1], [4]], [1, 8, 4, 4])
    ([2], [])
    """
    return [k for k in range(len(out) + 1) if all(broadcast_kind(s, out, k) is not None for s in shapes)]


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


def _check_take(take, bound: dict) -> str | None:
    """Why accel's LUT cannot compute the table lookup ``take`` (``bound``: the match's values
    by variable), or None: a 256-entry int8 constant table along axis 0, indexed by ``x + 128``."""
    values = _constant(take.args[0])
    if values is None or str(values.dtype) != "int8" or values.shape != (LUT_ENTRIES,) or int(take.attrs.axis) != 0:
        return f"a take from a {_dtype(take.args[0])} table that is not {LUT_ENTRIES} int8 entries along axis 0"
    index = bound.get(take.args[1], take.args[1])
    offset = _constant(index.args[1]) if isinstance(index, relax.Call) else None
    if offset is None or offset.size != 1 or int(offset.reshape(-1)[0]) != 128:
        return "a table index that is not x + 128 (the LUT reads entry x + 128 of an int8 x)"
    return None


def check(ctx) -> bool | str:
    """True when accel can run the matched element-wise chain; else the reason it cannot
    (the build report gives it for the operators left on the host; ``tp.build`` warns with it)."""
    root = ctx.matched_expr
    out = _shape(root)
    if out is None:
        return "dynamic shapes; accel needs static shapes"
    shapes = []
    for value in ctx.matched_bindings.values():
        if not isinstance(value, relax.Call):
            continue
        if value.op.name == "relax.astype" and _dtype(value.args[0]) == "int8" and _dtype(value) == "int32":
            shape = _shape(value.args[0])
            if shape is None:
                return "an int8 operand of dynamic shape; accel needs static shapes"
            shapes.append(shape)
            continue
        why = _check_take(value, ctx.matched_bindings) if value.op.name == "relax.take" else _check_call(value)
        if why is not None:
            return why
    if not row_splits(shapes, out):
        return (f"int8 operands of shapes {', '.join(map(str, shapes))} broadcast against {out}: no split of its "
                "dimensions into rows lays each out as the whole result, one value per row, one row repeated or one "
                "value, the broadcasts the ALU's strides take")
    if has_leaking_intermediate_variables(ctx):
        return _leaked(ctx)
    return True


def _leaked(ctx) -> str | bool:
    """Why a chain whose intermediate values are read outside it stays on the host (False
    where TVM's test finds no such reader: a value the function returns)."""
    inside = set(ctx.matched_bindings.keys())
    root = ctx.value_to_bound_var[ctx.matched_expr]
    for var, value in ctx.matched_bindings.items():
        readers = [u for u in ctx.var_usages.get(var, []) if u not in inside]
        if var != root and readers and isinstance(value, relax.Call):
            return (f"the chain's {str(value.op.name).removeprefix('relax.')} {var.name} is also read outside it "
                    f"(by {readers[0].name}); a partition returns only the chain's result")
    return False


#: The element-wise operations whose widened int8 operands :func:`widen_per_use` gives their own cast.
_WIDENED_FOR = ("relax.add", "relax.subtract", "relax.multiply", "relax.negative")


def widen_per_use() -> tvm.transform.Pass:
    """A Relax pass: an ``astype(x, int32)`` of an int8 ``x`` read by an element-wise add,
    subtract, multiply or negative and by something else too becomes a cast of its own for
    each of those operations, so that an element-wise partition can take the cast with its
    chain (a squeeze-excitation's input is widened once by integerize for both the average
    pool's sum and the scaling multiply: shared, the cast would leak out of the partition).
    So does such a cast's product by a constant read more than once (a YOLO C2f block rescales
    one half of a split by the same multiplier for its residual add and for its concat:
    common subexpressions, one product for two chains). Nothing else changes; a cast left
    unread is removed.

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
                            widened[b.var] = relax.op.astype(value.args[0], "int32")
                        elif value.op.name == "relax.multiply" and isinstance(value.args[0], relax.Var) and \
                                value.args[0] in widened and isinstance(value.args[1], ir.Constant):
                            widened[b.var] = relax.op.multiply(widened[value.args[0]], value.args[1])
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
        args = [self._emit_own(self.shared[a]) if isinstance(a, relax.Var) and a in self.shared else self.visit_expr(a)
                for a in value.args]
        new = relax.Call(value.op, args, value.attrs)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(new)))

    def _emit_own(self, expr: relax.Call) -> relax.Var:
        """A binding of its own for ``expr`` (a cast, or a cast times a constant) and for the
        cast inside it: the patterns read the chain binding by binding."""
        args = [self._emit_own(a) if isinstance(a, relax.Call) else self.visit_expr(a) for a in expr.args]
        return self.builder_.emit(relax.Call(expr.op, args, expr.attrs))


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
    already (clipped by the chain), the output buffer and shape, and the leaves' buffers;
    ``table``, a 256-entry int8 buffer the root is looked up in (LUT) before the STORE, or None."""

    root: Node
    saturate: bool
    out: object
    shape: tuple
    leaves: list = field(default_factory=list)
    table: object = None

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
            if str(e.ty.dtype) == "int8" and str(inner.ty.dtype) == "int32":
                node = self.value(inner, iters)     # a table's index: the chain's result, cast to int8 and back
                if not _within_int8(node):
                    raise _Unsupported("a cast to int8 inside the chain of a value not clipped to int8 (it wraps)")
                return node
            if str(e.ty.dtype) != "int32":
                raise _Unsupported(f"a cast to {e.ty.dtype} inside the chain")
            if isinstance(inner, ir.TensorLoad) and str(inner.source.dtype) == "int8" and \
                    inner.source.__chandle__() not in self.values:
                return self.leaf(inner, iters)
            # an int32 value, or one of the chain's int8 values (its result, cast for a table's index)
            if str(inner.ty.dtype) in ("int32", "int8"):
                return self.value(inner, iters)
            raise _Unsupported(f"a cast from {inner.ty.dtype} to int32")
        if isinstance(e, ir.TensorLoad):
            node = self.values.get(e.source.__chandle__())
            if node is None or str(e.source.dtype) not in ("int32", "int8"):
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


def _within_int8(node: Node) -> bool:
    """Whether ``node``'s values lie in [-128, 127]: a widened int8 leaf, or a clip inside int8."""
    clipped = _clip_bounds(node)
    return node.is_leaf or (clipped is not None and -128 <= clipped[1] <= clipped[2] <= 127)


def _table_index(e) -> tuple | None:
    """``(table, index)`` when ``e`` reads a 256-entry int8 buffer at one index, the clamps of
    ``take(mode="clip")`` to [0, 255] and its widening to int64 taken off (an index ``x + 128``
    of an ``x`` in int8 needs none: accel's LUT clamps its own); else None."""
    if not (isinstance(e, ir.TensorLoad) and str(e.source.dtype) == "int8" and len(e.indices) == 1
            and [_int(d) for d in e.source.shape] == [LUT_ENTRIES]):
        return None
    index = e.indices[0]
    while isinstance(index, (tirx.Min, tirx.Max, tirx.Cast)):
        if isinstance(index, tirx.Cast):        # an int32 index widened to int64: the same value
            if str(index.ty.dtype) != "int64" or str(index.value.ty.dtype) != "int32":
                return None
            index = index.value
            continue
        bound = LUT_ENTRIES - 1 if isinstance(index, tirx.Min) else 0
        inner = [x for x, c in ((index.a, index.b), (index.b, index.a)) if _int(c) == bound]
        if not inner:
            return None
        index = inner[0]
    return e.source, index


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
    sch = tp.Schedule(ir.IRModule({"main": func}))
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
        lookup = _table_index(store.value) if str(store.buffer.dtype) == "int8" else None
        if lookup is not None:
            final = _looked_up(reader, lookup, iters, store.buffer)
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


def _looked_up(reader: _Reader, lookup: tuple, iters, out) -> Chain:
    """The chain whose last block stores ``table[x + 128]`` (``lookup``: the table and the index)."""
    table, index = lookup
    if table.__chandle__() not in reader.params:
        raise _Unsupported(f"the table {table.name} is not an input of the partition")
    node = reader.value(index, iters)
    if isinstance(node, int) or node.op is not AluOp.ADD or node.b != 128:
        raise _Unsupported("a table index that is not x + 128")
    x = node.a
    if not _within_int8(x):
        raise _Unsupported("a table lookup of a value not clipped to int8 (the LUT clamps its index)")
    clipped = _clip_bounds(x)
    # a clip to all of int8 is the LUT's own clamp; a narrower one runs on the ALU
    root = clipped[0] if clipped is not None and clipped[1:] == (-128, 127) else x
    return Chain(root, False, out, tuple(int(d) for d in out.shape), [n_.leaf for n_ in reader.leaves.values()],
                 table)


# ----------------------------------------------------------------------------------------
# the instructions
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """``rows`` x ``length`` elements, rows padded to ``padded`` (whole vectors); a block is
    ``block`` rows by ``chunk`` elements of them (a multiple of ``tile``; all of a padded row
    when it fits); ``kinds`` maps each node (by id) to one of :data:`KINDS`."""

    rows: int
    length: int
    padded: int
    block: int
    chunk: int
    kinds: dict

    @property
    def iterations(self) -> int:
        """How many blocks the rows run in (the planner double-buffers a loop's scratchpad)."""
        return -(-self.rows // self.block) * -(-self.length // self.chunk)


def _layout(chain: Chain, config: Config) -> _Layout:
    """The rows the chain's values are laid out in and the blocks it runs in: the most rows
    that fit ACC and INP (counted off the buffers one block allocates, doubled where the loops
    run more than once, as the planner doubles them), of whole rows where one fits, else of
    rows cut into the fewest equal chunks that fit. Of the splits at which every value is laid
    out as one of :data:`KINDS`, the one that pads least."""
    t = config.tile
    out = chain.shape
    nodes = chain.nodes()
    splits = row_splits([n.shape for n in nodes], out)
    if not splits:
        raise _Unsupported(f"values of shapes {', '.join(str(list(n.shape)) for n in nodes if n.is_leaf)} "
                           f"broadcast against {list(out)}: no split into rows lays each out as the whole result, "
                           "one value per row, one row repeated or one value")
    capacity = {ACC.scope: config.acc_elements, INP.scope: config.inp_elements}

    def fits(layout: _Layout) -> bool:
        # a dry run counts the block's allocations without writing its instructions: the search
        # tries dozens of layouts per chain, and writing their calls was most of a model's build
        emitter = _Emitter(chain, layout, config, None, None, None, dry=True)
        _, where = emitter.once(0, layout.chunk, "")
        emitter.block(0, layout.block, 0, layout.chunk, "", where)
        copies = 2 if layout.iterations > 1 else 1
        return all(emitter.used.get(scope, 0) * copies <= capacity[scope] for scope in capacity)

    def choose(k: int) -> _Layout | None:
        rows, length = int(np.prod(out[:k], dtype=np.int64)), int(np.prod(out[k:], dtype=np.int64))
        kinds = {id(n): broadcast_kind(n.shape, out, k) for n in nodes}
        padded = _round(length, t)
        for pieces in range(1, padded // t + 1):
            chunk = _round(-(-length // pieces), t)
            if pieces > 1 and chunk == _round(-(-length // (pieces - 1)), t):
                continue        # the same chunk as fewer pieces: it did not fit
            if pieces == 2 and not fits(_Layout(rows, length, padded, 1, t, kinds)):
                return None     # not even one vector of a row, double-buffered: no piece fits
            block = rows
            while block and not fits(_Layout(rows, length, padded, block, chunk, kinds)):
                block //= 2
            if block:
                return _Layout(rows, length, padded, block, chunk, kinds)
        return None

    candidates = [c for c in map(choose, splits) if c is not None]
    if not candidates:
        raise _Unsupported(f"a tile of the {'x'.join(map(str, out))} result does not fit ACC with the chain's values")
    return min(candidates, key=lambda c: (c.rows * c.padded, c.iterations, -c.block))


def _round(n: int, t: int) -> int:
    return -(-n // t) * t


def _tiles(elements: int, t: int) -> int:
    return -(-elements // (t * t))


class _Emitter:
    """Writes one block of rows: its buffers, LOADs, widening, ALU steps and STORE. ``used``
    counts the elements allocated in each scratchpad (by scope) since it was made; a ``dry``
    emitter only counts them (no buffer, no instruction is written)."""

    def __init__(self, chain: Chain, layout: _Layout, config: Config, ones, column, lut, *,
                 dry: bool = False) -> None:
        self.chain, self.layout, self.t = chain, layout, config.tile
        self.ones, self.column, self.lut = ones, column, lut
        self.dry, self.used = dry, {}
        self.uses: dict = {}
        for n in chain.nodes():
            if not n.is_leaf:
                for operand in (n.a, n.b):
                    if isinstance(operand, Node):
                        self.uses[id(operand)] = self.uses.get(id(operand), 0) + 1

    def once(self, col0, cols: int, tag: str) -> tuple:
        """``(allocations and instructions, regions)`` of the values that do not vary along the
        rows (a bias row, one value), for the ``cols`` elements of each row from ``col0``: computed
        once for all the blocks of rows that read them."""
        self.start(None, 0, col0, cols, tag)
        where: dict = {}
        for n in self.chain.nodes():
            if self.layout.kinds[id(n)] in ("column", "scalar"):
                where[id(n)] = self.widen(n) if n.is_leaf else self.compute(n, where)
        return self.allocs + self.stmts, where

    def block(self, row0, rows: int, col0, cols: int, tag: str, once: dict) -> list:
        """The allocations and instructions of the block of ``rows`` rows from ``row0``, and of
        ``cols`` elements of each from ``col0``, reading the regions ``once`` computed (a value
        that does not vary along the rows is never written in place by one that does: their
        kinds differ)."""
        self.start(row0, rows, col0, cols, tag)
        where = dict(once)
        for n in self.chain.nodes():
            if id(n) not in where:
                where[id(n)] = self.widen(n) if n.is_leaf else self.compute(n, where)
        root = where[id(self.chain.root)]
        if self.chain.table is not None:
            ext_out, ext_in, dso, dsi = self.walk(root[1])
            self.emit(LUT, dst_addr=root[0], lut_addr=self.lut, ext_out=ext_out, ext_in=ext_in,
                      dst_stride_out=dso, dst_stride_in=dsi)
        self.store(root)
        return self.allocs + self.stmts

    def start(self, row0, rows: int, col0, cols: int, tag: str) -> None:
        self.stmts, self.allocs, self.tag, self.count = [], [], tag, 0
        self.row0, self.rows, self.col0, self.cols = row0, rows, col0, cols
        # ACC rows are the chunk's width apart; the ALU walks the vectors this block's columns fill
        self.width, self.vectors = self.layout.chunk, _round(cols, self.t) // self.t
        self.left = dict(self.uses)

    def emit(self, instruction, **arguments) -> None:
        """Write the call of ``instruction`` (none when dry)."""
        if not self.dry:
            self.stmts.append(instruction.call(**arguments))

    # regions ------------------------------------------------------------------------
    def acc_tiles(self, kind: str) -> int:
        """The tiles of an ACC region for a value of ``kind``: the block's rows of padded vectors
        (full), one vector per row (row), one padded row (column) or one vector (scalar), in
        whole tiles (the widening writes tiles)."""
        t = self.t
        vectors = {"full": self.rows * self.width // t, "row": self.rows, "column": self.width // t, "scalar": 1}[kind]
        return _tiles(vectors * t, t)

    def acc(self, kind: str):
        """A fresh ACC region for a value of ``kind`` (:meth:`acc_tiles`): ``(buffer, kind)``."""
        t = self.t
        return self.allocate(self.acc_tiles(kind) * t * t, "int32", "acc", ACC.scope), kind

    def inp(self, tiles: int):
        return self.allocate(tiles * self.t * self.t, "int8", "inp", INP.scope)

    def allocate(self, elements: int, dtype: str, what: str, scope: str):
        """A fresh scratchpad buffer of ``elements`` (None when dry: only counted)."""
        self.count += 1
        self.used[scope] = self.used.get(scope, 0) + elements
        if self.dry:
            return None
        buf = tirx.decl_buffer((elements,), dtype, f"{BUFFER_PREFIX}{what}{self.count}{self.tag}", scope=scope)
        self.allocs.append(tirx.AllocBuffer(buf))
        return buf

    def walk(self, kind: str) -> tuple:
        """``(ext_out, ext_in, stride_out, stride_in)`` of the ALU's vectors over a region of
        ``kind``: the block's rows (outer) and the vectors of a row (inner); a stride of 0
        repeats what a region does not vary along (the ALU's broadcast)."""
        t = self.t
        rows, row = kind in ("full", "row"), kind in ("full", "column")
        return (self.rows if rows else 1, self.vectors if row else 1,
                (self.width if row else t) if rows else 0, t if row else 0)

    # steps --------------------------------------------------------------------------
    def widen(self, n: Node):
        """LOAD the int8 leaf into INP and widen it into ACC (zeroed, then DWMAC by ones for a
        whole tensor or a row, GEMM by the ones column for one value per row or in all)."""
        t, lay = self.t, self.layout
        kind = self.layout.kinds[id(n)]
        tiles = self.acc_tiles(kind)
        region = self.acc(kind)
        buf = region[0]
        staged = self.inp(tiles)
        if kind in ("full", "column"):
            rows = self.rows if kind == "full" else 1
            self.emit(LOAD[Mem.INP], host=n.leaf,
                      elem_offset=(self.row0 * lay.length if kind == "full" else 0) + self.col0,
                      sram_addr=staged, sram_ld=self.width, rows=rows, cols=self.cols, dram_ld=lay.length, pad_top=0,
                      pad_bottom=0, pad_left=0, pad_right=self.width - self.cols, pad_value=0)
        else:
            rows = self.rows if kind == "row" else 1
            self.emit(LOAD[Mem.INP], host=n.leaf, elem_offset=self.row0 if kind == "row" else 0, sram_addr=staged,
                      sram_ld=t, rows=rows, cols=1, dram_ld=1, pad_top=0, pad_bottom=0, pad_left=0, pad_right=t - 1,
                      pad_value=0)
        tile = t * t
        steps = {"ext_out": tiles, "ext_in": 1, "acc_stride_out": tile, "acc_stride_in": 0}
        self.zero(buf)
        if kind in ("full", "column"):
            self.emit(DWMAC, acc_addr=buf, inp_addr=staged, wgt_addr=self.ones, acc_ld=t, inp_ld=t,
                      inp_stride_out=tile, inp_stride_in=0, wgt_stride_out=0, wgt_stride_in=0, **steps)
        else:
            self.emit(GEMM, acc_addr=buf, inp_addr=staged, wgt_addr=self.column, acc_ld=t, inp_ld=t, wgt_ld=t,
                      inp_stride_out=tile, inp_stride_in=0, wgt_stride_out=0, wgt_stride_in=0, **steps)
        return region

    def alu(self, op: AluOp, dst, src=None, imm: int = 0) -> None:
        """One ALU step over ``dst``'s vectors, with ``src``'s (walked the same way, broadcast
        where it does not vary) or the immediate."""
        ext_out, ext_in, dst_out, dst_in = self.walk(dst[1])
        src_out, src_in = self.walk(src[1])[2:] if src is not None else (0, 0)
        self.emit(ALU[op, src is None], dst_addr=dst[0], src_addr=src[0] if src is not None else 0, imm=imm,
                  ext_out=ext_out, ext_in=ext_in, dst_stride_out=dst_out, dst_stride_in=dst_in,
                  src_stride_out=src_out if ext_out > 1 else 0, src_stride_in=src_in if ext_in > 1 else 0)

    def copy(self, region, kind: str):
        """A fresh region of ``kind`` holding ``region``'s values (broadcast if need be)."""
        fresh = self.acc(kind)
        self.zero(fresh[0])
        self.alu(AluOp.ADD, fresh, region)
        return fresh

    def zero(self, buf) -> None:
        """Zero the ACC buffer ``buf`` with a LOAD of padding alone (no DRAM read: its issue
        cycles only, where a GEMM reset takes ``tile`` cycles a tile)."""
        if self.dry:
            return
        t = self.t
        self.emit(LOAD[Mem.ACC], host=self.chain.leaves[0], elem_offset=0, sram_addr=buf, sram_ld=t, rows=0, cols=0,
                  dram_ld=0, pad_top=int(buf.shape[0]) // t, pad_bottom=0, pad_left=t, pad_right=0, pad_value=0)

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
        self.emit(STORE[StoreMode.SATURATE if chain.saturate else StoreMode.WRAP], host=chain.out,
                  elem_offset=self.row0 * lay.length + self.col0, sram_addr=region[0], sram_ld=self.width,
                  rows=self.rows, cols=self.cols, dram_ld=lay.length, dram_step=1)


def _weights(t: int) -> tuple:
    """The WGT buffers: of the widening, a row of ones (DWMAC) and a tile whose first column is
    ones (GEMM); a LUT's table."""
    return (tirx.decl_buffer((t,), "int8", f"{BUFFER_PREFIX}ones", scope=WGT.scope),
            tirx.decl_buffer((t * t,), "int8", f"{BUFFER_PREFIX}column", scope=WGT.scope),
            tirx.decl_buffer((LUT_ENTRIES,), "int8", f"{BUFFER_PREFIX}table", scope=WGT.scope))


def _parts(total: int, size: int) -> list:
    """``[(count, start, size)]``: ``count`` whole pieces of ``size`` in ``total`` (a loop), then
    the rest (``count`` 0: one piece, at ``start``)."""
    whole, rest = divmod(total, size)
    return ([(whole, 0, size)] if whole else []) + ([(0, whole * size, rest)] if rest else [])


def _checked_layout(chain: Chain, config: Config) -> _Layout:
    """:func:`_layout`, raising ``ValueError`` naming the problem when its rows do not fit ACC."""
    try:
        return _layout(chain, config)
    except _Unsupported as why:
        raise ValueError(str(why)) from None


def lower(func: tirx.PrimFunc, chain: Chain, config: Config, layout: _Layout | None = None) -> tirx.PrimFunc:
    """``func`` with its body replaced by accel's instructions for ``chain`` (see the module
    docstring), laid out as ``layout`` says (by default the one :func:`_layout` searches); raises
    ``ValueError`` naming the problem when its rows do not fit ACC."""
    if layout is None:
        layout = _checked_layout(chain, config)
    t = config.tile
    host = chain.leaves[0]
    ones, column, lut = _weights(t)
    # weights of padding alone: a row of ones (DWMAC), a tile whose first column is ones (GEMM)
    pad = {"elem_offset": 0, "rows": 0, "cols": 0, "dram_ld": 0, "pad_bottom": 0, "pad_right": 0}
    stmts = [tirx.AllocBuffer(ones), tirx.AllocBuffer(column),
             LOAD[Mem.WGT].call(host=host, sram_addr=ones, sram_ld=t, pad_top=1, pad_left=t, pad_value=1,
                                **pad),
             LOAD[Mem.WGT].call(host=host, sram_addr=column, sram_ld=t, pad_top=t, pad_left=t, pad_value=0,
                                **pad),
             LOAD[Mem.WGT].call(host=host, sram_addr=column, sram_ld=t, pad_top=t, pad_left=1, pad_value=1,
                                **pad)]
    if chain.table is not None:     # the table, staged in WGT once
        stmts += [tirx.AllocBuffer(lut), LOAD[Mem.WGT].call(
            host=chain.table, elem_offset=0, sram_addr=lut, sram_ld=t, rows=LUT_ENTRIES // t, cols=t, dram_ld=t,
            pad_top=0, pad_bottom=0, pad_left=0, pad_right=0, pad_value=0)]
    emitter = _Emitter(chain, layout, config, ones, column, lut)
    # pieces of the rows (a loop over the whole ones, then the rest), each computing what does
    # not vary along the rows once, then blocks of rows (the same): every piece and block the same
    # instructions at other offsets, with loop vars of its own
    for c, (col_count, col_start, cols) in enumerate(_parts(layout.length, layout.chunk)):
        col_var = tirx.Var("elementwise_chunk", "int32") if col_count else None
        col0 = col_var * cols if col_var is not None else tirx.IntImm("int32", col_start)
        piece, once = emitter.once(col0, cols, "_once" + "_end" * c)
        for r, (row_count, row_start, rows) in enumerate(_parts(layout.rows, layout.block)):
            row_var = tirx.Var("elementwise_block", "int32") if row_count else None
            row0 = row_var * rows if row_var is not None else tirx.IntImm("int32", row_start)
            body = emitter.block(row0, rows, col0, cols, "_rest" * r + "_end" * c, once)
            stmt = tirx.SeqStmt(body) if len(body) > 1 else body[0]
            piece.append(tirx.For(row_var, tirx.IntImm("int32", 0), tirx.IntImm("int32", row_count),
                                  tirx.ForKind.SERIAL, stmt) if row_var is not None else stmt)
        stmt = tirx.SeqStmt(piece) if len(piece) > 1 else piece[0]
        stmts.append(tirx.For(col_var, tirx.IntImm("int32", 0), tirx.IntImm("int32", col_count), tirx.ForKind.SERIAL,
                              stmt) if col_var is not None else stmt)
    # a block in a root block, as TVM's passes after scheduling expect of a PrimFunc's body
    # (Relax's SplitLayoutRewritePreproc, run on a real model's module, wants both)
    chain_block = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "elementwise", tirx.SeqStmt(stmts)))
    return func.with_body(s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", chain_block)))


def describe(chain: Chain, config: Config, layout: _Layout | None = None) -> str:
    """One line for the report: the chain's shape, ``layout`` (by default the one :func:`_layout` searches)
    and operations.

    >>> a = Node(shape=(1, 8, 3, 3), leaf=tirx.decl_buffer((1, 8, 3, 3), "int8", "a"))
    >>> root = Node(shape=(1, 8, 3, 3), op=AluOp.SHR, a=Node(shape=(1, 8, 3, 3), op=AluOp.MUL, a=a, b=5), b=3)
    >>> out = tirx.decl_buffer((1, 8, 3, 3), "int8", "out")
    >>> describe(Chain(root, True, out, (1, 8, 3, 3), [a.leaf]), Config())
    'offloaded element-wise chain: 1 int8 operand(s) (full) -> 1x8x3x3 int8 as 1 row(s) of 72, 2 ALU step(s) (MUL, SHR)'
    """
    if layout is None:
        layout = _checked_layout(chain, config)
    ops = [n.op.name for n in chain.nodes() if not n.is_leaf]
    kinds = sorted({layout.kinds[id(n)] for n in chain.nodes() if n.is_leaf})
    return (f"offloaded element-wise chain: {len(chain.leaves)} int8 operand(s) ({', '.join(kinds)}) -> "
            f"{'x'.join(map(str, chain.shape))} int8 as {layout.rows} row(s) of {layout.length}"
            f"{f' in pieces of {layout.chunk}' if layout.chunk < layout.padded else ''}, "
            f"{len(ops)} ALU step(s) ({', '.join(ops)})")


def describe_operation(chain: Chain) -> list:
    """What the chain computes, in words for the report: ``add``, ``subtract``, ``multiply``
    (of two tensors) or ``rescale`` (of one), then ``requantise`` when it multiplies by a
    constant or shifts, then ``table lookup`` when it ends in one (a lookup alone is only that).

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
    words = list(dict.fromkeys(words)) or (["rescale"] if nodes or chain.table is None else [])
    if any(isinstance(n.b, int) and (n.op is AluOp.SHR or (n.op is AluOp.MUL and n.b != -1)) for n in nodes):
        words.append("requantise")
    return words + (["table lookup"] if chain.table is not None else [])


def schedule_partition(func: tirx.PrimFunc, config: Config) -> tirx.PrimFunc | None:
    """The element-wise partition ``func`` lowered to accel's instructions with its notes for
    the report, or None when ``func`` is no element-wise chain (it has a reduction, or it is a
    hand-written workload the chain's analysis declines); a partition of :func:`patterns`
    accel cannot run is returned as it is, its notes saying why (it runs on the CPU)."""
    sch = tp.Schedule(ir.IRModule({"main": func}))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    if not blocks or any(int(iv.iter_type) != 0 for b in blocks for iv in b.iter_vars):
        return None
    chain, why = analyse(func)
    if chain is None and origin_of(func) is None:
        return None     # a hand-written workload, not this pattern's partition: the GEMM scheduler's
    notes = {"host_macs": 0, "device_macs": 0, "host_steps": [], "epilogue": [], "details": []}
    if chain is not None:
        try:
            layout = _checked_layout(chain, config)       # searched once: lower and describe both take it
            lowered = lower(func, chain, config, layout)
            notes["details"] = [describe(chain, config, layout)]
            notes["epilogue"] = describe_operation(chain)
            return lowered.with_attr(tp.SCHEDULE_NOTES, json.dumps(notes))
        except ValueError as err:
            why = str(err)
    notes["host_steps"] = [[blocks[-1].name_hint, f"is not offloaded: {why}"]]
    return func.with_attr(tp.SCHEDULE_NOTES, json.dumps(notes))


def rule() -> tp.Rewriter:
    """The rule ``accel.elementwise``: the instruction calls :func:`lower` wrote at schedule
    time (on its ``elementwise_*`` scratchpad buffers), taken as they are, so that the build
    report counts the partition as accel's.

    >>> rule().rules[0].name
    'accel.elementwise'
    """
    return calls_rule(PATTERN_NAME, BUFFER_PREFIX)
