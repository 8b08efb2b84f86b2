"""The single pre-order pass that finding and rewriting share.

A scan visits a function's statements (and, when a rule matches expressions, its
expressions) in pre-order. At each node it tries the rules that can match that kind of node,
in order; the first that fires replaces the node, and the replacement is not scanned again.
So matches never overlap and an outer match wins. The scan also keeps what a match needs to
know about its surroundings: the enclosing loops, and the buffer views declared so far
(:class:`~tirpat.tir.region.Aliases`).

A rule's callback returns the replacement, or declines the site: ``None``, or
``tp.decline("why")`` to say why. Either way the next rule is tried, and the report lists
the site as declined.

>>> tp.decline("K loop not contiguous")
decline('K loop not contiguous')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import tvm_ffi
from tvm import ir, tirx

from . import engine
from .analysis import defined_vars, dtype_of, fresh_var, key, lanes, rename_defs, vars_used, with_children
from .pattern import EXPR, STMT, Pattern, Wildcard
from .region import Aliases


@tvm_ffi.register_error
class RewriteError(Exception):
    """A rule failed at a site: an ill-formed replacement, or an error raised by its callback.
    The message names the rule and the site."""


class Decline:
    """What a callback returns to leave a site alone and say why (see :func:`decline`)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self):
        return f"decline({self.reason!r})"


def decline(reason: str) -> Decline:
    """Leave this site alone: return this from a callback. The reason is listed by the
    rewriter's report and by :func:`tirpat.explain`.

    >>> def gemm(m):
    ...     if m.region("A").strides[-1] != 1:
    ...         return tp.decline("the K loop is not contiguous in A")
    ...     ...
    """
    if not isinstance(reason, str) or not reason:
        raise TypeError(f"decline takes the reason as a non-empty string, got {reason!r}")
    return Decline(reason)


@dataclass
class Rule:
    """One rewrite rule: a pattern, what to do with its matches, and a name for reports."""

    pattern: Pattern
    callback: Callable[[engine.Match], Any]
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

    def match(self, node, context: tuple, canonical: bool, aliases: Aliases) -> engine.Match | None:
        """The first match of this rule at ``node``, or None."""
        if self.matcher is not None:
            return self.matcher(node, context, canonical)
        return engine.first_match(engine.compiled(self.pattern), node, context, aliases)

    def __repr__(self):
        return f"Rule({self.name!r}, {self.pattern!r})"


def _where(loops, func) -> str:
    return (f"{func}: " if func else "") + (" > ".join(loops) or "<top>")


def _kind(node) -> str:
    return f"For {node.loop_var.name}" if isinstance(node, tirx.For) else type(node).__name__


@dataclass
class Site:
    """Where a rule fired: the rule, the For loops around the site (outermost first), the
    matched node (before) and the function's name."""

    rule: str
    context: tuple
    node: Any
    func: str | None = None

    @property
    def loops(self) -> tuple:
        """The names of the loops around the site, outermost first."""
        return tuple(l.loop_var.name for l in self.context)

    def __repr__(self):
        return f"<{self.rule} at {_where(self.loops, self.func)}: {_kind(self.node)}>"


@dataclass
class Declined(Site):
    """A site a rule matched and its callback declined, with the reason given (or None)."""

    reason: str | None = None

    def __str__(self):
        why = self.reason or "declined (the callback returned None)"
        return f"rule {self.rule!r} at {_where(self.loops, self.func)} ({_kind(self.node)}): {why}"


@dataclass
class Report:
    """What one rewriting call did: ``counts`` per rule, every ``site`` it fired at, and the
    sites its callbacks ``declined``.

    >>> print(tp.Report())
    rewrites per rule:
      (no rule fired)
    """

    counts: dict = field(default_factory=dict)
    sites: list = field(default_factory=list)
    declined: list = field(default_factory=list)

    def add(self, site: Site) -> None:
        self.counts[site.rule] = self.counts.get(site.rule, 0) + 1
        self.sites.append(site)

    def merge(self, other: "Report") -> None:
        """Add another report's sites and declines to this one."""
        for site in other.sites:
            self.add(site)
        self.declined += other.declined

    def __str__(self):
        lines = [f"{n:6d}  {rule}" for rule, n in self.counts.items()] or ["  (no rule fired)"]
        text = "rewrites per rule:\n" + "\n".join(lines)
        if self.declined:
            text += "\ndeclined:\n" + "\n".join(f"  {d}" for d in self.declined)
        return text


class RuleIndex:
    """Rules in order, indexed by the node kinds their pattern's root can match (as
    tinygrad's PatternMatcher indexes UPats by op), so each node tries only the rules that
    could match it."""

    def __init__(self, rules):
        self.rules = tuple(rules)
        for r in self.rules:
            if not isinstance(r, Rule):
                raise TypeError(f"a Rewriter takes Rule objects, got {r!r}")
        self._by_type: dict = {}
        self.has_expr_rules = any(r.pattern.position == EXPR for r in self.rules)
        self.raw = all(r.matcher is not None for r in self.rules)

    def rules_for(self, node_type) -> tuple:
        rules = self._by_type.get(node_type)
        if rules is None:
            is_stmt = issubclass(node_type, tirx.Stmt)
            rules = tuple(
                r for r in self.rules
                if (r.pattern.root_types is None and (r.pattern.position == STMT) == is_stmt
                    or isinstance(r.pattern, Wildcard))
                or (r.pattern.root_types is not None and issubclass(node_type, r.pattern.root_types))
            )
            self._by_type[node_type] = rules
        return rules


class Scan:
    """One pass over one function body (or statement): tries the rules at each node in
    pre-order and splices in replacements, recording sites in ``report``."""

    def __init__(self, index: RuleIndex, report: Report, func_name=None, params=(), find_only=False):
        self.index, self.report, self.func_name, self.params = index, report, func_name, params
        self.find_only = find_only  # record matches and leave every node as it is
        self.canonical = not index.raw
        self.loops: list = []
        self.aliases = Aliases()
        self.unchecked_fired = False  # a rule without self_checked fired: verify the result
        # Variables in scope somewhere in the function, for checking replacements: only
        # needed once a rule without its own checks fires.
        self.defined: set = set()
        self.root = None
        self.finishers: list = []  # the finish() of each rule that fired, once

    def run(self, root):
        self.root = root
        result = self._mutate(root) if self.index.has_expr_rules else self._walk(root)
        for finish in self.finishers:
            result = finish(result)
        return result

    def where(self, node) -> str:
        """The site of ``node`` in words, for messages."""
        return f"{_where([l.loop_var.name for l in self.loops], self.func_name)} ({_kind(node)})"

    def try_rules(self, node, visit):
        """The replacement of ``node`` by the first rule that fires there, else None."""
        context = tuple(self.loops)
        for rule in self.index.rules_for(type(node)):
            m = rule.match(node, context, self.canonical, self.aliases)
            if m is None:
                continue
            try:
                result = rule.callback(m)
            except RewriteError:
                raise
            except Exception as err:  # noqa: BLE001 - re-raised naming the rule and the site
                raise RewriteError(f"rule {rule.name!r} at {self.where(node)}: its callback raised "
                                   f"{type(err).__name__}: {err}") from err
            if self.find_only:
                self.report.add(Site(rule.name, context, m.node, self.func_name))
                return node
            if isinstance(result, (list, tuple)) and result and all(isinstance(s, tirx.Stmt) for s in result):
                result = result[0] if len(result) == 1 else tirx.SeqStmt(list(result))
            if result is None or isinstance(result, Decline):
                self.report.declined.append(Declined(rule.name, context, m.node, self.func_name,
                                                     None if result is None else result.reason))
                continue
            if not rule.self_checked:
                if not self.defined:
                    self.defined.update(key(v) for v in vars_used(self.root))
                    self.defined.update(key(v) for v in self.params)
                result = self.check(rule, node, result)
                self.unchecked_fired = True
            self.report.add(Site(rule.name, context, m.node, self.func_name))
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

    def check(self, rule, node, result):
        """``result`` as a valid replacement of ``node`` (fresh definitions), or RewriteError."""
        site = self.where(node)
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
        vector = _vector_packed_arg(result)
        if vector is not None:
            raise RewriteError(f"rule {rule.name!r} at {site} passes the vector {vector} to a packed call; "
                               f"packed functions take scalars and buffers")
        # Every inserted copy gets its own variables, so one replacement can be used twice.
        own = defined_vars(result)
        if own and not rule.fresh_defs:
            result = rename_defs(result, {key(v): fresh_var(v) for v in own})
            own = defined_vars(result)
        own_keys = {key(v) for v in own}
        local = {key(v) for v in defined_vars(node)} if isinstance(node, tirx.Stmt) else set()
        for v in vars_used(result):
            k = key(v)
            if (k not in self.defined or k in local) and k not in own_keys:
                raise RewriteError(f"rule {rule.name!r} at {site} returned a replacement that uses "
                                   f"{v.name!r}, which is not defined at that site")
        return result

    # -- statements only: a Python walk that rebuilds just the path to each replacement --
    def _walk(self, node):
        kind = type(node)
        if kind is tirx.DeclBuffer:
            self.aliases.declare(node)
            return node
        if kind is not tirx.AllocBuffer and self.index.rules_for(kind):
            replaced = self.try_rules(node, self._walk)
            if replaced is not None:
                return replaced
        if kind is tirx.For:
            self.loops.append(node)
            try:
                body = self._walk(node.body)
            finally:
                self.loops.pop()
            if body.same_as(node.body):
                return node
            return tirx.For(node.loop_var, node.min, node.extent, node.kind, body, node.thread_binding,
                            node.annotations, node.step)
        if kind is tirx.SeqStmt:
            old = node.seq[:]
            new = [self._walk(s) for s in old]
            if all(a.same_as(b) for a, b in zip(new, old)):
                return node
            return tirx.SeqStmt(new)
        if kind is tirx.IfThenElse:
            then = self._walk(node.then_case)
            other = None if node.else_case is None else self._walk(node.else_case)
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
                new = self._walk(child)
                if not new.same_as(child):
                    changed[key(child)] = new
        return with_children(node, changed) if changed else node

    # -- with expression rules: every node, through structural_mutate -----------------------
    def _mutate(self, root):
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
            if failure:
                return node
            if isinstance(node, tirx.DeclBuffer):
                self.aliases.declare(node)
                return node
            if isinstance(node, tirx.AllocBuffer):
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


def _vector_packed_arg(stmt):
    """The first vector-typed argument of a ``call_packed`` in ``stmt`` (TVM rejects them
    only deep inside ``tvm.compile``), else None."""
    found = []

    def on_call(call):
        if not found and getattr(call.op, "name", "") in ("tirx.tvm_call_packed", "tirx.tvm_call_cpacked"):
            found.extend(a for a in call.args[1:] if not tirx.is_buffer_var(a) and lanes(a) != 1)

    tvm_ffi.structural_walk(stmt, (ir.Call, on_call))
    return found[0] if found else None


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
