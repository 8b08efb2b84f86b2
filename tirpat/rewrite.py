"""Rewriting: replace every match of a rule with vendor code.

A :class:`Rewriter` is an ordered list of rules, each a ``(pattern, callback)`` pair,
indexed by the node kinds their pattern's root can match, so that each IR node only tries
the rules that could possibly match it. Rewriting is one pre-order pass: an outer match
wins, and a replacement is never re-scanned.

>>> def to_call(m):
...     c = m["c"]
...     return tvm.tirx.Evaluate(tvm.tirx.call_packed("my.dma", c.dst.buffer, c.src.buffer))
>>> rw = tp.Rewriter.from_pattern(tp.is_copy(name="c"), to_call, name="dma")
>>> new_func = rw(func)                 # doctest: +SKIP
>>> rw.report.counts                    # doctest: +SKIP
{'dma': 2}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import tvm
import tvm_ffi
from tvm import ir, tirx

from . import pattern as P
from .analysis import defined_vars, dtype_of, fresh_var, key, rename_defs, vars_used
from .canonical import canonicalize
from .match import Match, _Matcher


@tvm_ffi.register_error
class RewriteError(Exception):
    """A rule produced an ill-formed replacement; the message names the rule and the site."""


@dataclass
class Rule:
    """One rewrite rule: a pattern, what to do with its matches, and a name for reports."""

    pattern: P.Pattern
    callback: Callable[[Match], Any]
    name: str
    #: the callback returns new definitions on every call (no renaming needed per site)
    fresh_defs: bool = False

    def __repr__(self):
        return f"Rule({self.name!r}, {self.pattern!r})"


@dataclass
class Site:
    """Where a rule fired: the rule, the enclosing loops, and the matched node (before)."""

    rule: str
    loops: tuple
    node: Any
    func: str | None = None

    def __repr__(self):
        where = f"{self.func}: " if self.func else ""
        loops = " > ".join(self.loops) or "<top>"
        return f"<{self.rule} at {where}{loops}: {type(self.node).__name__}>"


@dataclass
class Report:
    """What the last rewriting call did: ``counts`` per rule and every ``site``.

    >>> rw(func); rw.report.counts, rw.report.sites[0]      # doctest: +SKIP
    """

    counts: dict = field(default_factory=dict)
    sites: list = field(default_factory=list)

    def add(self, site: Site):
        self.counts[site.rule] = self.counts.get(site.rule, 0) + 1
        self.sites.append(site)

    def __str__(self):
        lines = [f"{n:6d}  {rule}" for rule, n in self.counts.items()] or ["  (no rule fired)"]
        return "rewrites per rule:\n" + "\n".join(lines)


class Rewriter:
    """An ordered set of rules applied to PrimFuncs, IRModules or statements.

    >>> rw = tp.Rewriter.from_pattern(pattern, callback) | other_rewriter   # doctest: +SKIP
    >>> mod = rw(mod); print(rw.report)                                      # doctest: +SKIP
    """

    def __init__(self, rules):
        self.rules = tuple(rules)
        for r in self.rules:
            if not isinstance(r, Rule):
                raise TypeError(f"Rewriter takes Rule objects, got {r!r}")
        self.report = Report()
        self._by_type: dict = {}
        self._has_expr_rules = any(r.pattern.position == P.EXPR for r in self.rules)

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_pattern(cls, pattern: P.Pattern, callback: Callable[[Match], Any], name: str | None = None) -> "Rewriter":
        """A one-rule rewriter: ``callback(match)`` returns the replacement (a Stmt, a list of
        Stmts, or a PrimExpr for an expression pattern), or None to decline.

        >>> rw = tp.Rewriter.from_pattern(tp.is_copy(name="c"), lambda m: None, name="noop")
        """
        if not isinstance(pattern, P.Pattern):
            raise TypeError(f"from_pattern: expected a tirpat pattern, got {type(pattern).__name__} {pattern!r}")
        if not callable(callback):
            raise TypeError(f"from_pattern: the callback must be callable, got {callback!r}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"from_pattern: name must be a string, got {name!r}")
        return cls([Rule(pattern, callback, name or getattr(callback, "__name__", None) or repr(pattern))])

    @classmethod
    def from_module(cls, mod, name: str | None = None) -> "Rewriter":
        """A rule from an IRModule holding PrimFuncs ``pattern`` and ``replacement``.

        See :mod:`tirpat.module_rule` for the binding rules (TVM's ``match_buffer``).
        """
        from .module_rule import module_rule

        return cls([module_rule(mod, name)])

    def __or__(self, other: "Rewriter") -> "Rewriter":
        if not isinstance(other, Rewriter):
            raise TypeError(f"| combines two Rewriters, got {type(other).__name__}")
        return Rewriter(self.rules + other.rules)

    def __repr__(self):
        return f"Rewriter([{', '.join(r.name for r in self.rules)}])"

    def _rules_for(self, node_type) -> tuple:
        rules = self._by_type.get(node_type)
        if rules is None:
            is_stmt = issubclass(node_type, tirx.Stmt)
            rules = tuple(
                r for r in self.rules
                if (r.pattern.root_types is None and (r.pattern.position == P.STMT) == is_stmt
                    or isinstance(r.pattern, P.Wildcard))
                or (r.pattern.root_types is not None and issubclass(node_type, r.pattern.root_types))
            )
            self._by_type[node_type] = rules
        return rules

    # -- application -------------------------------------------------------------------
    def __call__(self, obj):
        """Rewrite a PrimFunc, an IRModule or a Stmt; returns the same kind. Input untouched."""
        self.report = Report()
        if isinstance(obj, ir.IRModule):
            return self._rewrite_module(obj)
        if isinstance(obj, tirx.PrimFunc):
            return self._rewrite_func(obj, _func_name(obj))
        if isinstance(obj, tirx.Stmt):
            return self._scan(obj)
        raise TypeError(f"a Rewriter applies to a PrimFunc, an IRModule or a Stmt, got {type(obj).__name__}")

    def _rewrite_func(self, func, fname):
        before = len(self.report.sites)
        body = self._scan(func.body, func_name=fname, params=func.params)
        if len(self.report.sites) == before:
            return func
        new = func.with_body(body)
        ok, detail = True, ""
        try:
            tirx.analysis.verify_well_formed(new, assert_mode=True)
        except Exception as err:  # noqa: BLE001 - the verifier reports through exceptions
            ok, detail = False, ": " + str(err).strip().splitlines()[-1]
        if not ok:
            fired = sorted({s.rule for s in self.report.sites[before:]})
            raise RewriteError(f"rewriting {fname} with rule(s) {fired} produced ill-formed TIR {detail}".rstrip())
        return new

    def as_pass(self, name: str = "tirpat.Rewrite") -> tvm.transform.Pass:
        """This rewriter as a ``tvm.transform.Pass`` over the PrimFuncs of a module;
        ``rw.report`` then describes the last module it ran on.

        >>> mod = rw.as_pass()(mod)                 # doctest: +SKIP
        """
        @tvm.transform.module_pass(opt_level=0, name=name)
        def transform(mod, ctx):
            self.report = Report()
            return self._rewrite_module(mod)

        return transform

    def _rewrite_module(self, mod):
        funcs = {gv: self._rewrite_func(f, gv.name_hint) if isinstance(f, tirx.PrimFunc) else f
                 for gv, f in mod.functions.items()}
        return ir.IRModule(funcs, attrs=mod.attrs)

    # -- the single pre-order pass -----------------------------------------------------
    def _scan(self, root, func_name=None, stop_at_match=False, params=()):
        if isinstance(root, tirx.PrimFunc):
            func_name, params = _func_name(root), root.params
            root = root.body
        if not isinstance(root, (tirx.Stmt, ir.Expr)):
            raise TypeError(f"expected a PrimFunc or a Stmt, got {type(root).__name__}")
        root = canonicalize(root)
        loops: list = []
        # Variables in scope somewhere in the function, for checking replacements: only
        # needed once a rule fires, so a scan that rewrites nothing does not walk for it.
        defined: set = set()

        def try_rules(node, mut):
            for rule in self._rules_for(type(node)):
                m = _Matcher(tuple(loops)).run(rule.pattern, node)
                if m is None:
                    continue
                try:
                    result = rule.callback(m)
                except Exception as err:  # noqa: BLE001 - re-raised with where it happened
                    err.add_note(f"in the callback of rule {rule.name!r} at "
                                 f"{' > '.join(l.loop_var.name for l in loops) or '<top>'} ({type(node).__name__})")
                    raise
                if isinstance(result, (list, tuple)) and result and all(isinstance(s, tirx.Stmt) for s in result):
                    result = result[0] if len(result) == 1 else tirx.SeqStmt(list(result))
                if stop_at_match:
                    self.report.add(Site(rule.name, tuple(l.loop_var.name for l in loops), node, func_name))
                    return node
                if result is None:
                    continue
                if not defined:
                    defined.update(key(v) for v in vars_used(root))
                    defined.update(key(v) for v in params)
                result = self._check(rule, node, m, result, loops, defined)
                self.report.add(Site(rule.name, tuple(l.loop_var.name for l in loops), node, func_name))
                if m.span is not None and isinstance(node, tirx.SeqStmt):
                    start, stop = m.span
                    head = [mut.mutate(s) for s in node.seq[:start]]
                    tail = list(node.seq[stop:])
                    if tail:
                        rest = mut.mutate(tail[0] if len(tail) == 1 else tirx.SeqStmt(tail))
                        tail = list(rest.seq) if isinstance(rest, tirx.SeqStmt) else [rest]
                    items = head + [result] + tail
                    return items[0] if len(items) == 1 else tirx.SeqStmt(items)
                return result
            return None

        # An exception must not cross the FFI boundary of structural_mutate: it would come
        # back as a RuntimeError. Keep the first one and raise it once the walk returns.
        failure: list = []

        def guarded(node, mut):
            if failure:
                return None
            try:
                return try_rules(node, mut)
            except Exception as err:  # noqa: BLE001 - re-raised unchanged below
                failure.append(err)
                return None

        def on_stmt(node, mut):
            if failure or isinstance(node, (tirx.AllocBuffer, tirx.DeclBuffer)):
                return node
            replaced = guarded(node, mut)
            if replaced is not None:
                return replaced
            if isinstance(node, tirx.For):
                loops.append(node)
                try:
                    return mut.default_mutate(node)
                finally:
                    loops.pop()
            return mut.default_mutate(node)

        def on_expr(node, mut):
            if failure or isinstance(node, ir.Var):
                return node
            replaced = guarded(node, mut)
            return replaced if replaced is not None else mut.default_mutate(node)

        callbacks = [(tirx.Stmt, on_stmt), (ir.Type, lambda node, mut: node)]
        if self._has_expr_rules:
            callbacks.append((ir.Expr, on_expr))
        else:
            callbacks.append((ir.Expr, lambda node, mut: node))
        result = tvm_ffi.structural_mutate(root, callbacks)
        if failure:
            raise failure[0]
        return result

    def _check(self, rule, node, m, result, loops, defined):
        site = f"{' > '.join(l.loop_var.name for l in loops) or '<top>'} ({type(node).__name__})"
        if isinstance(node, tirx.Stmt):
            if not isinstance(result, tirx.Stmt):
                raise RewriteError(f"rule {rule.name!r} matched a statement at {site} but its callback "
                                   f"returned {type(result).__name__} {result!r}; expected a tirx.Stmt")
        else:
            if not isinstance(result, ir.Expr) or isinstance(result, tirx.Stmt) or tirx.is_buffer_var(result):
                raise RewriteError(f"rule {rule.name!r} matched an expression at {site} but its callback "
                                   f"returned {type(result).__name__} {result!r}; expected a PrimExpr")
            if dtype_of(result) != dtype_of(node):
                raise RewriteError(f"rule {rule.name!r} at {site} replaced a {dtype_of(node)} expression "
                                   f"with a {dtype_of(result)} one")
        # Every inserted copy gets its own variables, so one replacement can be used twice.
        own = defined_vars(result)
        if own and not rule.fresh_defs:
            result = rename_defs(result, {key(v): fresh_var(v) for v in own})
            own = defined_vars(result)
        own_keys = {key(v) for v in own}
        local = {key(v) for v in defined_vars(node)} if isinstance(node, tirx.Stmt) else set()
        for v in vars_used(result):
            k = key(v)
            if (k not in defined or k in local) and k not in own_keys:
                raise RewriteError(f"rule {rule.name!r} at {site} returned a replacement that uses "
                                   f"{v.name!r}, which is not defined at that site")
        return result


def _func_name(func) -> str | None:
    attrs = func.attrs
    if attrs is not None and "global_symbol" in attrs:
        return str(attrs["global_symbol"])
    return None
