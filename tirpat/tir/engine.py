"""The matching engine: each pattern kind compiles, from its one description, into a matcher,
and one backtracking search runs the matchers.

A pattern kind says how it matches in one place, its ``compile(cc)`` method. That returns a
*matcher* in continuation-passing style::

    matcher(node, b, nest, k) -> bool

``node`` is the IR node, ``b`` the :class:`Bindings` of this attempt (changed in place,
undone on backtracking), ``nest`` the loop variables of the loops matched so far by the
pattern's own nests, and ``k()`` the rest of the match. A matcher calls ``k()`` for each
way it matches, in a fixed order, and returns True as soon as one call does. A choice point
(commutative operands, alternation, where a run starts in a sequence, the depth of
``is_nest(None, ...)``) tries its options in order and undoes a failed option's bindings.
So there is exactly one search: the first complete match (``where`` predicates and a
rule's own final checks included) is the same whoever asks, and nothing is enumerated past
it.

What a pattern must provide (:class:`tirpat.tir.pattern.Pattern` does): ``compile(cc)``;
``key``, the capture key it binds the matched node under (its name, or itself);
``dtype`` and ``predicates``, checked here for every kind; ``binds_node`` (False for a
kind that binds something other than the node, as ``is_copy`` binds a CopyRegion) and
``checks_dtype`` (True for a kind whose ``dtype`` means something else, as a buffer's
element type).

The same description compiles twice: plainly for matching and rewriting, and *traced* for
:func:`tirpat.explain`, where each failure is recorded with its path and the deepest one
is reported. A traced matcher finds the same matches; it only says more on the way.

>>> from tvm import tirx
>>> i = tirx.Var("i", "int32")
>>> m = first_match(compiled(tp.is_var("x") * 2), i * 2)
>>> m["x"].name
'i'
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import tvm_ffi
from tvm import ir, tirx

from .analysis import dtype_is, dtype_of, simplify, substitute
from .region import CopyRegion, Region, RegionError, access_region

#: ``matcher(node, bindings, nest, k) -> bool``
Matcher = Callable[[Any, "Bindings", tuple, Callable[[], bool]], bool]

_POP = object()  # a trail entry that undoes a list append


class Bindings:
    """What one match attempt has bound so far. Every change is recorded on a trail, so a
    choice point can undo a failed option with ``b.undo(mark)``.

    - ``captures``: capture key (a name, or the pattern object itself) -> the bound node;
    - ``loops``: the For nodes matched by nest, loop and copy patterns, outermost first;
    - ``accesses``: ``(buffer pattern key, indices)`` of each access a load or store pattern
      matched, for :meth:`Match.region`;
    - ``bases``: ``(buffer, dimension, index pattern key) -> base`` for an index matched as a
      tile base plus a loop variable, so that every access of the tile agrees on its base;
    - ``deferred``: ``(pattern, node, nest, path)`` of each ``where`` to check on the
      complete match;
    - ``spans``: the ``(start, stop)`` of the run a root ``is_seq`` matched;
    - ``context`` (the For loops around the node) and ``aliases`` (the buffer views the scan
      has seen declared, :class:`~tirpat.tir.region.Aliases`, or None) are read-only;
    - ``trace``: the failure recorder of a traced match, else None.
    """

    __slots__ = ("captures", "loops", "accesses", "bases", "deferred", "spans", "trail", "context",
                 "aliases", "trace")

    def __init__(self, context: tuple = (), aliases=None, trace: "Trace | None" = None):
        self.captures: dict = {}
        self.loops: list = []
        self.accesses: list = []
        self.bases: dict = {}
        self.deferred: list = []
        self.spans: list = []
        self.trail: list = []
        self.context = context
        self.aliases = aliases
        self.trace = trace

    # -- backtracking ------------------------------------------------------------------
    def mark(self) -> int:
        """A point to undo back to."""
        return len(self.trail)

    def undo(self, mark: int) -> None:
        """Forget everything bound since ``mark``."""
        trail = self.trail
        while len(trail) > mark:
            store, k = trail.pop()
            if k is _POP:
                store.pop()
            else:
                del store[k]

    # -- recording ---------------------------------------------------------------------
    def bind(self, k, node) -> bool:
        """Bind ``k`` to ``node``; False when ``k`` is already bound to something else."""
        old = self.captures.get(k)
        if old is None:
            self.captures[k] = node
            self.trail.append((self.captures, k))
            return True
        return same_binding(old, node)

    def bind_base(self, k, base) -> bool:
        """Record a tile base under ``k``; False when another base is recorded there."""
        old = self.bases.get(k)
        if old is None:
            self.bases[k] = base
            self.trail.append((self.bases, k))
            return True
        return old.same_as(base) or tvm_ffi.structural_equal(old, base) or const_zero(old - base)

    def push(self, store: list, item) -> None:
        """Append ``item`` to one of the list fields (``loops``, ``accesses``, ...)."""
        store.append(item)
        self.trail.append((store, _POP))

    def match(self, node) -> "Match":
        """The bindings as they stand, frozen into a :class:`Match` rooted at ``node``."""
        accesses: dict = {}
        for k, indices in self.accesses:
            accesses.setdefault(k, []).append(indices)
        return Match(node, dict(self.captures), tuple(self.loops), self.spans[-1] if self.spans else None,
                     accesses, self.context)


def const_zero(expr) -> bool:
    """True when ``expr`` simplifies to the constant 0."""
    expr = simplify(expr)
    return isinstance(expr, tirx.IntImm) and expr.value == 0


def same_binding(old, node) -> bool:
    """Whether a capture bound to ``old`` may bind ``node`` too: the same node, or an equal
    expression (buffers and copy regions unify by identity only)."""
    if old is node or (hasattr(old, "same_as") and old.same_as(node)):
        return True
    if isinstance(old, CopyRegion) or isinstance(node, CopyRegion):
        return False
    return (not tirx.is_buffer_var(old) and not tirx.is_buffer_var(node)
            and tvm_ffi.structural_equal(old, node, map_free_vars=False))


class Match:
    """A successful match: captures by pattern object or name, the root, loops, regions.

    >>> m = tp.is_var("x").match(tvm.tirx.Var("n", "int32"))
    >>> m["x"].name, m.node.name, m.loops
    ('n', 'n', ())
    """

    def __init__(self, node, captures: dict, loops: tuple = (), span: tuple | None = None,
                 accesses: dict | None = None, context: tuple = ()):
        self.node = node
        self._captures = captures
        self._loops = loops
        self._span = span
        self._accesses = accesses or {}
        self.context = context  #: the For loops enclosing the match, outermost first

    @staticmethod
    def _key(item):
        if isinstance(item, str):
            return item
        k = getattr(item, "key", None)
        if k is None:
            raise TypeError(f"index a Match with a pattern or a capture name, got {item!r}")
        return k

    def __getitem__(self, item):
        k = self._key(item)
        if k not in self._captures:
            raise KeyError(f"{item!r} is not bound in this match (named captures: {sorted(self.captures)})")
        return self._captures[k]

    def __contains__(self, item) -> bool:
        return self._key(item) in self._captures

    def get(self, item, default=None):
        """``m[item]``, or ``default`` when it is not bound."""
        return self[item] if item in self else default

    @property
    def captures(self) -> dict:
        """The named captures, ``{name: node}``."""
        return {k: v for k, v in self._captures.items() if isinstance(k, str)}

    @property
    def loops(self) -> tuple:
        """The For nodes matched by nest patterns (``is_nest``/``is_for``/``is_copy``), outermost first."""
        return self._loops

    @property
    def span(self) -> tuple | None:
        """For an ``is_seq`` match, the ``(start, stop)`` of the matched run in ``node.seq``."""
        return self._span

    def at_origin(self, expr):
        """``expr`` with the matched loops at their first iteration (e.g. an init guard).

        >>> ko, k = tvm.tirx.Var("ko", "int32"), tvm.tirx.Var("k", "int32")
        >>> nest = tvm.tirx.For(k, 0, 16, tvm.tirx.ForKind.SERIAL, tvm.tirx.Evaluate(ko * 16 + k == 0))
        >>> m = tp.is_nest(1, tp.wildcard("first")).match(nest)
        >>> m.at_origin(m["first"].value)     # the init guard, at the nest's first iteration
        ko == 0
        """
        return simplify(substitute(expr, [(l.loop_var, l.min) for l in self.loops]))

    def region(self, buffer) -> Region:
        """The :class:`Region` of a buffer's accesses in the matched nest.

        ``buffer`` is a buffer pattern, a capture name or the buffer itself. With a pattern
        or name, the accesses that pattern matched are used (two patterns may bind one
        buffer at different indices, as in ``A[i, j] + A[j, i]``). A Region describes one
        access pattern: accesses at different indices (a stencil) raise :class:`RegionError`.
        """
        accesses = None
        if isinstance(buffer, str) or hasattr(buffer, "key"):
            buf = self[buffer]
            accesses = self._accesses.get(self._key(buffer))
        else:
            buf = buffer
        if not tirx.is_buffer_var(buf):
            raise TypeError(f"region() needs a buffer, but {buffer!r} is bound to {buf!r}")
        if accesses is None:
            accesses = _accesses(self.node, buf)
        if not accesses:
            raise KeyError(f"buffer {buf.name} is not accessed in the matched node")
        first = accesses[0]
        for other in accesses[1:]:
            if len(other) != len(first) or not all(tvm_ffi.structural_equal(x, y) for x, y in zip(first, other)):
                raise RegionError(f"{buf.name} is accessed at different indices in the match "
                                  f"({list(first)} and {list(other)}); a Region describes one access pattern")
        return access_region(buf, first, self.loops)

    def __repr__(self):
        caps = ", ".join(f"{k}={short(v)}" for k, v in self.captures.items())
        return f"<Match {type(self.node).__name__} loops={[l.loop_var.name for l in self.loops]} {caps}>"


def _accesses(node, buf) -> list:
    """The index lists of every store to and load of ``buf`` in ``node``."""
    found = []

    def on_store(s):
        if s.buffer.same_as(buf):
            found.append(s.indices)

    def on_load(l):
        if l.source.same_as(buf):
            found.append(l.indices)

    tvm_ffi.structural_walk(node, [(tirx.BufferStore, on_store), (ir.TensorLoad, on_load)])
    return found


def short(v) -> str:
    """A one-line description of a node for messages."""
    if tirx.is_buffer_var(v):
        return v.name
    text = str(v).strip().splitlines()
    return text[0] if len(text) == 1 else f"{type(v).__name__}(...)"


# ---------------------------------------------------------------------------------------
# tracing
# ---------------------------------------------------------------------------------------
class Failure:
    """Where a match failed: the path of steps from the root, and expected vs found."""

    def __init__(self, path: tuple, pattern, node, reason: str, final: bool = False):
        self.path, self.pattern, self.node, self.reason = path, pattern, node, reason
        self.final = final  #: the whole structure matched and a precondition failed

    @property
    def depth(self) -> tuple:
        """How close the match came: a failed precondition beats any structural mismatch."""
        return (self.final, len(self.path))

    def __repr__(self):
        where = " > ".join(self.path) or "<root>"
        return f"at {where}: {self.reason}"


class Trace:
    """The deepest failure of a traced match."""

    def __init__(self):
        self.deepest: Failure | None = None

    def record(self, failure: Failure) -> None:
        if self.deepest is None or failure.depth > self.deepest.depth:
            self.deepest = failure


#: ``fail(b, node, nest, reason, steps=(), final=False) -> False``, or None when not tracing
Fail = Callable[..., bool]


# ---------------------------------------------------------------------------------------
# compiling
# ---------------------------------------------------------------------------------------
class Compiler:
    """Compiles a pattern tree into matchers, each occurrence of a sub-pattern at its own path.

    A kind's ``compile(cc)`` uses :meth:`compile` for its sub-patterns, :meth:`failure` for
    its failure messages, and :attr:`root` to know whether it is the pattern's root.
    """

    def __init__(self, trace: bool = False):
        self.trace = trace
        self.path: tuple = ()

    @property
    def root(self) -> bool:
        """True while compiling the root pattern (or a wrapper standing in for it)."""
        return not self.path

    def compile(self, p, step: str | None = None) -> Matcher:
        """The matcher of sub-pattern ``p``, reached from the current one through ``step``
        (a label for explain's paths; None for a wrapper at the same place)."""
        outer = self.path
        if step is not None:
            self.path = outer + (step,)
        try:
            return self._constrained(p, p.compile(self))
        finally:
            self.path = outer

    def failure(self, p) -> Fail | None:
        """For a traced compile, ``fail(b, node, nest, reason, steps=(), final=False)`` that
        records a failure at the current path and returns False; else None, so that a
        description writes ``return fail and fail(b, node, nest, f"...")``."""
        if not self.trace:
            return None
        path = self.path

        def fail(b, node, nest, reason, steps=(), final=False):
            b.trace.record(Failure(tuple(f"for {v.name}" for v in nest) + path + tuple(steps), p, node,
                                   reason, final))
            return False

        return fail

    def _constrained(self, p, fn: Matcher) -> Matcher:
        """``fn`` plus what every kind shares: the dtype, binding the key, deferred predicates."""
        want = None if p.checks_dtype else p.dtype
        k_, binds, preds, path = p.key, p.binds_node, p.predicates, self.path
        if want is None and not binds and not preds:
            return fn
        fail = self.failure(p)
        label = repr(p.name) if p.name is not None else repr(p)

        def constrained(node, b, nest, k):
            if want is not None and not dtype_is(node, want):
                return fail and fail(b, node, nest, f"expected dtype {want}, found {dtype_of(node)} in {short(node)}")
            if binds:
                old = b.captures.get(k_)
                if old is None:
                    b.captures[k_] = node
                    b.trail.append((b.captures, k_))
                elif not same_binding(old, node):
                    if fail is None:
                        return False
                    # Say what differs structurally if anything does, else the conflict.
                    return fn(node, b, nest, lambda: fail(
                        b, node, nest, f"{label} is already bound to {short(old)}, found {short(node)}"))
            if preds:
                b.push(b.deferred, (p, node, nest, path))
            return fn(node, b, nest, k)

        return constrained


_PLAIN: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_TRACED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def compiled(pattern, trace: bool = False) -> Matcher:
    """The matcher of a root pattern (compiled once per pattern and mode)."""
    cache = _TRACED if trace else _PLAIN
    fn = cache.get(pattern)
    if fn is None:
        fn = cache[pattern] = Compiler(trace).compile(pattern)
    return fn


def first_match(matcher: Matcher, node, context: tuple = (), aliases=None,
                trace: Trace | None = None) -> Match | None:
    """Run a compiled pattern on ``node``: the first complete match, or None. A match is
    complete when the deferred ``where`` predicates hold; otherwise the search backtracks to
    the next option. ``context`` are the For loops around ``node``, ``aliases`` the buffer
    views known there, ``trace`` the recorder of a traced matcher's failures (a fresh one
    when not given).
    """
    b = Bindings(context, aliases, trace if trace is not None else Trace())
    found: list = []

    def complete():
        m = b.match(node)
        for p, at, nest, path in b.deferred:
            sub = Match(at, m._captures, m._loops, m._span, m._accesses, context)
            for pred in p.predicates:
                if not pred(sub):
                    b.trace.record(Failure(tuple(f"for {v.name}" for v in nest) + path, p, at,
                                           f"the where() predicate {getattr(pred, '__name__', pred)} is false",
                                           final=True))
                    return False
        found.append(m)
        return True

    matcher(node, b, (), complete)
    return found[0] if found else None
