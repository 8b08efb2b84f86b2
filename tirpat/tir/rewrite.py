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

import warnings

from dataclasses import dataclass, field
from typing import Any, Callable

import tvm
import tvm_ffi
from tvm import ir, tirx

from . import pattern as P
from .analysis import defined_vars, dtype_of, fresh_var, key, rename_defs, vars_used, with_children
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
    #: ``matcher(node, context, canonical) -> Match | None`` for a rule that matches raw
    #: (uncanonicalised) TIR and canonicalises only the candidates it needs to; when every
    #: rule of a Rewriter has one, a scan skips canonicalising the whole function
    matcher: Callable | None = None
    #: the rule guarantees well-formed replacements (checked when it was built and per
    #: site by its matcher), so the per-site scope checks and verify_well_formed are skipped
    self_checked: bool = False
    #: ``finish(body) -> body``, run once on a function's (or statement's) rewritten body
    #: when the rule fired in it: work that needs the whole function, not the site (merging
    #: the thread launches a replacement brings in with its kernel's)
    finish: Callable | None = None

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
        for n, earlier in enumerate(self.rules):
            shadows = getattr(earlier.pattern, "shadows", None)
            for later in self.rules[n + 1:] if shadows else ():
                if shadows(later.pattern):
                    warnings.warn(f"rule {later.name!r} never fires: rule {earlier.name!r} comes first and has the "
                                  f"same pattern (give {earlier.name!r} a where= predicate to choose its sites)",
                                  stacklevel=3)
        self.report = Report()
        self._by_type: dict = {}
        self._has_expr_rules = any(r.pattern.position == P.EXPR for r in self.rules)
        self._raw = all(r.matcher is not None for r in self.rules)
        self._unchecked_fired = False  # set by a scan in which a rule without self_checked fired

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
    def from_module(cls, mod, name: str | None = None, *, where: Callable[[Match], bool] | None = None) -> "Rewriter":
        """A rule from an IRModule holding PrimFuncs ``pattern`` and ``replacement``.

        See :mod:`tirpat.tir.module_rule` for the binding rules (TVM's ``match_buffer``).
        ``where(m)`` chooses among the sites the pattern matches: in ``m``, each parameter's
        name gives what it is bound to (``m["A"]``, the target buffer; ``m["s"]``, the
        expression). Needed where two intrinsics share a desc (TVM's ldmatrix A and B loads).

        >>> rw = tp.Rewriter.from_module(mod, "ld_b", where=lambda m: m["A"].name.startswith("B"))  # doctest: +SKIP
        """
        from .module_rule import module_rule

        return cls([module_rule(mod, name, where)])

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
        # The same PrimFunc with the new body. (PrimFunc's constructor, and so with_body,
        # makes a pass over the whole body: that alone would make rewriting quadratic-ish.)
        new = with_children(func, {key(func.body): body})
        if not self._unchecked_fired:
            return new
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
        if not self._raw:
            root = canonicalize(root)
        self._unchecked_fired = False
        sites = _Sites(self, root, func_name, params, stop_at_match)
        result = sites.mutate(root) if self._has_expr_rules else sites.walk(root)
        for finish in sites.finishers:
            result = finish(result)
        return result

    def _check(self, rule, node, result, site, defined):
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


class _Sites:
    """One scan: tries the rules at each node in pre-order and splices in replacements."""

    def __init__(self, rw: Rewriter, root, func_name, params, stop_at_match):
        self.rw, self.root, self.func_name, self.params = rw, root, func_name, params
        self.stop_at_match = stop_at_match
        self.canonical = not rw._raw
        self.loops: list = []
        # Variables in scope somewhere in the function, for checking replacements: only
        # needed once a rule without its own checks fires.
        self.defined: set = set()
        self.finishers: list = []  # the finish() of each rule that fired, once

    def _where(self, node) -> str:
        return f"{' > '.join(l.loop_var.name for l in self.loops) or '<top>'} ({type(node).__name__})"

    def _site(self, rule, m) -> Site:
        return Site(rule.name, tuple(l.loop_var.name for l in self.loops), m.node, self.func_name)

    def try_rules(self, node, visit):
        """The replacement of ``node`` by the first rule that fires there, else None."""
        rw = self.rw
        for rule in rw._rules_for(type(node)):
            if rule.matcher is not None:
                m = rule.matcher(node, tuple(self.loops), self.canonical)
            else:
                m = _Matcher(tuple(self.loops)).run(rule.pattern, node)
            if m is None:
                continue
            try:
                result = rule.callback(m)
            except Exception as err:  # noqa: BLE001 - re-raised with where it happened
                err.add_note(f"in the callback of rule {rule.name!r} at {self._where(node)}")
                raise
            if self.stop_at_match:
                rw.report.add(self._site(rule, m))
                return node
            if isinstance(result, (list, tuple)) and result and all(isinstance(s, tirx.Stmt) for s in result):
                result = result[0] if len(result) == 1 else tirx.SeqStmt(list(result))
            if result is None:
                continue
            if not rule.self_checked:
                if not self.defined:
                    self.defined.update(key(v) for v in vars_used(self.root))
                    self.defined.update(key(v) for v in self.params)
                result = rw._check(rule, node, result, self._where(node), self.defined)
                rw._unchecked_fired = True
            rw.report.add(self._site(rule, m))
            if rule.finish is not None and rule.finish not in self.finishers:
                self.finishers.append(rule.finish)
            if m.span is not None and isinstance(m.node, tirx.SeqStmt):
                start, stop = m.span
                head = [visit(s) for s in m.node.seq[:start]]
                tail = list(m.node.seq[stop:])
                if tail:
                    rest = visit(tail[0] if len(tail) == 1 else tirx.SeqStmt(tail))
                    tail = list(rest.seq) if isinstance(rest, tirx.SeqStmt) else [rest]
                items = head + [result] + tail
                return items[0] if len(items) == 1 else tirx.SeqStmt(items)
            return result
        return None

    # -- statements only: a Python walk that rebuilds just the path to each replacement --
    def walk(self, node):
        kind = type(node)
        if kind is not tirx.AllocBuffer and kind is not tirx.DeclBuffer and self.rw._rules_for(kind):
            replaced = self.try_rules(node, self.walk)
            if replaced is not None:
                return replaced
        if kind is tirx.For:
            self.loops.append(node)
            try:
                body = self.walk(node.body)
            finally:
                self.loops.pop()
            if body.same_as(node.body):
                return node
            return tirx.For(node.loop_var, node.min, node.extent, node.kind, body, node.thread_binding,
                            node.annotations, node.step)
        if kind is tirx.SeqStmt:
            old = node.seq[:]
            new = [self.walk(s) for s in old]
            if all(a.same_as(b) for a, b in zip(new, old)):
                return node
            return tirx.SeqStmt(new)
        if kind is tirx.IfThenElse:
            then = self.walk(node.then_case)
            other = None if node.else_case is None else self.walk(node.else_case)
            if then.same_as(node.then_case) and (other is None or other.same_as(node.else_case)):
                return node
            return tirx.IfThenElse(node.condition, then, other)
        return self._walk_fields(node)

    def _walk_fields(self, node):
        """Any other statement (AttrStmt, While, s_tir blocks): walk the statements in its fields."""
        changed = {}
        for f in _stmt_fields(type(node)):
            child = getattr(node, f)
            if isinstance(child, tirx.Stmt):
                new = self.walk(child)
                if not new.same_as(child):
                    changed[key(child)] = new
        return with_children(node, changed) if changed else node

    # -- with expression rules: every node, through structural_mutate -----------------------
    def mutate(self, root):
        # An exception must not cross the FFI boundary of structural_mutate: it would come
        # back as a RuntimeError. Keep the first one and raise it once the walk returns.
        failure: list = []

        def guarded(node, mut):
            if failure:
                return None
            try:
                return self.try_rules(node, mut.mutate)
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
                self.loops.append(node)
                try:
                    return mut.default_mutate(node)
                finally:
                    self.loops.pop()
            return mut.default_mutate(node)

        def on_expr(node, mut):
            if failure or isinstance(node, ir.Var):
                return node
            replaced = guarded(node, mut)
            return replaced if replaced is not None else mut.default_mutate(node)

        result = tvm_ffi.structural_mutate(root, [(tirx.Stmt, on_stmt), (ir.Type, lambda node, mut: node),
                                                  (ir.Expr, on_expr)])
        if failure:
            raise failure[0]
        return result


_STMT_FIELDS: dict = {}


def _stmt_fields(kind) -> tuple:
    """The fields of a statement type that hold a nested statement (For and SeqStmt aside)."""
    fields = _STMT_FIELDS.get(kind)
    if fields is None:
        info = getattr(kind, "__tvm_ffi_type_info__", None)
        names = [f.name for f in info.fields] if info is not None else []
        fields = tuple(n for n in names if n in ("body", "init", "block", "then_case", "else_case"))
        _STMT_FIELDS[kind] = fields
    return fields


def _func_name(func) -> str | None:
    attrs = func.attrs
    if attrs is not None and "global_symbol" in attrs:
        return str(attrs["global_symbol"])
    return None
