"""Rewriting: replace every match of a rule with vendor code.

A :class:`Rewriter` is an ordered list of rules, each a ``(pattern, callback)`` pair,
applied by one pre-order scan (:mod:`tirpat.tir.scan`): an outer match wins, and a
replacement is never re-scanned. ``rw.rewrite(x)`` returns the result with its own
:class:`Report`; ``rw(x)`` returns the result alone, and ``rw.report`` is the last call's
report. A rewriter keeps no other state: a pass that runs it inside ``tvm.compile`` is handed
the report to fill (``rw.as_pass(report=...)``), so concurrent builds each get their own.

>>> A = tvm.te.placeholder((8,), "int8", name="A")
>>> func = tp.lower(tvm.te.create_prim_func([A, tvm.te.compute((8,), lambda i: A[i], name="B")]))
>>> def to_call(m):
...     c = m["c"]
...     return tvm.tirx.Evaluate(tvm.tirx.call_packed("my.dma", c.dst.buffer, c.src.buffer, *c.extents))
>>> rw = tp.Rewriter.from_pattern(tp.is_copy(name="c"), to_call, name="dma")
>>> new_func, report = rw.rewrite(func)
>>> report.counts
{'dma': 1}
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, NamedTuple

import tvm
from tvm import ir, tirx

from .analysis import key, with_children
from .canonical import canonicalize
from .engine import Match
from .pattern import Pattern
from .scan import Report, RewriteError, Rule, RuleIndex, Scan


class Rewritten(NamedTuple):
    """What a rewriting call returns: the result (the same kind as its input) and its report.

    >>> rw = tp.Rewriter.from_pattern(tp.is_const(2), lambda m: m.node, name="keep")
    >>> x = tvm.tirx.Var("x", "int32")
    >>> result, report = rw.rewrite(tvm.tirx.Evaluate(x * 2))
    >>> report.counts
    {'keep': 1}
    """

    result: Any
    report: Report


class Rewriter:
    """An ordered set of rules applied to PrimFuncs, IRModules or statements.

    >>> copy = tp.Rewriter.from_pattern(tp.is_copy(), lambda m: None, name="copy")
    >>> zero = tp.Rewriter.from_pattern(tp.is_nest(None, tp.is_store(tp.is_buffer(), None, tp.is_const(0))),
    ...                                 lambda m: None, name="zero")
    >>> copy | zero
    Rewriter([copy, zero])
    """

    def __init__(self, rules):
        self._index = RuleIndex(rules)
        self.rules = self._index.rules
        for n, earlier in enumerate(self.rules):
            shadows = getattr(earlier.pattern, "shadows", None)
            for later in self.rules[n + 1:] if shadows else ():
                if shadows(later.pattern):
                    warnings.warn(f"rule {later.name!r} never fires: rule {earlier.name!r} comes first and has the "
                                  f"same pattern (give {earlier.name!r} a where= predicate to choose its sites)",
                                  stacklevel=3)
        self._last: Report | None = None

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_pattern(cls, pattern: Pattern, callback: Callable[[Match], Any], name: str | None = None) -> "Rewriter":
        """A one-rule rewriter: ``callback(match)`` returns the replacement (a Stmt, a list of
        Stmts, or a PrimExpr for an expression pattern), or declines the site with None or
        ``tp.decline("why")``.

        >>> rw = tp.Rewriter.from_pattern(tp.is_copy(name="c"), lambda m: tp.decline("not yet"), name="noop")
        >>> rw.rules[0].name
        'noop'
        """
        if not isinstance(pattern, Pattern):
            raise TypeError(f"from_pattern: expected a tirpat pattern, got {type(pattern).__name__} {pattern!r}")
        if not callable(callback):
            raise TypeError(f"from_pattern: the callback must be callable, got {callback!r}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"from_pattern: name must be a string, got {name!r}")
        return cls([Rule(pattern, callback, name or getattr(callback, "__name__", None) or repr(pattern))])

    @classmethod
    def from_module(cls, mod, name: str | None = None, *, where: Callable[[Match], object] | None = None) -> "Rewriter":
        """A rule from an IRModule holding PrimFuncs ``pattern`` and ``replacement``.

        See :mod:`tirpat.tir.module_rule` for the binding rules (TVM's ``match_buffer``).
        ``where(m)`` chooses among the sites the pattern matches: in ``m``, each parameter's
        name gives what it is bound to (``m["A"]``, the target buffer; ``m["s"]``, the
        expression). Needed where two intrinsics share a desc (TVM's ldmatrix A/B loads).
        ``where`` may return :func:`tirpat.decline` (a reason) instead of False.

        >>> copy8 = tvm.script.from_source('''
        ... @I.ir_module
        ... class Copy8:
        ...     @T.prim_func
        ...     def pattern(A: T.Buffer((8,), "int8"), B: T.Buffer((8,), "int8")):
        ...         for i in range(8):
        ...             B[i] = A[i]
        ...
        ...     @T.prim_func
        ...     def replacement(A: T.Buffer((8,), "int8", offset_factor=1), B: T.Buffer((8,), "int8", offset_factor=1)):
        ...         T.evaluate(T.call_packed("my.copy8", A.access_ptr("r"), B.access_ptr("w")))
        ... ''')
        >>> only_b = tp.Rewriter.from_module(copy8, "copy8", where=lambda m: m["B"].name == "B")
        >>> only_b.rules[0].name
        'copy8'
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
        return self._index.rules_for(node_type)

    # -- reports -----------------------------------------------------------------------
    @property
    def report(self) -> Report:
        """The report of this rewriter's last call (an empty report before the first). With
        several threads rewriting at once it is whichever finished last: there, use the report
        :meth:`rewrite` returns, or the one handed to :meth:`as_pass`."""
        return self._last or Report()

    # -- application -------------------------------------------------------------------
    def rewrite(self, obj, *, record: bool = True) -> Rewritten:
        """Rewrite a PrimFunc, an IRModule or a Stmt: ``(result, report)``, the result of the
        same kind as ``obj``. The input is never changed. ``record=False`` leaves
        :attr:`report` alone (``explain`` looks without recording)."""
        report = Report()
        if isinstance(obj, ir.IRModule):
            result = self._rewrite_module(obj, report)
        elif isinstance(obj, tirx.PrimFunc):
            result = self._rewrite_func(obj, _func_name(obj), report)
        elif isinstance(obj, tirx.Stmt):
            result = Scan(self._index, report).run(self._prepare(obj))
        else:
            raise TypeError(f"a Rewriter applies to a PrimFunc, an IRModule or a Stmt, got {type(obj).__name__}")
        if record:
            self._last = report
        return Rewritten(result, report)

    def __call__(self, obj):
        """``self.rewrite(obj).result``: the rewritten PrimFunc, IRModule or Stmt."""
        return self.rewrite(obj).result

    def as_pass(self, name: str = "tirpat.Rewrite", *, report: Report | None = None) -> tvm.transform.Pass:
        """This rewriter as a ``tvm.transform.Pass`` over the PrimFuncs of a module. Each run's
        report becomes :attr:`report`, and is added to ``report`` when one is given: the pass's
        own record, whatever else runs the rewriter meanwhile (inside ``tvm.compile`` too, with
        :func:`tirpat.registered`).

        >>> A = tvm.te.placeholder((8,), "int8", name="A")
        >>> func = tp.lower(tvm.te.create_prim_func([A, tvm.te.compute((8,), lambda i: A[i], name="B")]))
        >>> rw = tp.Rewriter.from_pattern(tp.is_copy(), lambda m: tvm.tirx.Evaluate(0), name="dma")
        >>> mine = tp.Report()
        >>> stage = rw.as_pass(report=mine)
        >>> _ = stage(tvm.IRModule({"main": func})), stage(tvm.IRModule({"main": func}))
        >>> rw.report.counts, mine.counts
        ({'dma': 1}, {'dma': 2})
        """
        @tvm.transform.module_pass(opt_level=0, name=name)
        def transform(mod, ctx):
            result, found = self.rewrite(mod)
            if report is not None:
                report.merge(found)
            return result

        return transform

    def _prepare(self, body):
        return body if self._index.raw else canonicalize(body)

    def _rewrite_func(self, func, fname, report):
        before = len(report.sites)
        scan = Scan(self._index, report, fname, func.params)
        body = scan.run(self._prepare(func.body))
        if len(report.sites) == before:
            return func
        # The same PrimFunc with the new body. (PrimFunc's constructor, and so with_body,
        # makes a pass over the whole body: that alone would make rewriting quadratic-ish.)
        new = with_children(func, {key(func.body): body})
        if not scan.unchecked_fired:
            return new
        try:
            tirx.analysis.verify_well_formed(new, assert_mode=True)
        except Exception as err:  # noqa: BLE001 - the verifier reports through exceptions
            fired = sorted({s.rule for s in report.sites[before:]})
            detail = str(err).strip().splitlines()[-1]
            raise RewriteError(f"rewriting {fname} with rule(s) {fired} produced ill-formed TIR: {detail}") from None
        return new

    def _rewrite_module(self, mod, report):
        funcs = {gv: self._rewrite_func(f, gv.name_hint, report) if isinstance(f, tirx.PrimFunc) else f
                 for gv, f in mod.functions.items()}
        return ir.IRModule(funcs, attrs=mod.attrs)


def _func_name(func) -> str | None:
    attrs = func.attrs
    if attrs is not None and "global_symbol" in attrs:
        return str(attrs["global_symbol"])
    return None


def rewriter(cls_or_mod=None, *, where=None):
    """Class decorator: a class (or ``@I.ir_module``) with PrimFuncs ``pattern`` and
    ``replacement`` becomes a one-rule :class:`~tirpat.Rewriter` named after it.
    ``@tp.rewriter(where=pred)`` also chooses its sites, as ``Rewriter.from_module`` does.

    >>> copy8 = tvm.script.from_source('''
    ... @I.ir_module
    ... class Copy8:
    ...     @T.prim_func
    ...     def pattern(A: T.Buffer((8,), "int8"), B: T.Buffer((8,), "int8")):
    ...         for i in range(8):
    ...             B[i] = A[i]
    ...
    ...     @T.prim_func
    ...     def replacement(A: T.Buffer((8,), "int8", offset_factor=1), B: T.Buffer((8,), "int8", offset_factor=1)):
    ...         T.evaluate(T.call_packed("my.copy8", A.access_ptr("r"), B.access_ptr("w")))
    ... ''')
    >>> @tp.rewriter
    ... class CopyRow:
    ...     pattern = copy8["pattern"]
    ...     replacement = copy8["replacement"]
    >>> CopyRow.rules[0].name
    'CopyRow'
    """
    if cls_or_mod is None:
        return lambda c: rewriter(c, where=where)
    if isinstance(cls_or_mod, ir.IRModule):
        return Rewriter.from_module(cls_or_mod, where=where)
    if isinstance(cls_or_mod, type):
        funcs = {n: getattr(cls_or_mod, n, None) for n in ("pattern", "replacement")}
        if any(inspect.isfunction(f) for f in funcs.values()):
            # ``@T.prim_func`` methods under a class decorator named like ours are left
            # unparsed by TVMScript (as for Relax's ``@R.rewriter``): parse the class as a module.
            from tvm.script import ir as I

            mod = I.ir_module(cls_or_mod)
            funcs = {gv.name_hint: f for gv, f in mod.functions.items()}
        return Rewriter.from_module(funcs, name=cls_or_mod.__name__, where=where)
    raise TypeError(f"@tp.rewriter decorates a class or an IRModule, got {type(cls_or_mod).__name__}")
