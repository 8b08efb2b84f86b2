"""Why a pattern does not match: the path to the first mismatching node, expected vs found;
and, for a rewriter, where its rules fired and which sites their callbacks declined, why.

>>> A = tvm.te.placeholder((8,), "float32", name="A")
>>> func = tp.lower(tvm.te.create_prim_func([A, tvm.te.compute((8,), lambda i: A[i] * 2.0, name="B")]))
>>> print(tp.explain(tp.is_copy(), func))
no match in main; nearest misses:
  1. at <top> (For i):
     path: for i > body
     expected the stored value to be a buffer load (optionally cast or padded), found A[i] * T.float32(2.0)
  2. at for i (B[i] = A[i] * T.float32(2.0)):
     path: body
     expected the stored value to be a buffer load (optionally cast or padded), found A[i] * T.float32(2.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm_ffi
from tvm import ir, tirx

from . import engine
from .analysis import has_blocks, is_tir
from .canonical import canonicalize
from .match import find_all
from .pattern import STMT, Pattern
from .region import Aliases
from .rewrite import Rewriter


@dataclass
class Miss:
    """One site where the pattern came close: its enclosing loops, the failure and, when a
    Rewriter is explained, the name of the rule whose pattern it is."""

    loops: tuple
    node: object
    failure: engine.Failure
    rule: str | None = None

    def __str__(self):
        return self._text("     ")

    def _text(self, indent: str) -> str:
        where = " > ".join(f"for {n}" for n in self.loops) or "<top>"
        path = " > ".join(self.failure.path) or "<root>"
        return f"at {where} ({_head(self.node)}):\n{indent}path: {path}\n{indent}{self.failure.reason}"

    @property
    def key(self) -> tuple:
        """What a person reads of this miss (its rule aside): two misses with one key are one."""
        return self.loops, _head(self.node), self.failure.path, self.failure.reason


@dataclass
class Explanation:
    """The result of :func:`explain`; ``str()`` is meant to be read by a person.

    ``matches`` lists the matches (empty when nothing matched); ``misses`` the nearest
    misses, deepest first. For a rewriter, ``misses`` holds each rule's nearest misses
    (:attr:`Miss.rule` names it), rule by rule, the rule whose pattern got deepest first;
    ``sites`` are where its rules fired and ``declined`` the sites their callbacks declined
    (:class:`~tirpat.tir.scan.Declined`).
    """

    pattern: object
    target: str
    matches: list = field(default_factory=list)
    misses: list = field(default_factory=list)
    label: str | None = None      #: what is explained, when not a single pattern (a Rewriter's rules)
    hint: str | None = None       #: a likely cause worth saying first
    sites: list | None = None     #: for a rewriter: where its rules fired
    declined: list = field(default_factory=list)

    @property
    def matched(self) -> bool:
        return bool(self.matches)

    def __bool__(self):
        return self.matched

    def __str__(self):
        text = self._text() if self.sites is None else self._rewriter_text()
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
        if len(self.misses) == 1 and not self.misses[0].loops and self.target == "the node" \
                and self.misses[0].rule is None:
            f = self.misses[0].failure
            path = " > ".join(f.path) or "<root>"
            return f"no match: at {path}: {f.reason}"
        if self.misses[0].rule is None:
            lines = [f"no match in {self.target}; nearest misses:"]
            lines += [f"  {n + 1}. {miss}" for n, miss in enumerate(self.misses)]
            return "\n".join(lines)
        lines = [f"no match in {self.target}; nearest misses of each rule, the rule that got furthest first:"]
        for rules, misses in _by_rule(self.misses):
            lines.append(("  rule " if len(rules) == 1 else "  rules ") + ", ".join(map(repr, rules)) + ":")
            lines += [f"    {n + 1}. {miss._text('       ')}" for n, miss in enumerate(misses)]
        return "\n".join(lines)

    def _rewriter_text(self):
        lines = []
        if self.sites:
            lines.append(f"{self.label} rewrite {self.target} at {len(self.sites)} site(s):")
            lines += [f"  {n + 1}. {s!r}" for n, s in enumerate(self.sites)]
        elif self.declined:
            lines.append(f"{self.label} rewrite nothing in {self.target}: every match was declined")
        if self.declined:
            lines.append(f"declined at {len(self.declined)} site(s):")
            lines += [f"  {n + 1}. {d}" for n, d in enumerate(self.declined)]
        if not self.sites and not self.declined:
            lines.append(self._text())
        return "\n".join(lines)

    __repr__ = __str__


def _head(node) -> str:
    if isinstance(node, tirx.For):
        return f"For {node.loop_var.name}"
    text = str(node).strip().splitlines()
    return text[-1].strip() if text else type(node).__name__


def _kinds(p) -> str:
    if p.root_types is None:
        return "any " + ("statement" if p.position == STMT else "expression")
    return ", ".join(t.__name__ for t in p.root_types)


def _nearest(misses, limit: int) -> list:
    """The ``limit`` deepest of ``misses``, each told once (ties keep their order)."""
    seen, out = set(), []
    for miss in sorted(misses, key=lambda m: m.failure.depth, reverse=True):
        if miss.key not in seen:
            seen.add(miss.key)
            out.append(miss)
    return out[:limit]


def _by_rule(misses) -> list:
    """``[(rule names, their misses)]`` in the order of ``misses``; rules whose misses read
    the same (as when several copy rules all refuse one computation) share one entry."""
    groups: dict = {}
    for miss in misses:
        groups.setdefault(miss.rule, []).append(miss)
    merged: dict = {}
    for rule, group in groups.items():
        merged.setdefault(tuple(m.key for m in group), ([], group))[0].append(rule)
    return list(merged.values())


def _merge(parts, into: Explanation, limit: int) -> Explanation:
    for part in parts:
        into.matches += part.matches
        into.misses += part.misses
        into.hint = into.hint or part.hint
    into.misses = _nearest(into.misses, limit)
    return into


def _refuse(node_or_func) -> TypeError:
    kind = f"{type(node_or_func).__module__}.{type(node_or_func).__name__}"
    advice = ""
    if kind.startswith("tvm.te"):
        advice = ": a TE tensor describes a computation; build its function with te.create_prim_func([...]) " \
                 "and tp.lower it"
    elif kind.startswith("tvm.relax") or type(getattr(node_or_func, "ty", None)).__module__.startswith("tvm.relax"):
        advice = ": a Relax program; its operators become PrimFuncs with relax.transform.LegalizeOps()"
    return TypeError(f"explain looks in a PrimFunc, an IRModule of PrimFuncs, a Stmt or a PrimExpr, got {kind}{advice}")


def explain(pattern, node_or_func, *, limit: int = 3) -> Explanation:
    """Explain why ``pattern`` (or a Rewriter's rules) does (not) match a node, a PrimFunc
    or an IRModule.

    On a node: the deepest mismatch. On a function with no match: the ``limit`` nearest
    misses (the candidates where matching got deepest), each told once. For a Rewriter, each
    rule's ``limit`` nearest misses under its name (rules whose misses read the same share
    one entry), the rule that got deepest first; on a function or a statement, also where
    its rules fire and which sites their callbacks decline, and why (the rules run on a
    copy; the input is not changed).

    >>> print(tp.explain(tp.is_const(1), tvm.tirx.IntImm("int32", 2)))
    no match: at <root>: expected the constant 1, found 2
    """
    if isinstance(pattern, Rewriter):
        return _explain_rewriter(pattern, node_or_func, limit)
    if not isinstance(pattern, Pattern):
        raise TypeError(f"explain expects a tirpat pattern first, got {type(pattern).__name__} {pattern!r}")
    if isinstance(node_or_func, ir.IRModule):
        funcs = [f for f in node_or_func.functions.values() if isinstance(f, tirx.PrimFunc)]
        if not funcs:
            others = ", ".join(gv.name_hint for gv in node_or_func.functions)
            raise TypeError(f"explain: the module has no PrimFunc, only {others or 'nothing'} (a Relax module: its "
                            f"operators become PrimFuncs with relax.transform.LegalizeOps())")
        return _merge([explain(pattern, f, limit=limit) for f in funcs], Explanation(pattern, "the module"), limit)
    if isinstance(node_or_func, tirx.PrimFunc):
        attrs = node_or_func.attrs
        name = str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "the function"
        if has_blocks(node_or_func.body):
            out = Explanation(pattern, name, hint="the function still has T.sblock blocks; patterns match lowered "
                                                  "TIR: tp.lower(func) first")
            out.misses = _nearest_misses(pattern, canonicalize(node_or_func.body), limit)
            return out
        found = find_all(pattern, node_or_func)
        out = Explanation(pattern, name, matches=found)
        if not found:
            out.misses = _nearest_misses(pattern, canonicalize(node_or_func.body), limit)
        return out
    if not is_tir(node_or_func):
        raise _refuse(node_or_func)
    node = canonicalize(node_or_func)
    trace = engine.Trace()
    m = engine.first_match(engine.compiled(pattern, trace=True), node, trace=trace)
    out = Explanation(pattern, "the node")
    if m is not None:
        out.matches = [m]
    elif trace.deepest is not None:
        out.misses = [Miss((), node, trace.deepest)]
    return out


def _explain_rewriter(rw: Rewriter, target, limit: int) -> Explanation:
    # Each rule keeps its own nearest misses: a rule that fails early on every site (a copy
    # rule on a computation) must not push out the one rule the site was written for.
    parts = [explain(rule.pattern, target, limit=limit) for rule in rw.rules]
    label = "rule" + ("s " if len(rw.rules) > 1 else " ") + ", ".join(repr(r.name) for r in rw.rules)
    out = Explanation(rw, parts[0].target, label=label)
    for rule, part in zip(rw.rules, parts):
        out.matches += part.matches
        out.hint = out.hint or part.hint
        part.misses = [Miss(m.loops, m.node, m.failure, rule.name) for m in part.misses]
    ranked = sorted((p for p in parts if p.misses), key=lambda p: p.misses[0].failure.depth, reverse=True)
    out.misses = [miss for part in ranked for miss in part.misses]
    if isinstance(target, (tirx.PrimFunc, ir.IRModule, tirx.Stmt)) and out.hint is None:
        report = rw.rewrite(target, record=False).report
        out.sites, out.declined = list(report.sites), list(report.declined)
    return out


def _nearest_misses(pattern, body, limit):
    misses = []
    loops = []
    aliases = Aliases()
    roots = pattern.root_types
    matcher = engine.compiled(pattern, trace=True)

    def consider(node):
        if roots is not None and not isinstance(node, roots):
            return
        if roots is None and (pattern.position == STMT) != isinstance(node, tirx.Stmt):
            return
        trace = engine.Trace()
        if engine.first_match(matcher, node, tuple(loops), aliases, trace=trace) is None and trace.deepest:
            misses.append(Miss(tuple(l.loop_var.name for l in loops), node, trace.deepest))

    def on_stmt(node, v):
        if isinstance(node, tirx.DeclBuffer):
            aliases.declare(node)
            return
        consider(node)
        if isinstance(node, tirx.For):
            loops.append(node)
            v.default_visit(node)
            loops.pop()
        elif not isinstance(node, tirx.AllocBuffer):
            v.default_visit(node)

    def on_expr(node, v):
        if not isinstance(node, ir.Var):
            consider(node)
            v.default_visit(node)

    callbacks = [(tirx.Stmt, on_stmt), (ir.Type, lambda node, v: None)]
    if pattern.position == STMT:
        callbacks.append((ir.Expr, lambda node, v: None))
    else:
        callbacks.append((ir.Expr, on_expr))
    tvm_ffi.structural_visit(body, callbacks)
    return _nearest(misses, limit)
