"""Why a pattern does not match: the path to the first mismatching node, expected vs found.

>>> print(tp.explain(pattern, func))        # doctest: +SKIP
no match in main; nearest misses:
  1. at for i_0 > for j_0 > for k_0 (For i_1):
     path: for i_1 > for j_1 > body > value > rhs > lhs
     expected a cast to int32, found a cast to int16
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm_ffi
from tvm import ir, tirx

from . import pattern as P
from .analysis import has_blocks
from .canonical import canonicalize
from .match import Failure, explain_failure, find_all


@dataclass
class Miss:
    """One site where the pattern came close: its enclosing loops and the failure."""

    loops: tuple
    node: object
    failure: Failure

    def __str__(self):
        where = " > ".join(f"for {n}" for n in self.loops) or "<top>"
        path = " > ".join(self.failure.path) or "<root>"
        head = _head(self.node)
        return f"at {where} ({head}):\n     path: {path}\n     {self.failure.reason}"


@dataclass
class Explanation:
    """The result of :func:`explain`; ``str()`` is meant to be read by a person.

    ``matches`` lists the matches (empty when nothing matched); ``misses`` the nearest
    misses, deepest first.
    """

    pattern: P.Pattern
    target: str
    matches: list = field(default_factory=list)
    misses: list = field(default_factory=list)
    label: str | None = None      #: what is explained, when not a single pattern (a Rewriter's rules)
    hint: str | None = None       #: a likely cause worth saying first

    @property
    def matched(self) -> bool:
        return bool(self.matches)

    def __bool__(self):
        return self.matched

    def __str__(self):
        text = self._text()
        return text if self.hint is None else f"{text}\nhint: {self.hint}"

    def _text(self):
        what = self.label or repr(self.pattern)
        if self.matches:
            lines = [f"{what} matches {self.target} {len(self.matches)} time(s):"]
            lines += [f"  {n + 1}. {m!r}" for n, m in enumerate(self.matches)]
            return "\n".join(lines)
        if not self.misses:
            return (f"no match in {self.target}: no node of a kind the pattern's root can match "
                    f"({_kinds(self.pattern)})")
        if len(self.misses) == 1 and not self.misses[0].loops and self.target == "the node":
            f = self.misses[0].failure
            path = " > ".join(f.path) or "<root>"
            return f"no match: at {path}: {f.reason}"
        lines = [f"no match in {self.target}; nearest misses:"]
        lines += [f"  {n + 1}. {miss}" for n, miss in enumerate(self.misses)]
        return "\n".join(lines)

    __repr__ = __str__


def _head(node) -> str:
    if isinstance(node, tirx.For):
        return f"For {node.loop_var.name}"
    text = str(node).strip().splitlines()
    return text[-1].strip() if text else type(node).__name__


def _kinds(p) -> str:
    if p.root_types is None:
        return "any " + ("statement" if p.position == P.STMT else "expression")
    return ", ".join(t.__name__ for t in p.root_types)


def explain(pattern: P.Pattern, node_or_func, *, limit: int = 3) -> Explanation:
    """Explain why ``pattern`` (or a Rewriter's rules) does (not) match a node, a PrimFunc
    or an IRModule.

    On a node: the deepest mismatch. On a function with no match: the ``limit`` nearest
    misses (the candidates where matching got deepest).

    >>> print(tp.explain(tp.is_const(1), tvm.tirx.IntImm("int32", 2)))
    no match: at <root>: expected the constant 1, found 2
    """
    from .rewrite import Rewriter

    if isinstance(pattern, Rewriter):
        parts = [explain(rule.pattern, node_or_func, limit=limit) for rule in pattern.rules]
        out = parts[0]
        for part in parts[1:]:
            out.matches += part.matches
            out.misses += part.misses
        out.misses = sorted(out.misses, key=lambda m: m.failure.depth, reverse=True)[:limit]
        out.label = "rule" + ("s " if len(pattern.rules) > 1 else " ") + ", ".join(repr(r.name) for r in pattern.rules)
        return out
    if not isinstance(pattern, P.Pattern):
        raise TypeError(f"explain expects a tirpat pattern first, got {type(pattern).__name__} {pattern!r}")
    if isinstance(node_or_func, ir.IRModule):
        funcs = [(gv.name_hint, f) for gv, f in node_or_func.functions.items() if isinstance(f, tirx.PrimFunc)]
        parts = [explain(pattern, f, limit=limit) for _, f in funcs]
        out = Explanation(pattern, "the module")
        for part in parts:
            out.matches += part.matches
            out.misses += part.misses
        out.misses = sorted(out.misses, key=lambda m: m.failure.depth, reverse=True)[:limit]
        return out
    if isinstance(node_or_func, tirx.PrimFunc):
        name = node_or_func.attrs["global_symbol"] if node_or_func.attrs and "global_symbol" in node_or_func.attrs else "the function"
        found = find_all(pattern, node_or_func)
        out = Explanation(pattern, str(name), matches=found)
        if not found:
            out.misses = _nearest_misses(pattern, canonicalize(node_or_func.body), limit)
            if has_blocks(node_or_func.body):
                out.hint = "the function still has T.sblock blocks; patterns match lowered TIR: tp.lower(func) first"
        return out
    if not isinstance(node_or_func, (tirx.Stmt, ir.Expr)):
        raise TypeError(f"explain expects a PrimFunc, an IRModule, a Stmt or a PrimExpr, got {type(node_or_func).__name__}")
    node = canonicalize(node_or_func)
    m, failure = explain_failure(pattern, node)
    out = Explanation(pattern, "the node")
    if m is not None:
        out.matches = [m]
    elif failure is not None:
        out.misses = [Miss((), node, failure)]
    return out


def _nearest_misses(pattern, body, limit):
    misses = []
    loops = []
    roots = pattern.root_types

    def consider(node):
        if roots is not None and not isinstance(node, roots):
            return
        if roots is None and (pattern.position == P.STMT) != isinstance(node, tirx.Stmt):
            return
        _, failure = explain_failure(pattern, node, tuple(loops))
        if failure is not None:
            misses.append(Miss(tuple(l.loop_var.name for l in loops), node, failure))

    def on_stmt(node, v):
        consider(node)
        if isinstance(node, tirx.For):
            loops.append(node)
            v.default_visit(node)
            loops.pop()
        elif not isinstance(node, (tirx.AllocBuffer, tirx.DeclBuffer)):
            v.default_visit(node)

    def on_expr(node, v):
        if not isinstance(node, ir.Var):
            consider(node)
            v.default_visit(node)

    callbacks = [(tirx.Stmt, on_stmt), (ir.Type, lambda node, v: None)]
    if pattern.position == P.EXPR:
        callbacks.append((ir.Expr, on_expr))
    else:
        callbacks.append((ir.Expr, lambda node, v: None))
    tvm_ffi.structural_visit(body, callbacks)
    misses.sort(key=lambda m: m.failure.depth, reverse=True)
    return misses[:limit]
