"""Rules written as TVMScript: a ``pattern`` PrimFunc and the ``replacement`` for it.

This is the TensorIntrin (desc/impl) idea applied as a plain rewrite on lowered code, in
three steps, each in a module of its own:

- :mod:`tirpat.tir.script_pattern`: the pattern function becomes a pattern;
- :mod:`tirpat.tir.binding`: its buffer parameters bind to sub-regions of the target's
  buffers by TVM's ``match_buffer`` rules (scalar parameters bind to expressions), checked
  against the replacement's declarations;
- :mod:`tirpat.tir.inlining`: the replacement's parameters are inlined the way
  ``LowerMatchBuffer`` inlines the ``match_buffer`` of a tensorized block.

This module ties them into a :class:`~tirpat.tir.scan.Rule`, converts a rule to the code's
index type (:mod:`tirpat.tir.index_dtype`), and merges the replacement's thread launches with
the kernel's (:mod:`tirpat.tir.threads`), as ``UnifyThreadBinding`` merges tensorize's. A site
where binding cannot be done exactly is left alone, and :func:`tirpat.explain` says why.

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
>>> rw = tp.Rewriter.from_module(copy8, "copy8")
>>> A = tvm.te.placeholder((4, 8), "int8", name="A")
>>> func = tp.lower(tvm.te.create_prim_func([A, tvm.te.compute((4, 8), lambda i, j: A[i, j], name="B")]))
>>> rw.rewrite(func).report.sites      # one row of 8 per iteration of i
[<copy8 at main: i: For j>]
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, tirx

from . import engine
from . import pattern as P
from .analysis import const_int, dtype_of, key
from .binding import ParamInfo, bind_params
from .canonical import canonicalize, stepped
from .engine import Match
from .index_dtype import index_dtype_of, with_index_dtype
from .inlining import Inliner
from .lowering import lower
from .scan import Decline, RewriteError, Rule
from .script_pattern import pattern_of
from .threads import ThreadLaunchError, launches_threads, merge_thread_launches


class Binding:
    """What a module rule binds at a site (``m[rule.pattern]``): the rule for the site's
    index type, and per buffer parameter the region it is bound to (see ``bind_params``)."""

    def __init__(self, rule: "ModuleRule", params: list):
        self.rule, self.params = rule, params

    def __repr__(self):
        return f"<{self.rule.name}: {', '.join(f'{q.name}={target.name}' for q, target, *_ in self.params)}>"


class _ModuleRulePattern(P.Pattern):
    """The whole pattern function: its body, then the match_buffer preconditions."""

    binds_node = False  # binds the site's Binding instead

    def __init__(self, body, rule, extents=()):
        self.body = body
        self.rule = rule
        self.position = body.position
        self.root_types = body.root_types
        self.extents = tuple(extents)  # constant extents of the pattern's outer loops

    def children(self):
        return (self.body,)

    def _body_repr(self):
        return f"from_module({self.rule.name!r}: {self.body!r})"

    def shadows(self, other) -> bool:
        """True when this rule takes every site ``other`` could: the same pattern function,
        and no where() predicate to leave some sites to it."""
        if not isinstance(other, _ModuleRulePattern) or self.rule.where is not None:
            return False
        mine, theirs = self.rule, other.rule
        # the same sites, and the same preconditions on them (the replacement's declarations)
        return (tvm_ffi.structural_equal(mine.pattern_func, theirs.pattern_func, map_free_vars=True)
                and len(mine.replacement_func.params) == len(theirs.replacement_func.params)
                and all(tvm_ffi.structural_equal(a.ty, b.ty, map_free_vars=True)
                        for a, b in zip(mine.replacement_func.params, theirs.replacement_func.params)))

    def _quick_reject(self, node) -> bool:
        """True when the outer loops' constant extents rule a match out, on raw TIR as on
        canonical TIR (extent-1 loops are skipped; a stepped loop's count is not judged)."""
        for extent in self.extents:
            while type(node) is tirx.For and type(node.extent) is tirx.IntImm and node.extent.value == 1:
                node = node.body
            if type(node) is not tirx.For:
                return True
            if stepped(node):
                return False
            found = node.extent
            if type(found) is tirx.IntImm and found.value != extent:
                return True
            node = node.body
        return False

    def compile(self, cc):
        trace, fail, own = cc.trace, cc.failure(self), self.key

        def match(node, b, nest, k):
            # (ModuleRule.match rejects most candidates by their loop extents before this.)
            rule = self.rule.for_index_dtype(index_dtype_of(node))
            if isinstance(rule, str):
                return fail and fail(b, node, nest, rule, final=True)

            def preconditions():
                params, reason = rule.bind_params(b)
                if params is None:
                    return fail and fail(b, node, nest, reason, ("params",), final=True)
                mark = b.mark()
                b.bind(own, Binding(rule, params))
                for name, k_ in rule.named:
                    b.bind(name, b.captures.get(k_))
                verdict = True if rule.where is None else rule.where(b.match(node))
                if isinstance(verdict, Decline) or not verdict:
                    b.undo(mark)
                    reason = verdict.reason if isinstance(verdict, Decline) else (
                        f"the rule's where() predicate {getattr(rule.where, '__name__', rule.where)} is false")
                    return fail and fail(b, node, nest, reason, ("where",), final=True)
                if k():
                    return True
                b.undo(mark)
                return False

            return rule.body_matcher(trace)(node, b, nest, preconditions)

        return match


class ModuleRule:
    """Builds the pattern from ``pattern`` and the replacement at each site."""

    def __init__(self, mod, name, where=None):
        if where is not None and not callable(where):
            raise TypeError(f"where expects a callable taking a Match, got {where!r}")
        self.where = where
        if isinstance(mod, ir.IRModule):
            funcs = {gv.name_hint: f for gv, f in mod.functions.items()}
        elif isinstance(mod, dict):
            funcs = mod
        else:
            raise TypeError(f"from_module expects an IRModule with PrimFuncs 'pattern' and 'replacement', "
                            f"got {type(mod).__name__}")
        missing = [n for n in ("pattern", "replacement") if not isinstance(funcs.get(n), tirx.PrimFunc)]
        if missing:
            raise ValueError(f"from_module: the module has no PrimFunc {' or '.join(repr(m) for m in missing)} "
                             f"(found {sorted(funcs)})")
        self.name = name or "module_rule"
        self.pattern_func = lower(funcs["pattern"])
        self.replacement_func = lower(funcs["replacement"])
        pp, rp = list(self.pattern_func.params), list(self.replacement_func.params)
        if len(pp) != len(rp):
            raise ValueError(f"rule {self.name!r}: pattern has {len(pp)} parameters, replacement {len(rp)}")
        for a, b in zip(pp, rp):
            if tirx.is_buffer_var(a) != tirx.is_buffer_var(b):
                raise ValueError(f"rule {self.name!r}: parameter {a.name} is a buffer in one function and not the other")
            if tirx.is_buffer_var(a):
                if [const_int(s) for s in a.shape] != [const_int(s) for s in b.shape] or str(a.dtype) != str(b.dtype):
                    raise ValueError(f"rule {self.name!r}: buffer {a.name} is {list(a.shape)} {a.dtype} in pattern "
                                     f"but {list(b.shape)} {b.dtype} in replacement")
        self.params = list(zip(pp, rp))
        self._replacement_of = {key(p): q for p, q in self.params}
        self._buffer_params = [(p, q, ParamInfo(p, q, self.replacement_func.body))
                               for p, q in self.params if tirx.is_buffer_var(p)]
        self._infos = {key(p): info for p, _, info in self._buffer_params}
        self._scalars = {key(p): P.Wildcard(f"{self.name}:{p.name}").has_dtype(dtype_of(p))
                         for p in pp if not tirx.is_buffer_var(p)}
        # what a match shows under each parameter's name: m["A"] is the bound target buffer
        self.named = [(p.name, self._infos[key(p)]) for p in pp if tirx.is_buffer_var(p)] + \
                     [(p.name, self._scalars[key(p)].name) for p in pp if not tirx.is_buffer_var(p)]
        self._inliner = Inliner(self.replacement_func, self.name)
        # The pattern in canonical form, like the code it is matched against.
        pattern_body = canonicalize(self.pattern_func.body)
        body = pattern_of(pattern_body, self.name, {key(p): p for p in pp if tirx.is_buffer_var(p)}, self._infos,
                          self._scalars)
        extents, loop = [], pattern_body
        while isinstance(loop, tirx.For) and isinstance(loop.extent, tirx.IntImm):
            extents.append(int(loop.extent.value))
            loop = loop.body
        self.pattern = _ModuleRulePattern(body, self, extents)
        self._body_matchers: dict = {}
        self._matcher = None  # the whole pattern's, compiled on first use
        # The rule for code indexed in another integer type (int64 from Relax, say), built
        # on first use by converting both functions, as tensorize converts an intrinsic.
        self.index_dtype = index_dtype_of(self.pattern_func.body)
        self._variants: dict = {self.index_dtype: self}

    def body_matcher(self, trace: bool) -> engine.Matcher:
        """The matcher of the pattern function's body (the preconditions are the caller's)."""
        found = self._body_matchers.get(trace)
        if found is None:
            found = self._body_matchers[trace] = engine.compiled(self.pattern.body, trace)
        return found

    def for_index_dtype(self, dtype: str) -> "ModuleRule | str":
        """This rule for code whose indices are ``dtype``, or why there is none."""
        rule = self._variants.get(dtype)
        if rule is None and dtype == "int32":
            # Narrowing could overflow a value computed from an index (TVM narrows on the
            # same assumption, ForceNarrowIndexToInt32): write such rules in int32.
            rule = f"the rule indexes in {self.index_dtype} and is not narrowed to {dtype} indices"
            self._variants[dtype] = rule
        if rule is None:
            try:
                pattern = with_index_dtype(self.pattern_func, dtype)
                # a scalar the pattern uses as an index (a vector length bound to a loop extent)
                # is bound to an index of the code: the replacement takes it in that type too
                widened = [q for p, p2, q in zip(self.pattern_func.params, pattern.params, self.replacement_func.params)
                           if not tirx.is_buffer_var(p) and dtype_of(p) != dtype_of(p2)]
                replacement = with_index_dtype(self.replacement_func, dtype, widened)
                for p, q in zip(pattern.params, replacement.params):
                    if dtype_of(p) != dtype_of(q):  # an index in one function, a value in the other
                        raise ValueError(f"scalar parameter {p.name} would be {dtype_of(p)} in the pattern "
                                         f"but {dtype_of(q)} in the replacement")
                rule = ModuleRule({"pattern": pattern, "replacement": replacement}, self.name, self.where)
                rule.index_dtype = dtype  # what it was made for, whatever its first statement shows
                rule._variants = self._variants
            except Exception as err:  # noqa: BLE001 - a TVM error too: the site is then not rewritten, and explain says why
                lines = str(err).strip().splitlines() or [type(err).__name__]
                rule = f"the rule cannot be converted to {dtype} indices: {lines[-1]}"
            self._variants[dtype] = rule
        return rule

    # -- matching ------------------------------------------------------------------------
    # -- matching ------------------------------------------------------------------------
    def match(self, node, context: tuple = (), canonical: bool = False) -> Match | None:
        """The first match at ``node``, which may be raw TIR: matched as it is when it is
        already in the canonical form of the pattern, else canonicalised and matched again."""
        if self.pattern._quick_reject(node):
            return None
        matcher = self._matcher
        if matcher is None:
            matcher = self._matcher = engine.compiled(self.pattern)
        m = engine.first_match(matcher, node, context)
        if m is None and not canonical:
            again = canonicalize(node)
            if not again.same_as(node) and not self.pattern._quick_reject(again):
                m = engine.first_match(matcher, again, context)
        return m

    def bind_params(self, bound) -> tuple:
        """The regions a match binds the buffer parameters to, or why there are none
        (:func:`tirpat.tir.binding.bind_params`)."""
        return bind_params(bound, self._buffer_params, self._scalars)

    def replace(self, m):
        """The replacement for one site: its body with the parameters inlined (see the module)."""
        binding = m[self.pattern]
        return binding.rule.replacement(m, binding.params)

    def replacement(self, m, params):
        """The replacement at the site ``m`` of this rule (of the site's index type)."""
        return self._inliner.at(params, [(self._replacement_of[p], m[w.name]) for p, w in self._scalars.items()])


def module_rule(mod, name=None, where=None):
    """A :class:`~tirpat.tir.scan.Rule` from an IRModule with ``pattern`` and ``replacement``."""
    rule = ModuleRule(mod, name, where)
    finish = None
    if launches_threads(rule.replacement_func.body):
        def finish(body):
            try:
                return merge_thread_launches(body)
            except ThreadLaunchError as err:
                raise RewriteError(f"rule {rule.name!r}: {err}") from None

    return Rule(rule.pattern, rule.replace, rule.name, fresh_defs=True, matcher=rule.match, self_checked=True,
                finish=finish)

