"""Patterns: small, immutable data describing the TIR a rule matches, each kind with the one
description of how it matches.

Patterns are built with constructors (``wildcard``, ``is_var``, ``is_buffer``... here;
``is_store``, ``is_nest``... in :mod:`tirpat.tir.statement`; ``is_copy`` in
:mod:`tirpat.tir.copy`) and Python operators, in the style of ``tvm.relax.dpl``:

>>> import tirpat as tp
>>> i, j = tp.is_var("i"), tp.is_var("j")
>>> A, B = tp.is_buffer("A"), tp.is_buffer("B")
>>> copy = tp.is_nest([i, j], tp.is_store(B, [i, j], A[i, j]))

Each kind's ``compile(cc)`` method is its description for the engine
(:mod:`tirpat.tir.engine`): the matcher that finding, rewriting and ``explain`` all run.
This module holds the base class and the expression kinds.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tvm_ffi
from tvm import ir, tirx

from . import engine
from .analysis import const_int, dtype_of, is_tir, key, linear_form, simplify
from .canonical import canonicalize
from .engine import short
from .region import tile_base

# Root node kinds a pattern can match, used to index rules (tinygrad's UPat does the same).
EXPR = "expr"
STMT = "stmt"

# What a capture name stands for; one name may not stand for two of these.
BUFFER, EXPRESSION, STATEMENT, COPY = "a buffer", "an expression", "a statement", "a copy region"


def _accept(node, b, nest, k):
    return k()


class Pattern:
    """Base class of every pattern.

    Every pattern can carry a capture ``name`` (``m["name"]``), dtype and predicate
    constraints, and supports the operators ``+ - * // %``, ``|`` and ``.astype``.

    >>> p = tp.is_var("i") * 16 + tp.is_var("j")
    >>> i0, j0 = tvm.tirx.Var("i0", "int32"), tvm.tirx.Var("j0", "int32")
    >>> p.match(i0 * 16 + j0)["j"].name
    'j0'
    """

    name: str | None = None
    dtype: str | None = None
    predicates: tuple = ()
    #: TVM node classes the root of a match can be; ``None`` means any.
    root_types: tuple | None = None
    position: str = EXPR
    #: what a capture name on this kind stands for (None: whatever its place takes)
    category: str | None = EXPRESSION
    #: the engine binds ``key`` to the matched node (a copy pattern binds its CopyRegion)
    binds_node: bool = True
    #: ``dtype`` is checked by the kind itself (a buffer's element type)
    checks_dtype: bool = False

    @property
    def key(self):
        """What the match is bound under: the capture name, or the pattern itself."""
        return self.name if self.name is not None else self

    # -- constraints -------------------------------------------------------------------
    def has_dtype(self, dtype: str) -> "Pattern":
        """Only match nodes of this dtype.

        >>> tp.wildcard().has_dtype("int8")
        wildcard().has_dtype('int8')
        """
        return _with(self, dtype=_dtype(dtype, "has_dtype"))

    def where(self, pred: Callable[[Any], bool]) -> "Pattern":
        """Only match when ``pred(match)`` is true for the complete match (``match.node``
        is the node this pattern matched).

        >>> positive = tp.is_const().where(lambda m: m.node.value > 0)
        >>> positive.match(tvm.tirx.IntImm("int32", 3)) is not None
        True
        """
        if not callable(pred):
            raise TypeError(f"where expects a callable taking a Match, got {pred!r}")
        return _with(self, predicates=self.predicates + (pred,))

    def astype(self, dtype: str) -> "Pattern":
        """A ``Cast`` of this pattern to ``dtype``.

        >>> tp.is_buffer("A")[tp.is_var("i")].astype("int32")
        is_buffer('A')[is_var('i')].astype('int32')
        """
        return CastPattern(self, _dtype(dtype, "astype"))

    def match(self, node: Any, context: Sequence = ()) -> "engine.Match | None":
        """Match this pattern against a PrimExpr or a Stmt (canonicalised first); a Match or
        None. ``context`` are the For loops around ``node``, outermost first.

        >>> tp.is_const(3).match(tvm.tirx.IntImm("int32", 3)) is not None
        True
        """
        if not is_tir(node):
            raise TypeError(f"match expects a PrimExpr or a Stmt, got {type(node).__name__}")
        return engine.first_match(engine.compiled(self), canonicalize(node), tuple(context))

    def instantiate(self, captures: dict):
        """The expression this pattern denotes once its captures are bound, else None."""
        return None

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

    def compile(self, cc: "engine.Compiler") -> "engine.Matcher":
        """This kind's description: the matcher for the engine (see :mod:`tirpat.tir.engine`)."""
        raise TypeError(f"{type(self).__name__} does not describe how it matches (no compile method)")

    # -- capture names -----------------------------------------------------------------
    @property
    def names(self) -> dict:
        """``{capture name: (what it stands for, the pattern)}`` over this pattern's tree;
        what a wildcard's name stands for is decided by the place it is used in."""
        own = self.__dict__.get("_names")
        if own is None:
            own = {} if self.name is None else {self.name: (self.category, self)}
        return own

    def _collect_names(self, *places: tuple) -> None:
        """Gather the capture names of sub-patterns, each ``(pattern, what its place takes)``,
        and refuse one name standing for two kinds of node (found when the pattern is built,
        not as a baffling mismatch later)."""
        names = dict(self.names)
        for child, place in places:
            if not isinstance(child, Pattern):
                continue
            for name, (what, where) in child.names.items():
                _add_name(names, name, what if what is not None else place, where)
        self.__dict__["_names"] = names


def _add_name(names: dict, name: str, what, where) -> None:
    old = names.get(name)
    if old is None or old[0] is None:
        names[name] = (what, where)
        return
    if what is not None and old[0] != what:
        raise ValueError(f"the capture name {name!r} stands for {old[0]} in {old[1]!r} and for {what} in {where!r}; "
                         f"one name binds one node: use two names")


#: element types TVM computes with: the integer and float widths it has kernels for
_BITS = {"int": (1, 2, 4, 8, 16, 32, 64), "uint": (1, 2, 4, 8, 16, 32, 64), "float": (16, 32, 64),
         "bfloat": (16,)}
_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat"}


def _dtype(dtype, what: str) -> str:
    if not isinstance(dtype, str):
        raise TypeError(f"{what} expects a dtype string such as 'int8', got {dtype!r}")
    try:
        parsed = tvm_ffi.dtype(dtype)
    except ValueError:
        raise ValueError(f"{what}: {dtype!r} is not a dtype (e.g. 'int8', 'float32', 'int32x4')") from None
    family = _CODES.get(parsed.type_code)
    if family is not None and parsed.bits not in _BITS[family]:
        widths = ", ".join(map(str, _BITS[family]))
        raise ValueError(f"{what}: {dtype!r} is not a dtype TVM computes with ({family} has {widths} bits)")
    return str(parsed)


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


def check_name(name, what: str) -> str | None:
    """A capture name, checked to be a string (or None)."""
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


def expression(p, what: str) -> Pattern:
    """``p`` as an expression pattern (ints and floats become constants)."""
    p = to_pattern(p, what)
    if p.position != EXPR:
        raise TypeError(f"{what}: expected an expression pattern, got the statement pattern {p!r}")
    return p


def name_repr(ctor: str, name, **kw) -> str:
    """``ctor('name', key=value, ...)`` for reprs."""
    parts = [repr(name)] if name is not None else []
    parts += [f"{k}={v!r}" for k, v in kw.items() if v is not None]
    return f"{ctor}({', '.join(parts)})"


# ---------------------------------------------------------------------------------------
# expression kinds
# ---------------------------------------------------------------------------------------
class Wildcard(Pattern):
    """Any PrimExpr, or any Stmt in statement position."""

    category = None

    def __init__(self, name=None):
        self.name = check_name(name, "wildcard")

    def _body_repr(self):
        return name_repr("wildcard", self.name)

    def instantiate(self, captures):
        return captures.get(self.key)

    def compile(self, cc):
        return _accept


class VarPattern(Pattern):
    """A ``tirx.Var`` (a loop variable, a scalar parameter...)."""

    root_types = (tirx.Var,)

    def __init__(self, name=None, name_hint=None):
        self.name = check_name(name, "is_var")
        if name_hint is not None and not isinstance(name_hint, str):
            raise TypeError(f"is_var: name_hint must be a string, got {name_hint!r}")
        self.name_hint = name_hint

    def _body_repr(self):
        return name_repr("is_var", self.name, name_hint=self.name_hint)

    def instantiate(self, captures):
        return captures.get(self.key)

    def compile(self, cc):
        hint, fail = self.name_hint, cc.failure(self)

        def match(node, b, nest, k):
            if not isinstance(node, tirx.Var) or tirx.is_buffer_var(node):
                return fail and fail(b, node, nest, f"expected a variable, found {type(node).__name__} {short(node)}")
            if hint is not None and node.name != hint:
                return fail and fail(b, node, nest, f"expected a variable named {hint!r}, found {node.name!r}")
            return k()

        return match


class ConstPattern(Pattern):
    """An ``IntImm`` or ``FloatImm``, optionally of a given value."""

    root_types = (tirx.IntImm, tirx.FloatImm)

    def __init__(self, value=None, name=None):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TypeError(f"is_const: value must be an int or float, got {value!r}")
        self.value = value
        self.name = check_name(name, "is_const")

    def _body_repr(self):
        return "is_const()" if self.value is None else f"is_const({self.value!r})"

    def instantiate(self, captures):
        return captures.get(self.key) if self.value is None else self.value

    def compile(self, cc):
        value, fail = self.value, cc.failure(self)

        def match(node, b, nest, k):
            if not isinstance(node, (tirx.IntImm, tirx.FloatImm)):
                return fail and fail(b, node, nest, f"expected a constant, found {type(node).__name__} {short(node)}")
            if value is not None and node.value != value:
                return fail and fail(b, node, nest, f"expected the constant {value}, found {node.value}")
            return k()

        return match


class BufferPattern(Pattern):
    """A buffer (a ``tirx`` buffer Var). Index it to get a load pattern: ``A[i, j]``."""

    root_types = (tirx.Var,)
    category = BUFFER
    checks_dtype = True

    def __init__(self, name=None, name_hint=None, dtype=None, scope=None, ndim=None):
        self.name = check_name(name, "is_buffer")
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
        text = name_repr("is_buffer", self.name, name_hint=self.name_hint, dtype=self.dtype,
                         scope=self.scope, ndim=self.ndim)
        return text + ".where(...)" * len(self.predicates)

    def instantiate(self, captures):
        return captures.get(self.key)

    def compile(self, cc):
        wanted = [(what, want, field) for what, want, field in (
            ("name_hint", self.name_hint, lambda buf: buf.name), ("dtype", self.dtype, lambda buf: str(buf.dtype)),
            ("scope", self.scope, lambda buf: buf.scope()), ("ndim", self.ndim, lambda buf: len(buf.shape)),
        ) if want is not None]
        fail = cc.failure(self)

        def match(node, b, nest, k):
            if not tirx.is_buffer_var(node):
                return fail and fail(b, node, nest, f"expected a buffer, found {type(node).__name__} {short(node)}")
            for what, want, field in wanted:
                found = field(node)
                if want != found:
                    return fail and fail(b, node, nest, f"expected a buffer with {what} {want!r}, found {node.name} "
                                                        f"with {what} {found!r}")
            return k()

        return match


def index_list(indices, what):
    """Index patterns from a list (ints become constants); None means any indices."""
    if indices is None:
        return None  # any indices, any number of them
    if isinstance(indices, (Pattern, int)):
        indices = [indices]
    if not isinstance(indices, (list, tuple)):
        raise TypeError(f"{what}: indices must be a list of patterns, got {indices!r}")
    return tuple(to_pattern(i, f"{what} index") for i in indices)


def buffer_slot(buffer, what):
    """``buffer`` checked to be a buffer pattern (or a wildcard or alternation of them)."""
    if not isinstance(buffer, (BufferPattern, Wildcard, AltPattern)):
        raise TypeError(f"{what}: the buffer must be a buffer pattern (tp.is_buffer), got {buffer!r}")
    return buffer


class LoadPattern(Pattern):
    """A ``BufferLoad`` (``ir.TensorLoad``) of a buffer pattern at index patterns."""

    root_types = (ir.TensorLoad,)

    def __init__(self, buffer, indices, name=None):
        self.buffer = buffer_slot(buffer, "is_load")
        self.indices = index_list(indices, "is_load")
        self.name = check_name(name, "is_load")
        self._collect_names((self.buffer, BUFFER), *((i, EXPRESSION) for i in self.indices or ()))

    def children(self):
        return (self.buffer,) + (self.indices or ())

    def _body_repr(self):
        idx = "..." if self.indices is None else ", ".join(map(repr, self.indices))
        return f"{self.buffer!r}[{idx}]"

    def compile(self, cc):
        access, fail = compile_access(cc, self), cc.failure(self)

        def match(node, b, nest, k):
            if not isinstance(node, ir.TensorLoad):
                return fail and fail(b, node, nest, f"expected a buffer load, found {type(node).__name__} {short(node)}")
            return access(node.source, node.indices, b, nest, k)

        return match


def compile_access(cc, p):
    """``access(buffer, indices, b, nest, k)`` for a load or store pattern ``p``: its buffer
    and index patterns, the access recorded for :meth:`Match.region`."""
    buffer, record = cc.compile(p.buffer, "buffer"), p.buffer.key
    if p.indices is None:
        def any_indices(buf, indices, b, nest, k):
            b.push(b.accesses, (record, indices))
            return buffer(buf, b, nest, k)

        return any_indices
    n = len(p.indices)
    index = [compile_index(cc, ip, d) for d, ip in enumerate(p.indices)]
    fail = cc.failure(p)

    def access(buf, indices, b, nest, k):
        if len(indices) != n:
            return fail and fail(b, buf, nest, f"expected {n} indices, found {len(indices)} for {buf.name}")
        b.push(b.accesses, (record, indices))
        found = list(indices)

        def at(d):
            if d == n:
                return k()
            return index[d](found[d], buf, b, nest, lambda: at(d + 1))

        return buffer(buf, b, nest, lambda: at(0))

    return access


def compile_index(cc, p, dim):
    """``index(expr, buffer, b, nest, k)`` for index pattern ``p`` in dimension ``dim``.

    An index matches after affine normalisation; inside a nest it also matches as ``base +
    pattern`` where ``base`` does not use the nest's loop variables (a tile of a bigger
    buffer), and every access of the tile must agree on that base.
    """
    step = f"index {dim}"
    inner = cc.compile(p, step)
    if isinstance(p, (Wildcard, AffinePattern)):
        return lambda idx, buf, b, nest, k: inner(idx, b, nest, k)
    fail = cc.failure(p)
    base_key = p.key

    def with_base(b, nest, buf, base, idx, k):
        where = (key(buf), dim, base_key)
        if b.bind_base(where, base):
            return k()
        return fail and fail(b, idx, nest, f"{buf.name} is accessed at two different offsets: "
                                           f"{b.bases[where]} and {base}", (step,))

    def index(idx, buf, b, nest, k):
        expected = p.instantiate(b.captures)
        if isinstance(expected, int):
            expected = tirx.const(expected, dtype_of(idx))
        if expected is not None:
            base = tile_base(idx, expected, b.loops, nest, b.context)
            if base is not None and const_int(base) == 0:
                return k()
            if nest and base is not None:
                return with_base(b, nest, buf, base, idx, k)
            return fail and fail(b, idx, nest, f"expected index {expected}, found {idx}", (step,))
        tried = []

        def then():
            tried.append(True)
            return k()

        mark = b.mark()
        if inner(idx, b, nest, then):
            return True
        if tried or not nest:
            return False
        b.undo(mark)
        form = linear_form(idx, nest)
        if form is None or const_int(form[1]) == 0:
            return False
        coeffs, base = form
        rest = None
        for c, v in zip(coeffs, nest):
            c = const_int(c)
            if c != 0:
                term = v if c == 1 else v * c
                rest = term if rest is None else term + rest
        if rest is None:
            return False
        return inner(simplify(rest), b, nest, lambda: with_base(b, nest, buf, base, idx, k))

    return index


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


def binop_of(node) -> str | None:
    """The operator name (``"add"``, ``"mul"``...) of a binary arithmetic node, else None."""
    for op, (cls, _) in _BINOPS.items():
        if type(node) is cls:
            return op
    return None


class BinOpPattern(Pattern):
    """A binary arithmetic node; ``+``, ``*``, ``max`` and ``min`` match either operand order."""

    def __init__(self, op, a, b):
        self.op = op
        self.root_types = (_BINOPS[op][0],)
        self.a, self.b = a, b
        self._collect_names((a, EXPRESSION), (b, EXPRESSION))

    def children(self):
        return (self.a, self.b)

    def _body_repr(self):
        sym = _BINOPS[self.op][1]
        if sym.isalpha():
            return f"tp.{sym}({self.a!r}, {self.b!r})"
        return f"({self.a!r} {sym} {self.b!r})"

    def instantiate(self, captures):
        a, b = self.a.instantiate(captures), self.b.instantiate(captures)
        if a is None or b is None or (isinstance(a, (int, float)) and isinstance(b, (int, float))):
            return None
        if isinstance(a, (int, float)):
            a = tirx.const(a, dtype_of(b))
        if isinstance(b, (int, float)):
            b = tirx.const(b, dtype_of(a))
        if dtype_of(a) != dtype_of(b):
            return None
        return _BINOPS[self.op][0](a, b)

    def compile(self, cc):
        kind, sym = _BINOPS[self.op]
        lhs, rhs = cc.compile(self.a, "lhs"), cc.compile(self.b, "rhs")
        commutative, fail = self.op in COMMUTATIVE, cc.failure(self)

        def match(node, b, nest, k):
            if type(node) is not kind:
                return fail and fail(b, node, nest, f"expected {sym!r}, found {type(node).__name__} {short(node)}")
            x, y = node.a, node.b
            mark = b.mark()
            if lhs(x, b, nest, lambda: rhs(y, b, nest, k)):
                return True
            if not commutative:
                return False
            b.undo(mark)
            return lhs(y, b, nest, lambda: rhs(x, b, nest, k))

        return match


class CastPattern(Pattern):
    """A ``Cast`` of a value pattern to a dtype."""

    root_types = (tirx.Cast,)

    def __init__(self, value, dtype):
        self.value = value
        self.to_dtype = dtype
        self._collect_names((value, EXPRESSION))

    def children(self):
        return (self.value,)

    def _body_repr(self):
        return f"{self.value!r}.astype({self.to_dtype!r})"

    def compile(self, cc):
        value, to, fail = cc.compile(self.value, "cast value"), self.to_dtype, cc.failure(self)

        def match(node, b, nest, k):
            if type(node) is not tirx.Cast:
                return fail and fail(b, node, nest, f"expected a cast to {to}, found {type(node).__name__} {short(node)}")
            if dtype_of(node) != to:
                return fail and fail(b, node, nest, f"expected a cast to {to}, found a cast to {dtype_of(node)}")
            return value(node.value, b, nest, k)

        return match


class CallPattern(Pattern):
    """A ``Call`` of the op ``op_name`` (``"tirx.exp"``, or just ``"exp"``)."""

    root_types = (ir.Call,)

    def __init__(self, op_name, args):
        self.op_name = op_name
        self.args = args
        self._collect_names(*((a, EXPRESSION) for a in args))

    def children(self):
        return self.args

    def _body_repr(self):
        return f"is_call({', '.join([repr(self.op_name)] + [repr(a) for a in self.args])})"

    def compile(self, cc):
        name, fail = self.op_name, cc.failure(self)
        args = [cc.compile(a, f"arg {n}") for n, a in enumerate(self.args)]
        n = len(args)

        def match(node, b, nest, k):
            if not isinstance(node, ir.Call):
                return fail and fail(b, node, nest, f"expected a call of {name}, found {type(node).__name__} {short(node)}")
            op = getattr(node.op, "name", str(node.op))
            if op != name and op.split(".", 1)[-1] != name:
                return fail and fail(b, node, nest, f"expected a call of {name}, found a call of {op}")
            found = list(node.args)
            if len(found) != n:
                return fail and fail(b, node, nest, f"expected {n} arguments to {op}, found {len(found)}")

            def at(j):
                return k() if j == n else args[j](found[j], b, nest, lambda: at(j + 1))

            return at(0)

        return match


class AffinePattern(Pattern):
    """Any expression affine in the loop variables of its enclosing loops."""

    def __init__(self, name=None):
        self.name = check_name(name, "affine")

    def _body_repr(self):
        return name_repr("affine", self.name)

    def instantiate(self, captures):
        return captures.get(self.key)

    def compile(self, cc):
        fail = cc.failure(self)

        def match(node, b, nest, k):
            if isinstance(node, tirx.Stmt) or tirx.is_buffer_var(node) or \
                    not (dtype_of(node) or "").startswith(("int", "uint")):
                return fail and fail(b, node, nest, f"expected an integer affine expression, found {short(node)}")
            if linear_form(node, [l.loop_var for l in b.context] + list(nest)) is None:
                return fail and fail(b, node, nest, f"expected an expression affine in the loop variables, found {node}")
            return k()

        return match


class AltPattern(Pattern):
    """``p | q``: the first alternative that matches."""

    category = None

    def __init__(self, left, right):
        self.left, self.right = left, right
        if left.position != right.position:
            raise TypeError(f"cannot alternate an expression pattern with a statement pattern: {left!r} | {right!r}")
        self.position = left.position
        if left.root_types is None or right.root_types is None:
            self.root_types = None
        else:
            self.root_types = tuple(dict.fromkeys(left.root_types + right.root_types))
        self._collect_names((left, None), (right, None))

    def children(self):
        return (self.left, self.right)

    def _body_repr(self):
        return f"({self.left!r} | {self.right!r})"

    def instantiate(self, captures):
        return captures.get(self.key)

    def compile(self, cc):
        left, right = cc.compile(self.left, "left of |"), cc.compile(self.right, "right of |")
        fail = cc.failure(self)

        def match(node, b, nest, k):
            mark = b.mark()
            if left(node, b, nest, k):
                return True
            b.undo(mark)
            if right(node, b, nest, k):
                return True
            return fail and fail(b, node, nest, f"neither alternative of {self!r} matches {short(node)}")

        return match


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
    """An integer or float immediate, of ``value`` if given.

    >>> tp.is_const(0).match(tvm.tirx.IntImm("int8", 0)) is not None
    True
    """
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
    return CallPattern(op_name, tuple(expression(a, "is_call argument") for a in args))


def max(a: Pattern, b: Pattern) -> Pattern:  # noqa: A001 - mirrors tvm.tirx.max
    """``T.max(a, b)``, matched in either operand order.

    >>> tp.max(tp.wildcard("x"), 0)
    tp.max(wildcard('x'), is_const(0))
    """
    return BinOpPattern("max", expression(a, "max"), expression(b, "max"))


def min(a: Pattern, b: Pattern) -> Pattern:  # noqa: A001 - mirrors tvm.tirx.min
    """``T.min(a, b)``, matched in either operand order.

    >>> tp.min(tp.wildcard("x"), 127)
    tp.min(wildcard('x'), is_const(127))
    """
    return BinOpPattern("min", expression(a, "min"), expression(b, "min"))


def affine(name: str | None = None) -> Pattern:
    """Any expression affine in the enclosing loop variables.

    >>> tp.is_buffer("A")[tp.affine("r")]
    is_buffer('A')[affine('r')]
    """
    return AffinePattern(name)
