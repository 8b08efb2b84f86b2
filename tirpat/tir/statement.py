"""Statement patterns: stores, loops, loop nests, runs of statements and ifs.

>>> i = tp.is_var("i")
>>> zero = tp.is_nest([i], tp.is_store(tp.is_buffer("C"), [i], tp.is_const(0)))
>>> zero
is_nest([loop(is_var('i'))], is_store(is_buffer('C')[is_var('i')], is_const(0)))

Loops match in the canonical form (:mod:`tirpat.tir.canonical`): from 0 in steps of 1.
"""

from __future__ import annotations

from typing import Sequence

from tvm import tirx

from .canonical import is_canonical_loop
from .region import guards_in_extents
from .pattern import (BUFFER, EXPRESSION, STATEMENT, STMT, AltPattern, ConstPattern, Pattern, VarPattern, Wildcard,
                      buffer_slot, check_name, compile_access, expression, index_list)

_FOR_KINDS = {
    "serial": int(tirx.ForKind.SERIAL),
    "parallel": int(tirx.ForKind.PARALLEL),
    "vectorized": int(tirx.ForKind.VECTORIZED),
    "unrolled": int(tirx.ForKind.UNROLLED),
    "thread_binding": int(tirx.ForKind.THREAD_BINDING),
}


class StmtPattern(Pattern):
    """Base of the statement kinds."""

    position = STMT
    category = STATEMENT

    def has_dtype(self, dtype):
        raise TypeError(f"has_dtype applies to expression patterns, not to {self!r}")

    def astype(self, dtype):
        raise TypeError(f"astype applies to expression patterns, not to {self!r}")


def statement(p, what):
    """``p`` checked to be a statement pattern (or a wildcard, which takes any statement)."""
    if isinstance(p, Wildcard):
        return p
    if not isinstance(p, Pattern) or p.position != STMT:
        raise TypeError(f"{what}: expected a statement pattern (is_store, is_for, is_nest, is_seq, is_copy, wildcard), "
                        f"got {p!r}")
    return p


def loop_failure(loop) -> str | None:
    """Why a loop is not one a pattern matches (not from 0 in steps of 1), or None."""
    if is_canonical_loop(loop):
        return None
    return (f"loop {loop.loop_var.name} runs from {loop.min} in steps of {loop.step}; patterns match loops from 0 "
            f"in steps of 1 (canonical form)")


class StorePattern(StmtPattern):
    """A ``BufferStore``: ``buf[indices] = value``."""

    root_types = (tirx.BufferStore,)

    def __init__(self, buffer, indices, value, name=None):
        self.buffer = buffer_slot(buffer, "is_store")
        self.indices = index_list(indices, "is_store")
        self.value = expression(value, "is_store value")
        self.name = check_name(name, "is_store")
        self._collect_names((self.buffer, BUFFER), *((i, EXPRESSION) for i in self.indices or ()),
                            (self.value, EXPRESSION))

    def children(self):
        return (self.buffer,) + (self.indices or ()) + (self.value,)

    def _body_repr(self):
        idx = "..." if self.indices is None else ", ".join(map(repr, self.indices))
        return f"is_store({self.buffer!r}[{idx}], {self.value!r})"

    def compile(self, cc):
        access, value, fail = compile_access(cc, self), cc.compile(self.value, "value"), cc.failure(self)

        def match(node, b, nest, k):
            if type(node) is not tirx.BufferStore:
                return fail and fail(b, node, nest, f"expected a buffer store, found {type(node).__name__}")
            return access(node.buffer, node.indices, b, nest, lambda: value(node.value, b, nest, k))

        return match


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
    return expression(extent, f"{what} extent")


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

    >>> tp.loop(tp.is_var("i"), extent=16, kind="serial")
    loop(is_var('i'), extent=is_const(16), kind='serial')
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

    @property
    def folds_guards(self) -> bool:
        """True when the extent is matched as an expression (not a constant): then a loop
        whose body is guarded by upper bounds on its variable also matches, as the loop of
        the smaller extent (:func:`~tirpat.tir.region.guards_in_extents`)."""
        return self.extent is not None and not isinstance(self.extent, ConstPattern)

    def places(self) -> tuple:
        """``(pattern, what it stands for)`` of the variable and extent, for capture names."""
        return tuple((p, EXPRESSION) for p in (self.var, self.extent) if p is not None)

    def compile(self, cc, owner):
        """``spec(loop, b, nest, k)``: the loop's kind, variable and extent."""
        var = None if self.var is None else cc.compile(self.var, "var")
        extent = None if self.extent is None else cc.compile(self.extent, "extent")
        kind, fail = self.kind, cc.failure(owner)

        def spec(loop, b, nest, k):
            if kind is not None and int(loop.kind) != kind:
                return fail and fail(b, loop, nest, f"expected a loop of kind {kind}, found kind {int(loop.kind)}",
                                     (f"loop {loop.loop_var.name}",))
            if var is None:
                return extent(loop.extent, b, nest, k) if extent is not None else k()
            if extent is None:
                return var(loop.loop_var, b, nest, k)
            return var(loop.loop_var, b, nest, lambda: extent(loop.extent, b, nest, k))

        return spec


class ForPattern(StmtPattern):
    """A single ``For`` loop with a body pattern."""

    root_types = (tirx.For,)

    def __init__(self, body, var=None, extent=None, kind=None, name=None):
        self.body = statement(body, "is_for body")
        self.spec = LoopSpec(var, extent, kind)
        self.name = check_name(name, "is_for")
        self._collect_names(*self.spec.places(), (self.body, STATEMENT))

    def children(self):
        return tuple(p for p in (self.spec.var, self.spec.extent, self.body) if p is not None)

    def _body_repr(self):
        return f"is_for({self.body!r}, {self.spec!r})"

    def compile(self, cc):
        spec, body, fail = self.spec.compile(cc, self), cc.compile(self.body, "body"), cc.failure(self)
        fold = self.spec.folds_guards

        def plain(node, b, nest, k):
            b.push(b.loops, node)
            inner = nest + (node.loop_var,)
            return spec(node, b, nest, lambda: body(node.body, b, inner, k))

        def match(node, b, nest, k):
            if type(node) is not tirx.For:
                return fail and fail(b, node, nest, f"expected a for loop, found {type(node).__name__}")
            if not is_canonical_loop(node):
                return fail and fail(b, node, nest, loop_failure(node))
            if not fold:
                return plain(node, b, nest, k)
            mark = b.mark()
            if plain(node, b, nest, k):
                return True
            b.undo(mark)
            folded = guards_in_extents(node, (0,), b.context + tuple(b.loops))
            return folded is not None and plain(folded, b, nest, k)

        return match


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
        self.body = statement(body, "is_nest body")
        self.name = check_name(name, "is_nest")
        self._collect_names(*(place for s in self.specs or () for place in s.places()), (self.body, STATEMENT))

    def children(self):
        out = []
        for s in self.specs or ():
            out += [p for p in (s.var, s.extent) if p is not None]
        return tuple(out) + (self.body,)

    def _body_repr(self):
        loops = "None" if self.depth is None else (
            str(self.depth) if self.specs is None else f"[{', '.join(map(repr, self.specs))}]")
        return f"is_nest({loops}, {self.body!r})"

    def compile(self, cc):
        depth, fail = self.depth, cc.failure(self)
        specs = None if self.specs is None else [s.compile(cc, self) for s in self.specs]
        folding = tuple(n for n, s in enumerate(self.specs or ()) if s.folds_guards)
        body = cc.compile(self.body, "body")

        def plain(node, b, nest, k):
            chain = []
            cur = node
            while type(cur) is tirx.For and is_canonical_loop(cur) and (depth is None or len(chain) < depth):
                chain.append(cur)
                cur = cur.body
            if not chain:
                why = loop_failure(node) if type(node) is tirx.For else None
                return fail and fail(b, node, nest, why or f"expected a loop nest, found {type(node).__name__}")
            if depth is not None and len(chain) < depth:
                why = loop_failure(cur) if type(cur) is tirx.For else None
                return fail and fail(b, cur, nest, f"expected a perfect nest of {depth} loops, found {len(chain)} "
                                                   f"({', '.join(l.loop_var.name for l in chain)}) then "
                                                   + (why or f"a {type(cur).__name__}"))
            for n in range(len(chain), 0, -1) if depth is None else (depth,):
                loops = chain[:n]
                mark = b.mark()
                for loop in loops:
                    b.push(b.loops, loop)
                inner = nest + tuple(l.loop_var for l in loops)

                def at(j, loops=loops, inner=inner):
                    if specs is None or j == len(loops):
                        return body(loops[-1].body, b, inner, k)
                    return specs[j](loops[j], b, nest, lambda: at(j + 1))

                if at(0):
                    return True
                b.undo(mark)
            return False

        def match(node, b, nest, k):
            mark = b.mark()
            if plain(node, b, nest, k):
                return True
            if type(node) is not tirx.For:
                return False
            b.undo(mark)
            folded = guards_in_extents(node, folding, b.context + tuple(b.loops))
            return folded is not None and plain(folded, b, nest, k)

        return match if folding else plain


class SeqPattern(StmtPattern):
    """A contiguous run of statements inside a ``SeqStmt`` (or a single statement)."""

    root_types = (tirx.SeqStmt,)

    def __init__(self, stmts, name=None):
        if not stmts:
            raise ValueError("is_seq needs at least one statement pattern")
        self.stmts = tuple(statement(s, "is_seq") for s in stmts)
        self.name = check_name(name, "is_seq")
        self._collect_names(*((s, STATEMENT) for s in self.stmts))

    def children(self):
        return self.stmts

    def _body_repr(self):
        return f"is_seq({', '.join(map(repr, self.stmts))})"

    def compile(self, cc):
        # At the root a run inside a longer sequence matches (the rewriter splices it);
        # nested, the run must be the whole body, or a rewrite would drop statements.
        root, fail = cc.root, cc.failure(self)
        parts = [cc.compile(s, f"stmt {n}") for n, s in enumerate(self.stmts)]
        n = len(parts)

        def match(node, b, nest, k):
            stmts = list(node.seq) if type(node) is tirx.SeqStmt else [node]
            if len(stmts) < n or (not root and len(stmts) != n):
                return fail and fail(b, node, nest, f"expected a sequence of {n} statements, found {len(stmts)}")
            for start in range(len(stmts) - n + 1):
                def at(j, start=start):
                    if j < n:
                        return parts[j](stmts[start + j], b, nest, lambda: at(j + 1))
                    if root:
                        b.push(b.spans, (start, start + n))
                    return k()

                mark = b.mark()
                if at(0):
                    return True
                b.undo(mark)
            return False

        return match


class IfPattern(StmtPattern):
    """An ``IfThenElse`` statement."""

    root_types = (tirx.IfThenElse,)

    def __init__(self, cond, then_case, else_case=None, name=None):
        self.cond = expression(cond, "is_if condition")
        self.then_case = statement(then_case, "is_if then")
        self.else_case = None if else_case is None else statement(else_case, "is_if else")
        self.name = check_name(name, "is_if")
        self._collect_names((self.cond, EXPRESSION), (self.then_case, STATEMENT), (self.else_case, STATEMENT))

    def children(self):
        return tuple(p for p in (self.cond, self.then_case, self.else_case) if p is not None)

    def _body_repr(self):
        extra = "" if self.else_case is None else f", {self.else_case!r}"
        return f"is_if({self.cond!r}, {self.then_case!r}{extra})"

    def compile(self, cc):
        cond, then = cc.compile(self.cond, "condition"), cc.compile(self.then_case, "then")
        other = None if self.else_case is None else cc.compile(self.else_case, "else")
        fail = cc.failure(self)

        def match(node, b, nest, k):
            if type(node) is not tirx.IfThenElse:
                return fail and fail(b, node, nest, f"expected an if statement, found {type(node).__name__}")
            if (other is None) != (node.else_case is None):
                return fail and fail(b, node, nest, "expected an if " + ("without" if other is None else "with")
                                     + " an else branch")
            if other is None:
                return cond(node.condition, b, nest, lambda: then(node.then_case, b, nest, k))
            return cond(node.condition, b, nest, lambda: then(node.then_case, b, nest,
                                                             lambda: other(node.else_case, b, nest, k)))

        return match


# ---------------------------------------------------------------------------------------
# constructors: the public API
# ---------------------------------------------------------------------------------------
def is_store(buf: Pattern, indices: Sequence[Pattern] | None, value: Pattern) -> Pattern:
    """A buffer store ``buf[indices] = value``; ``indices=None`` takes any indices.

    >>> tp.is_store(tp.is_buffer("C"), [tp.is_var("i")], tp.is_const(0))
    is_store(is_buffer('C')[is_var('i')], is_const(0))
    """
    return StorePattern(buf, indices, value)


def is_for(body: Pattern, *, var: Pattern | None = None, extent: int | Pattern | None = None,
           kind: str | int | None = None) -> Pattern:
    """One ``For`` loop.

    >>> tp.is_for(tp.wildcard(), extent=16, kind="serial")
    is_for(wildcard(), loop(extent=is_const(16), kind='serial'))
    """
    return ForPattern(body, var, extent, kind)


def loop(var: Pattern | None = None, *, extent: int | Pattern | None = None,
         kind: str | int | None = None) -> LoopSpec:
    """A loop spec for ``is_nest``.

    >>> tp.loop(tp.is_var("i"), extent=16)
    loop(is_var('i'), extent=is_const(16))
    """
    return LoopSpec(var, extent, kind)


def is_nest(loops: int | None | Sequence, body: Pattern) -> Pattern:
    """A perfect nest of loops, counted from the matched ``For`` downwards.

    ``loops`` is a list of ``tp.loop``/var patterns, a depth, or None for any depth >= 1.
    Lowering removes extent-1 loops, so a fixed depth misses a 1xN shape that ``None``
    matches.

    >>> i, j = tp.is_var("i"), tp.is_var("j")
    >>> tp.is_nest([i, j], tp.wildcard())
    is_nest([loop(is_var('i')), loop(is_var('j'))], wildcard())
    >>> tp.is_nest(None, tp.is_store(tp.is_buffer("C"), None, tp.is_const(0)))
    is_nest(None, is_store(is_buffer('C')[...], is_const(0)))
    """
    return NestPattern(loops, body)


def is_seq(*stmts: Pattern) -> Pattern:
    """A contiguous run of statements in a ``SeqStmt``.

    >>> tp.is_seq(tp.wildcard("init"), tp.wildcard("update"))
    is_seq(wildcard('init'), wildcard('update'))
    """
    return SeqPattern(stmts)


def is_if(cond: Pattern, then_case: Pattern, else_case: Pattern | None = None) -> Pattern:
    """An ``if`` statement.

    >>> tp.is_if(tp.wildcard(), tp.is_store(tp.is_buffer("C"), None, tp.is_const(0)))
    is_if(wildcard(), is_store(is_buffer('C')[...], is_const(0)))
    """
    return IfPattern(cond, then_case, else_case)

