"""Pattern nodes: small, immutable data describing the TIR a rule matches.

Patterns are built with the constructors at the bottom of this module (``wildcard``,
``is_var``, ``is_buffer``, ``is_nest``, ``is_copy``...) and Python operators, in the style
of ``tvm.relax.dpl``::

    >>> import tirpat as tp
    >>> i, j = tp.is_var("i"), tp.is_var("j")
    >>> A, B = tp.is_buffer("A"), tp.is_buffer("B")
    >>> copy = tp.is_nest([i, j], tp.is_store(B, [i, j], A[i, j]))

The matcher lives in :mod:`tirpat.tir.match`; this module only describes shapes.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tvm_ffi
from tvm import ir, tirx

# Root node kinds a pattern can match, used to index rules (tinygrad's UPat does the same).
EXPR = "expr"
STMT = "stmt"

_FOR_KINDS = {
    "serial": int(tirx.ForKind.SERIAL),
    "parallel": int(tirx.ForKind.PARALLEL),
    "vectorized": int(tirx.ForKind.VECTORIZED),
    "unrolled": int(tirx.ForKind.UNROLLED),
    "thread_binding": int(tirx.ForKind.THREAD_BINDING),
}


class Pattern:
    """Base class of every pattern.

    Every pattern can carry a capture ``name`` (``m["name"]``), dtype and predicate
    constraints, and supports the operators ``+ - * // %``, ``|`` and ``.astype``.

    >>> p = tp.is_var("i") * 16 + tp.is_var("j")
    >>> p.match(i_0 * 16 + j_0) is not None      # doctest: +SKIP
    True
    """

    name: str | None = None
    dtype: str | None = None
    predicates: tuple = ()
    #: TVM node classes the root of a match can be; ``None`` means any.
    root_types: tuple | None = None
    position: str = EXPR

    # -- constraints -------------------------------------------------------------------
    def has_dtype(self, dtype: str) -> "Pattern":
        """Only match nodes of this dtype. ``tp.wildcard().has_dtype("int8")``"""
        return _with(self, dtype=_dtype(dtype, "has_dtype"))

    def where(self, pred: Callable[[Any], bool]) -> "Pattern":
        """Only match when ``pred(match)`` is true for the complete match.

        >>> tp.is_const().where(lambda m: m.node.value > 0)      # doctest: +SKIP
        """
        if not callable(pred):
            raise TypeError(f"where expects a callable taking a Match, got {pred!r}")
        return _with(self, predicates=self.predicates + (pred,))

    def astype(self, dtype: str) -> "Pattern":
        """A ``Cast`` of this pattern to ``dtype``. ``A[i, k].astype("int32")``"""
        return CastPattern(self, _dtype(dtype, "astype"))

    def match(self, node: Any) -> "Any":
        """Match this pattern against a PrimExpr or a Stmt; return a Match or None.

        >>> tp.is_const(3).match(tvm.tirx.IntImm("int32", 3)) is not None   # doctest: +SKIP
        True
        """
        from .match import match

        return match(self, node)

    # -- operators ---------------------------------------------------------------------
    def __or__(self, other: "Pattern") -> "Pattern":
        return AltPattern(self, to_pattern(other, "right operand of |"))

    def __ror__(self, other: "Pattern") -> "Pattern":
        return AltPattern(to_pattern(other, "left operand of |"), self)

    def __add__(self, other):
        return BinOpPattern("add", self, to_pattern(other, "operand of +"))

    def __radd__(self, other):
        return BinOpPattern("add", to_pattern(other, "operand of +"), self)

    def __sub__(self, other):
        return BinOpPattern("sub", self, to_pattern(other, "operand of -"))

    def __rsub__(self, other):
        return BinOpPattern("sub", to_pattern(other, "operand of -"), self)

    def __mul__(self, other):
        return BinOpPattern("mul", self, to_pattern(other, "operand of *"))

    def __rmul__(self, other):
        return BinOpPattern("mul", to_pattern(other, "operand of *"), self)

    def __floordiv__(self, other):
        return BinOpPattern("floordiv", self, to_pattern(other, "operand of //"))

    def __rfloordiv__(self, other):
        return BinOpPattern("floordiv", to_pattern(other, "operand of //"), self)

    def __mod__(self, other):
        return BinOpPattern("floormod", self, to_pattern(other, "operand of %"))

    def __rmod__(self, other):
        return BinOpPattern("floormod", to_pattern(other, "operand of %"), self)

    # Patterns are compared and hashed by identity: the same object used twice must bind
    # equal nodes, two equal-looking objects are independent.
    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    def __bool__(self):
        return True

    # -- repr --------------------------------------------------------------------------
    def _body_repr(self) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        text = self._body_repr()
        if self.dtype is not None:
            text += f".has_dtype({self.dtype!r})"
        for _ in self.predicates:
            text += ".where(...)"
        return text

    def children(self) -> tuple:
        """The sub-patterns, for walking a pattern tree."""
        return ()

    def match_with(self, matcher, node, env: dict, nest: tuple, path: tuple):
        """Extension point for pattern kinds the matcher does not know: yield environments."""
        raise TypeError(f"{type(self).__name__} is not a pattern the matcher knows how to match")


def _dtype(dtype, what: str) -> str:
    if not isinstance(dtype, str):
        raise TypeError(f"{what} expects a dtype string such as 'int8', got {dtype!r}")
    try:
        return str(tvm_ffi.dtype(dtype))
    except ValueError:
        raise ValueError(f"{what}: {dtype!r} is not a dtype (e.g. 'int8', 'float32', 'int32x4')") from None


def _op_exists(name: str) -> bool:
    for candidate in (name, f"tirx.{name}", f"prim.{name}"):
        try:
            ir.Op.get(candidate)
            return True
        except Exception:  # noqa: BLE001 - TVM reports an unknown op by raising
            continue
    return False


def _with(pattern: Pattern, **changes) -> Pattern:
    clone = object.__new__(type(pattern))
    clone.__dict__.update(pattern.__dict__)
    clone.__dict__.update(changes)
    return clone


def _check_name(name, what: str) -> str | None:
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{what}: the capture name must be a string, got {name!r}")
    return name


def to_pattern(value: Any, what: str) -> Pattern:
    """Coerce an int/float (a constant) or a Pattern; anything else is a TypeError."""
    if isinstance(value, Pattern):
        return value
    if isinstance(value, bool):
        raise TypeError(f"{what}: expected a pattern, got a bool {value!r}")
    if isinstance(value, (int, float)):
        return ConstPattern(value)
    raise TypeError(f"{what}: expected a tirpat pattern (or an int/float constant), got {type(value).__name__} {value!r}")


def _name_repr(ctor: str, name, **kw) -> str:
    parts = [repr(name)] if name is not None else []
    parts += [f"{k}={v!r}" for k, v in kw.items() if v is not None]
    return f"{ctor}({', '.join(parts)})"


# ---------------------------------------------------------------------------------------
# expression patterns
# ---------------------------------------------------------------------------------------
class Wildcard(Pattern):
    """Any PrimExpr, or any Stmt in statement position."""

    def __init__(self, name=None):
        self.name = _check_name(name, "wildcard")

    def _body_repr(self):
        return _name_repr("wildcard", self.name)


class VarPattern(Pattern):
    """A ``tirx.Var`` (a loop variable, a scalar parameter...)."""

    root_types = (tirx.Var,)

    def __init__(self, name=None, name_hint=None):
        self.name = _check_name(name, "is_var")
        if name_hint is not None and not isinstance(name_hint, str):
            raise TypeError(f"is_var: name_hint must be a string, got {name_hint!r}")
        self.name_hint = name_hint

    def _body_repr(self):
        return _name_repr("is_var", self.name, name_hint=self.name_hint)


class ConstPattern(Pattern):
    """An ``IntImm`` or ``FloatImm``, optionally of a given value."""

    root_types = (tirx.IntImm, tirx.FloatImm)

    def __init__(self, value=None, name=None):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TypeError(f"is_const: value must be an int or float, got {value!r}")
        self.value = value
        self.name = _check_name(name, "is_const")

    def _body_repr(self):
        return "is_const()" if self.value is None else f"is_const({self.value!r})"


class BufferPattern(Pattern):
    """A buffer (a ``tirx`` buffer Var). Index it to get a load pattern: ``A[i, j]``."""

    root_types = (tirx.Var,)

    def __init__(self, name=None, name_hint=None, dtype=None, scope=None, ndim=None):
        self.name = _check_name(name, "is_buffer")
        for key, val in (("name_hint", name_hint), ("dtype", dtype), ("scope", scope)):
            if val is not None and not isinstance(val, str):
                raise TypeError(f"is_buffer: {key} must be a string, got {val!r}")
        if dtype is not None:
            dtype = _dtype(dtype, "is_buffer")
        if ndim is not None and (isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 0):
            raise ValueError(f"is_buffer: ndim must be a non-negative int, got {ndim!r}")
        self.name_hint, self.dtype, self.scope, self.ndim = name_hint, dtype, scope, ndim

    def __getitem__(self, indices) -> "LoadPattern":
        if not isinstance(indices, tuple):
            indices = (indices,)
        return LoadPattern(self, indices)

    def __repr__(self):
        text = _name_repr("is_buffer", self.name, name_hint=self.name_hint, dtype=self.dtype,
                          scope=self.scope, ndim=self.ndim)
        return text + ".where(...)" * len(self.predicates)


def _index_list(indices, what):
    if indices is None:
        return None  # any indices, any number of them
    if isinstance(indices, (Pattern, int)):
        indices = [indices]
    if not isinstance(indices, (list, tuple)):
        raise TypeError(f"{what}: indices must be a list of patterns, got {indices!r}")
    return tuple(to_pattern(i, f"{what} index") for i in indices)


class LoadPattern(Pattern):
    """A ``BufferLoad`` (``ir.TensorLoad``) of a buffer pattern at index patterns."""

    root_types = (ir.TensorLoad,)

    def __init__(self, buffer, indices, name=None):
        if not isinstance(buffer, (BufferPattern, Wildcard, AltPattern)):
            raise TypeError(f"is_load: the buffer must be a buffer pattern (tp.is_buffer), got {buffer!r}")
        self.buffer = buffer
        self.indices = _index_list(indices, "is_load")
        self.name = _check_name(name, "is_load")

    def children(self):
        return (self.buffer,) + (self.indices or ())

    def _body_repr(self):
        idx = "..." if self.indices is None else ", ".join(map(repr, self.indices))
        return f"{self.buffer!r}[{idx}]"


_BINOPS = {
    "add": (tirx.Add, "+"),
    "sub": (tirx.Sub, "-"),
    "mul": (tirx.Mul, "*"),
    "floordiv": (tirx.FloorDiv, "//"),
    "floormod": (tirx.FloorMod, "%"),
    "max": (tirx.Max, "max"),
    "min": (tirx.Min, "min"),
}
COMMUTATIVE = frozenset({"add", "mul", "max", "min"})


class BinOpPattern(Pattern):
    """A binary arithmetic node; ``+``, ``*``, ``max`` and ``min`` match either operand order."""

    def __init__(self, op, a, b):
        self.op = op
        self.root_types = (_BINOPS[op][0],)
        self.a, self.b = a, b

    def children(self):
        return (self.a, self.b)

    def _body_repr(self):
        sym = _BINOPS[self.op][1]
        if sym.isalpha():
            return f"tp.{sym}({self.a!r}, {self.b!r})"
        return f"({self.a!r} {sym} {self.b!r})"


class CastPattern(Pattern):
    """A ``Cast`` of a value pattern to a dtype."""

    root_types = (tirx.Cast,)

    def __init__(self, value, dtype):
        self.value = value
        self.to_dtype = dtype

    def children(self):
        return (self.value,)

    def _body_repr(self):
        return f"{self.value!r}.astype({self.to_dtype!r})"


class CallPattern(Pattern):
    """A ``Call`` of the op ``op_name`` (``"tirx.exp"``, or just ``"exp"``)."""

    root_types = (ir.Call,)

    def __init__(self, op_name, args):
        self.op_name = op_name
        self.args = args

    def children(self):
        return self.args

    def _body_repr(self):
        return f"is_call({', '.join([repr(self.op_name)] + [repr(a) for a in self.args])})"


class AffinePattern(Pattern):
    """Any expression affine in the loop variables of its enclosing loops."""

    def __init__(self, name=None):
        self.name = _check_name(name, "affine")

    def _body_repr(self):
        return _name_repr("affine", self.name)


class AltPattern(Pattern):
    """``p | q``: the first alternative that matches."""

    def __init__(self, left, right):
        self.left, self.right = left, right
        if left.position != right.position:
            raise TypeError(f"cannot alternate an expression pattern with a statement pattern: {left!r} | {right!r}")
        self.position = left.position
        if left.root_types is None or right.root_types is None:
            self.root_types = None
        else:
            self.root_types = tuple(dict.fromkeys(left.root_types + right.root_types))

    def children(self):
        return (self.left, self.right)

    def _body_repr(self):
        return f"({self.left!r} | {self.right!r})"


# ---------------------------------------------------------------------------------------
# statement patterns
# ---------------------------------------------------------------------------------------
class StmtPattern(Pattern):
    position = STMT

    def has_dtype(self, dtype):
        raise TypeError(f"has_dtype applies to expression patterns, not to {self!r}")

    def astype(self, dtype):
        raise TypeError(f"astype applies to expression patterns, not to {self!r}")


def _stmt(p, what):
    if isinstance(p, Wildcard):
        return p
    if not isinstance(p, Pattern) or p.position != STMT:
        raise TypeError(f"{what}: expected a statement pattern (is_store, is_for, is_nest, is_seq, is_copy, wildcard), got {p!r}")
    return p


def _expr(p, what):
    p = to_pattern(p, what)
    if p.position != EXPR:
        raise TypeError(f"{what}: expected an expression pattern, got the statement pattern {p!r}")
    return p


class StorePattern(StmtPattern):
    """A ``BufferStore``: ``buf[indices] = value``."""

    root_types = (tirx.BufferStore,)

    def __init__(self, buffer, indices, value, name=None):
        if not isinstance(buffer, (BufferPattern, Wildcard, AltPattern)):
            raise TypeError(f"is_store: the buffer must be a buffer pattern (tp.is_buffer), got {buffer!r}")
        self.buffer = buffer
        self.indices = _index_list(indices, "is_store")
        self.value = _expr(value, "is_store value")
        self.name = _check_name(name, "is_store")

    def children(self):
        return (self.buffer,) + (self.indices or ()) + (self.value,)

    def _body_repr(self):
        idx = "..." if self.indices is None else ", ".join(map(repr, self.indices))
        return f"is_store({self.buffer!r}[{idx}], {self.value!r})"


def _kind(kind, what):
    if kind is None:
        return None
    if isinstance(kind, str):
        if kind not in _FOR_KINDS:
            raise ValueError(f"{what}: unknown loop kind {kind!r}; expected one of {sorted(_FOR_KINDS)}")
        return _FOR_KINDS[kind]
    try:
        value = int(kind)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: kind must be a string like 'serial' or a tirx.ForKind, got {kind!r}") from None
    if value not in _FOR_KINDS.values():
        raise ValueError(f"{what}: unknown loop kind {kind!r}")
    return value


def _extent(extent, what):
    if extent is None:
        return None
    if isinstance(extent, bool):
        raise TypeError(f"{what}: extent must be an int or a pattern, got {extent!r}")
    if isinstance(extent, int):
        if extent < 0:
            raise ValueError(f"{what}: extent must be non-negative, got {extent}")
        return ConstPattern(extent)
    return _expr(extent, f"{what} extent")


def _var(var, what):
    if var is None:
        return None
    if isinstance(var, str):
        return VarPattern(var)
    if not isinstance(var, (VarPattern, Wildcard, AltPattern)):
        raise TypeError(f"{what}: the loop variable must be a var pattern (tp.is_var), got {var!r}")
    return var


class LoopSpec:
    """One loop of an ``is_nest``: its variable, extent and kind patterns.

    >>> tp.loop(tp.is_var("i"), extent=16, kind="serial")   # doctest: +SKIP
    """

    def __init__(self, var=None, extent=None, kind=None):
        self.var = _var(var, "loop")
        self.extent = _extent(extent, "loop")
        self.kind = _kind(kind, "loop")

    def __repr__(self):
        kind = None if self.kind is None else [k for k, v in _FOR_KINDS.items() if v == self.kind][0]
        parts = [repr(self.var)] if self.var is not None else []
        parts += [f"extent={self.extent!r}"] if self.extent is not None else []
        parts += [f"kind={kind!r}"] if kind is not None else []
        return f"loop({', '.join(parts)})"


class ForPattern(StmtPattern):
    """A single ``For`` loop with a body pattern."""

    root_types = (tirx.For,)

    def __init__(self, body, var=None, extent=None, kind=None, name=None):
        self.body = _stmt(body, "is_for body")
        self.spec = LoopSpec(var, extent, kind)
        self.name = _check_name(name, "is_for")

    def children(self):
        return tuple(p for p in (self.spec.var, self.spec.extent, self.body) if p is not None)

    def _body_repr(self):
        return f"is_for({self.body!r}, {self.spec!r})"


class NestPattern(StmtPattern):
    """A perfect loop nest: ``loops`` is a depth, ``None`` (any depth >= 1) or loop specs."""

    root_types = (tirx.For,)

    def __init__(self, loops, body, name=None):
        if loops is None:
            self.depth, self.specs = None, None
        elif isinstance(loops, bool) or isinstance(loops, float):
            raise TypeError(f"is_nest: the depth must be an int, got {loops!r}")
        elif isinstance(loops, int):
            if loops < 1:
                raise ValueError(f"is_nest: the depth must be at least 1, got {loops}")
            self.depth, self.specs = loops, None
        elif isinstance(loops, (list, tuple)):
            if not loops:
                raise ValueError("is_nest: the loop list is empty")
            self.specs = tuple(l if isinstance(l, LoopSpec) else LoopSpec(var=l) for l in loops)
            self.depth = len(self.specs)
        else:
            raise TypeError(f"is_nest: loops must be an int, None or a list of tp.loop/var patterns, got {loops!r}")
        self.body = _stmt(body, "is_nest body")
        self.name = _check_name(name, "is_nest")

    def children(self):
        out = []
        for s in self.specs or ():
            out += [p for p in (s.var, s.extent) if p is not None]
        return tuple(out) + (self.body,)

    def _body_repr(self):
        loops = "None" if self.depth is None else (
            str(self.depth) if self.specs is None else f"[{', '.join(map(repr, self.specs))}]")
        return f"is_nest({loops}, {self.body!r})"


class SeqPattern(StmtPattern):
    """A contiguous run of statements inside a ``SeqStmt`` (or a single statement)."""

    root_types = (tirx.SeqStmt,)

    def __init__(self, stmts, name=None):
        if not stmts:
            raise ValueError("is_seq needs at least one statement pattern")
        self.stmts = tuple(_stmt(s, "is_seq") for s in stmts)
        self.name = _check_name(name, "is_seq")

    def children(self):
        return self.stmts

    def _body_repr(self):
        return f"is_seq({', '.join(map(repr, self.stmts))})"


class IfPattern(StmtPattern):
    """An ``IfThenElse`` statement."""

    root_types = (tirx.IfThenElse,)

    def __init__(self, cond, then_case, else_case=None, name=None):
        self.cond = _expr(cond, "is_if condition")
        self.then_case = _stmt(then_case, "is_if then")
        self.else_case = None if else_case is None else _stmt(else_case, "is_if else")
        self.name = _check_name(name, "is_if")

    def children(self):
        return tuple(p for p in (self.cond, self.then_case, self.else_case) if p is not None)

    def _body_repr(self):
        extra = "" if self.else_case is None else f", {self.else_case!r}"
        return f"is_if({self.cond!r}, {self.then_case!r}{extra})"


class CopyPattern(StmtPattern):
    """A copy nest ``dst[affine] = src[affine]`` (possibly cast, possibly padded)."""

    root_types = (tirx.For, tirx.BufferStore)

    def __init__(self, dst=None, src=None, name=None):
        for what, b in (("dst", dst), ("src", src)):
            if b is not None and not isinstance(b, (BufferPattern, AltPattern)):
                raise TypeError(f"is_copy: {what} must be a buffer pattern (tp.is_buffer), got {b!r}")
        self.dst = dst or BufferPattern()
        self.src = src or BufferPattern()
        self.name = _check_name(name, "is_copy")

    def children(self):
        return (self.dst, self.src)

    def _body_repr(self):
        return f"is_copy(dst={self.dst!r}, src={self.src!r}{'' if self.name is None else f', name={self.name!r}'})"


# ---------------------------------------------------------------------------------------
# constructors: the public API
# ---------------------------------------------------------------------------------------
def wildcard(name: str | None = None) -> Pattern:
    """Any PrimExpr (or any Stmt in statement position).

    >>> tp.wildcard("x") + 1        # any expression plus one
    (wildcard('x') + is_const(1))
    """
    return Wildcard(name)


def is_var(name: str | None = None, *, name_hint: str | None = None) -> Pattern:
    """A ``tirx.Var``. ``name`` is a capture key; ``name_hint`` filters on the IR's name.

    >>> tp.is_var("i", name_hint="k_1")
    is_var('i', name_hint='k_1')
    """
    return VarPattern(name, name_hint)


def is_const(value: int | float | None = None) -> Pattern:
    """An integer or float immediate, of ``value`` if given. ``tp.is_const(0)``"""
    return ConstPattern(value)


def is_buffer(name: str | None = None, *, name_hint: str | None = None, dtype: str | None = None,
              scope: str | None = None, ndim: int | None = None) -> BufferPattern:
    """A buffer; ``name`` is a capture key, the keywords filter.

    >>> A = tp.is_buffer("A", dtype="int8", scope="local.accel_inp")
    >>> A[tp.is_var("i"), tp.is_var("k")]      # a load pattern
    is_buffer('A', dtype='int8', scope='local.accel_inp')[is_var('i'), is_var('k')]
    """
    return BufferPattern(name, name_hint, dtype, scope, ndim)


def is_load(buf: Pattern, indices: Sequence[Pattern] | None) -> Pattern:
    """A buffer load; same as ``buf[indices]``; ``indices=None`` takes any indices.

    >>> tp.is_load(tp.is_buffer("A"), None)
    is_buffer('A')[...]
    """
    return LoadPattern(buf, indices)


def is_call(op_name: str, *args: Pattern) -> Pattern:
    """A call of a TIR op, by full (``"tirx.exp"``) or short (``"exp"``) name.

    >>> tp.is_call("if_then_else", tp.wildcard(), tp.wildcard(), tp.is_const(0))
    is_call('if_then_else', wildcard(), wildcard(), is_const(0))
    """
    if not isinstance(op_name, str):
        raise TypeError(f"is_call: op_name must be a string, got {op_name!r}")
    if not _op_exists(op_name):
        raise ValueError(f"is_call: there is no TIR op named {op_name!r} (e.g. 'tirx.exp' or 'exp')")
    return CallPattern(op_name, tuple(_expr(a, "is_call argument") for a in args))


def max(a: Pattern, b: Pattern) -> Pattern:  # noqa: A001 - mirrors tvm.tirx.max
    """``T.max(a, b)``, matched in either operand order. ``tp.max(x, tp.is_const(0))``"""
    return BinOpPattern("max", _expr(a, "max"), _expr(b, "max"))


def min(a: Pattern, b: Pattern) -> Pattern:  # noqa: A001 - mirrors tvm.tirx.min
    """``T.min(a, b)``, matched in either operand order. ``tp.min(x, tp.is_const(127))``"""
    return BinOpPattern("min", _expr(a, "min"), _expr(b, "min"))


def affine(name: str | None = None) -> Pattern:
    """Any expression affine in the enclosing loop variables. ``A[tp.affine("r")]``"""
    return AffinePattern(name)


def is_store(buf: Pattern, indices: Sequence[Pattern] | None, value: Pattern) -> Pattern:
    """A buffer store ``buf[indices] = value``; ``indices=None`` takes any indices.

    >>> tp.is_store(tp.is_buffer("C"), [tp.is_var("i")], tp.is_const(0))
    is_store(is_buffer('C')[is_var('i')], is_const(0))
    """
    return StorePattern(buf, indices, value)


def is_for(body: Pattern, *, var: Pattern | None = None, extent: int | Pattern | None = None,
           kind: str | int | None = None) -> Pattern:
    """One ``For`` loop. ``tp.is_for(tp.wildcard(), extent=16, kind="serial")``"""
    return ForPattern(body, var, extent, kind)


def loop(var: Pattern | None = None, *, extent: int | Pattern | None = None,
         kind: str | int | None = None) -> LoopSpec:
    """A loop spec for ``is_nest``. ``tp.loop(tp.is_var("i"), extent=16)``"""
    return LoopSpec(var, extent, kind)


def is_nest(loops: int | None | Sequence, body: Pattern) -> Pattern:
    """A perfect nest of loops, counted from the matched ``For`` downwards.

    >>> i, j = tp.is_var("i"), tp.is_var("j")
    >>> tp.is_nest([i, j], tp.wildcard())
    is_nest([loop(is_var('i')), loop(is_var('j'))], wildcard())
    """
    return NestPattern(loops, body)


def is_seq(*stmts: Pattern) -> Pattern:
    """A contiguous run of statements in a ``SeqStmt``. ``tp.is_seq(init, update)``"""
    return SeqPattern(stmts)


def is_if(cond: Pattern, then_case: Pattern, else_case: Pattern | None = None) -> Pattern:
    """An ``if`` statement. ``tp.is_if(tp.wildcard(), tp.is_store(C, [i], tp.is_const(0)))``"""
    return IfPattern(cond, then_case, else_case)


def is_copy(dst: Pattern | None = None, src: Pattern | None = None, name: str | None = None) -> Pattern:
    """A copy nest ``dst[affine] = src[affine]``, bound as a :class:`CopyRegion` under ``name``.

    The nest is every loop from the matched ``For`` down to the store. A single store also
    matches (no loops, one element): inside a nest that is not a copy (say ``B[i // 2] =
    A[i]``) each element is then a copy of its own, so a DMA rule may want to decline
    ``extents == ()``.

    >>> tp.is_copy(dst=tp.is_buffer(scope="local.accel_inp"), name="load")
    is_copy(dst=is_buffer(scope='local.accel_inp'), src=is_buffer(), name='load')
    """
    return CopyPattern(dst, src, name)
