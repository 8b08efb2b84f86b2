"""Rules written as TVMScript: a ``pattern`` PrimFunc and the ``replacement`` for it.

This is the TensorIntrin (desc/impl) idea applied as a plain rewrite on lowered code. The
pattern's buffer parameters bind to sub-regions of the target's buffers by TVM's
``match_buffer`` rules: any offset, dimensions where the region has extent 1 dropped,
``offset_factor`` as an alignment precondition, dtype and scope checked. TVM drops only
leading dimensions; any dimension fixed in the matched loops can go, as long as the
parameter's dimensions keep their order (a ``(16,)`` parameter binds ``A[0, i, 0]`` of a
``(1, 16, 1)`` buffer, or a column, whose stride its declared strides must then allow),
leading ones tried first. Scalar parameters bind to expressions. A site where that cannot
be done exactly is left alone, and :func:`tirpat.explain` says why.

The replacement's parameters are then inlined the way ``LowerMatchBuffer`` inlines the
``match_buffer`` of a tensorized block: a load or store of a parameter becomes one of the
bound buffer at the region's base plus the index (the dropped dimensions fixed at the base),
its data pointer the bound buffer's, and its ``elem_offset`` and stride variables the
region's offset and strides. No buffer view is left behind, so every later pass (virtual
threads, warp memory, storage rewrite, shared-memory layout) sees the real accesses, as it
sees those of ``Schedule.tensorize``'s output. Thread launches of the replacement merge with
the kernel's (:mod:`tirpat.tir.threads`), as ``UnifyThreadBinding`` merges tensorize's.

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

import itertools

import tvm_ffi
from tvm import ir, tirx

from . import engine
from . import pattern as P
from .analysis import (const_int, defined_vars, dtype_is, dtype_of, fresh_var, key, linear_form, rename_defs,
                       substitute, simplify, uses_any, vars_used, visit_accesses)
from .canonical import canonicalize, stepped
from .engine import Match
from .index_dtype import as_index, index_dtype_of, with_index_dtype
from .lowering import lower
from .region import tile_base
from .scan import Decline, RewriteError, Rule
from .statement import ForPattern, IfPattern, SeqPattern, StmtPattern
from .threads import ThreadLaunchError, launches_threads, merge_thread_launches


def _scope(buf) -> str:
    s = buf.scope()
    return "global" if s in ("", "global") else s


def _dim_strides(buf) -> list:
    """Element stride of every dimension (expressions; row-major unless declared)."""
    if len(buf.strides):
        return list(buf.strides)
    out, acc = [], tirx.IntImm("int32", 1)
    for extent in reversed(list(buf.shape)):
        out.append(acc)
        acc = simplify(acc * extent)
    return list(reversed(out))


def _int_strides(buf, dtype: str, shape=None) -> list | None:
    """Python int strides of every dimension when all are ``dtype`` constants, else None.
    ``buf`` is a buffer or its type; ``shape`` its shape when already at hand."""
    declared = buf.strides[:]
    if declared:
        out = []
        for st in declared:
            if not isinstance(st, tirx.IntImm) or not dtype_is(st, dtype):
                return None
            out.append(st.value)
        return out
    out, acc = [], 1
    for extent in reversed(buf.shape[:] if shape is None else shape):
        if not isinstance(extent, tirx.IntImm) or not dtype_is(extent, dtype):
            return None
        out.append(acc)
        acc *= extent.value
    return out[::-1]


_IMMS: dict = {}


def _imm(dtype: str, value: int):
    """A shared integer constant (IR nodes are immutable, so sharing one is safe)."""
    imm = _IMMS.get((dtype, value))
    if imm is None:
        imm = _IMMS.setdefault((dtype, value), tirx.IntImm(dtype, value))
    return imm


class _Affine:
    """``sum(coeff * var) + const`` with Python int coefficients: offsets without the simplifier.

    ``_Affine.of(elem_offset, [(base, stride), ...])`` is None when a term is not integer
    arithmetic on variables (then the simplifier does it)."""

    def __init__(self, terms: dict, const: int, dtype: str):
        self.terms, self.const, self.dtype = terms, const, dtype  # terms: key(var) -> [var, coeff]

    @classmethod
    def of(cls, start, scaled) -> "_Affine | None":
        terms: dict = {}
        const = 0
        dtype = dtype_of(start)
        for b, _ in scaled:
            if not dtype_is(b, dtype):
                return None
        stack = [(start, 1)] + [(b, st) for b, st in scaled]
        stack.reverse()  # popped in order, so the terms come out outermost dimension first
        while stack:
            e, scale = stack.pop()
            kind = type(e)
            if kind is tirx.IntImm:
                const += scale * e.value
            elif kind is tirx.Var:
                entry = terms.get(key(e))
                if entry is None:
                    terms[key(e)] = [e, scale]
                else:
                    entry[1] += scale
            elif kind is tirx.Add or kind is tirx.Sub:
                stack.append((e.b, scale if kind is tirx.Add else -scale))
                stack.append((e.a, scale))
            elif kind is tirx.Mul and type(e.b) is tirx.IntImm:
                stack.append((e.a, scale * e.b.value))
            elif kind is tirx.Mul and type(e.a) is tirx.IntImm:
                stack.append((e.b, scale * e.a.value))
            else:
                return None
        return cls(terms, const, dtype)

    def multiple_of(self, factor: int) -> bool:
        return self.const % factor == 0 and all(c % factor == 0 for _, c in self.terms.values())

    def expr(self):
        dtype = self.dtype
        out = None
        for var, coeff in self.terms.values():
            if coeff == 0:
                continue
            term = var if coeff == 1 else tirx.Mul(var, _imm(dtype, coeff))
            out = term if out is None else tirx.Add(out, term)
        if out is None:
            return _imm(dtype, self.const)
        return out if self.const == 0 else tirx.Add(out, _imm(dtype, self.const))


def _same_value(a, b) -> bool:
    """``a == b`` for all values of their variables (structurally equal, or a zero difference)."""
    if a.same_as(b) or tvm_ffi.structural_equal(a, b, map_free_vars=False):
        return True
    return const_int(simplify(a - b)) == 0


class _ParamInfo:
    """What bind_params needs of a (pattern, replacement) buffer parameter pair, computed once."""

    def __init__(self, p, q):
        self.rank = len(p.shape)
        self.compact = _dim_strides(tirx.decl_buffer(q.shape, q.dtype))
        self.compact_ints = [const_int(st) for st in self.compact]
        self.factors = []
        for b in (p, q):
            if int(b.offset_factor) > 1 and int(b.offset_factor) not in self.factors:
                self.factors.append(int(b.offset_factor))
        # declared strides: None when undeclared; per dimension an int, an expression, or
        # None for a variable (bound per site)
        self.declared = None
        if len(q.strides):
            self.declared = [None if isinstance(st, tirx.Var)
                             else (const_int(st) if const_int(st) is not None else st) for st in q.strides]
        self.elem_offset = None if isinstance(q.elem_offset, tirx.Var) else q.elem_offset
        self.index_dtype = dtype_of(q.elem_offset)
        # the replacement's stride and offset variables, bound per site: (dimension, key)
        self.stride_vars = [(d, st) for d, st in enumerate(q.strides) if isinstance(st, tirx.Var)]
        self.offset_var = q.elem_offset if isinstance(q.elem_offset, tirx.Var) else None
        self._alignments: dict = {}
        self._positions: dict = {}

    def alignments(self, ndim: int) -> tuple:
        """The ways the parameter's dimensions can sit among a target's ``ndim``: tuples of
        the target dimensions they bind to, in order; the other dimensions must stay fixed
        in the matched loops (the region has extent 1 there). TVM's ``match_buffer`` comes
        first (the last ones: leading dimensions dropped), then trailing or inner ones
        dropped (a ``(16,)`` parameter binds ``A[0, i, 0]`` of a ``(1, 16, 1)`` buffer)."""
        found = self._alignments.get(ndim)
        if found is None:
            found = self._alignments[ndim] = tuple(
                tuple(d for d in range(ndim) if d not in dropped)
                for dropped in itertools.combinations(range(ndim), ndim - self.rank)) if ndim >= self.rank else ()
        return found

    def positions(self, ndim: int, dims: tuple) -> list:
        """Per target dimension, the parameter dimension bound to it, or None (fixed)."""
        found = self._positions.get((ndim, dims))
        if found is None:
            found = self._positions[ndim, dims] = [dims.index(d) if d in dims else None for d in range(ndim)]
        return found


class _Shape(P.Pattern):
    """Any other expression node: same type and dtype, fields matched recursively."""

    def __init__(self, node, convert):
        self.node_type = type(node)
        self.root_types = (self.node_type,)
        self.dtype = dtype_of(node)
        fields = [f.name for f in self.node_type.__tvm_ffi_type_info__.fields]
        self.fields = tuple((f, convert(getattr(node, f))) if isinstance(getattr(node, f), ir.Expr)
                            else (f, getattr(node, f)) for f in fields if f != "ty")

    def children(self):
        return tuple(v for _, v in self.fields if isinstance(v, P.Pattern))

    def _body_repr(self):
        return f"{self.node_type.__name__}(...)"

    def compile(self, cc):
        kind, fail = self.node_type, cc.failure(self)
        fields = [(name, cc.compile(want, name) if isinstance(want, P.Pattern) else None, want)
                  for name, want in self.fields]
        n = len(fields)

        def match(node, b, nest, k):
            if type(node) is not kind:
                return fail and fail(b, node, nest, f"expected a {kind.__name__}, found {type(node).__name__}")
            for name, compiled, want in fields:
                found = getattr(node, name)
                if compiled is None and not (want is found or want == found if not isinstance(want, tvm_ffi.Object)
                                             else tvm_ffi.structural_equal(want, found)):
                    return fail and fail(b, node, nest, f"{kind.__name__}.{name} differs")

            def at(j):
                while j < n and fields[j][1] is None:
                    j += 1
                if j == n:
                    return k()
                name, compiled, _ = fields[j]
                return compiled(getattr(node, name), b, nest, lambda: at(j + 1))

            return at(0)

        return match


_COMPARISONS = (tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.EQ, tirx.NE)


class _Compare(P.Pattern):
    """A comparison in a pattern function (a guard), with the tile base semantics of
    indices: inside a matched nest, a side that matches ``base + x`` in the target, ``base``
    free of the nest's loops, matches as ``x``, the base moved to the other side (the truth
    of the comparison is the same). So ``i < n`` matches ``16*o + i < 50``, binding ``n`` to
    ``50 - 16*o``: the guard relative to the tile."""

    def __init__(self, kind, a, b):
        self.kind, self.a, self.b = kind, a, b
        self.root_types = (kind,)

    def children(self):
        return (self.a, self.b)

    def _body_repr(self):
        return f"{self.kind.__name__}({self.a!r}, {self.b!r})"

    def compile(self, cc):
        kind, fail = self.kind, cc.failure(self)
        lhs, rhs = cc.compile(self.a, "lhs"), cc.compile(self.b, "rhs")

        def match(node, b, nest, k):
            if type(node) is not kind:
                return fail and fail(b, node, nest, f"expected a {kind.__name__}, found {type(node).__name__}")
            mark = b.mark()
            if lhs(node.a, b, nest, lambda: rhs(node.b, b, nest, k)):
                return True
            for side in (node.a, node.b) if nest else ():
                form = linear_form(side, nest)
                if form is None or const_int(form[1]) == 0:
                    continue
                b.undo(mark)
                x, y = simplify(node.a - form[1]), simplify(node.b - form[1])
                if lhs(x, b, nest, lambda: rhs(y, b, nest, k)):
                    return True
            return False

        return match


class _ParamAccess(P.Pattern):
    """A load or store of a pattern buffer parameter, bound to a region of a target buffer."""

    binds_node = False  # binds the parameter's region instead

    def __init__(self, param, info, indices, value=None):
        self.param = param
        self.info = info  # the parameter's binding key
        self.indices = indices
        self.value = value
        self.position = P.EXPR if value is None else P.STMT
        self.category = P.EXPRESSION if value is None else P.STATEMENT
        self.root_types = (ir.TensorLoad,) if value is None else (tirx.BufferStore,)
        self._dtype = str(param.dtype)
        self._scope = _scope(param)

    def children(self):
        return self.indices + (() if self.value is None else (self.value,))

    def _body_repr(self):
        return f"{self.param.name}[{', '.join(map(repr, self.indices))}]"

    def compile(self, cc):
        value = None if self.value is None else cc.compile(self.value, "value")
        failure = cc.failure(self)
        dims_key = (self.info, "dims")

        def match(node, b, nest, k):
            fail = None if failure is None else (
                lambda where, reason: failure(b, node, nest, reason, where))
            target = self.bind_buffer(node, b, fail)
            if target is None:
                return False
            indices = node.indices
            chosen = b.captures.get(dims_key)  # how an earlier access of the parameter sat in the target
            options = self.info.alignments(len(indices)) if chosen is None else (chosen,)
            if not options:
                return fail and fail((), f"{self.param.name} has {len(self.indices)} dimensions, "
                                         f"{target.name} only {len(indices)}")
            last = len(options) - 1
            for n, dims in enumerate(options):
                mark = b.mark()
                if self.bind_indices(target, indices[:], dims, b, nest, fail):
                    if chosen is None:
                        b.bind(dims_key, dims)
                    if k() if value is None else value(node.value, b, nest, k):
                        return True
                if n == last:
                    return False
                b.undo(mark)
            return False

        return match

    def bind_buffer(self, node, b, fail):
        """Bind the parameter to the accessed buffer (dtype and scope checked): the buffer,
        or None when ``node`` is not an access that fits. ``fail(where, reason)`` is told why."""
        p = self.param
        if self.value is None:
            if type(node) is not ir.TensorLoad:
                fail and fail((), f"expected a load of {p.name}, found {type(node).__name__}")
                return None
            target = node.source
        else:
            if type(node) is not tirx.BufferStore:
                fail and fail((), _not_a_store(p, node))
                return None
            target = node.buffer
        bound = b.captures.get(self.info)
        if bound is None:
            if dtype_of(target) != self._dtype:
                fail and fail((), f"{p.name} has dtype {p.dtype}, {target.name} has dtype {target.dtype}")
                return None
            if _scope(target) != self._scope:
                fail and fail((), f"{p.name} has scope {self._scope}, {target.name} has scope {_scope(target)}")
                return None
            b.bind(self.info, target)
        elif not bound.same_as(target):
            fail and fail((), f"{p.name} is bound to {bound.name}, found {target.name}")
            return None
        return target

    def bind_indices(self, target, indices, dims, b, nest, fail) -> bool:
        """Bind each dimension's offset (the tile base), with the parameter's dimensions at
        the target's dimensions ``dims``; the other target dimensions must stay fixed in the
        matched loops. False when the access does not fit that way."""
        p, info, where = self.param, self.info, self.info.positions(len(indices), dims)
        for d, idx in enumerate(indices):
            j = where[d]
            want = None
            if j is not None:
                pattern = self.indices[j]
                # a loop variable of the pattern (the common index) is a lookup
                want = b.captures.get(pattern) if type(pattern) is P.VarPattern else pattern.instantiate(b.captures)
                if want is None:
                    fail and fail((), f"cannot evaluate index {pattern!r}")
                    return False
            base = tile_base(idx, want, b.loops, nest, b.context)
            if base is None:
                if fail:
                    fail((f"index {d}",),
                         f"{target.name} index {d}: {p.name} has {len(self.indices)} dimension(s), so "
                         f"this dimension must stay fixed in the matched loops, found {idx}"
                         if j is None else
                         f"{target.name} index {d}: expected {want} plus an offset free of the "
                         f"matched loops, found {idx}")
                return False
            old = b.bases.get((info, d))
            if old is None:
                b.bind_base((info, d), base)
            elif not _same_value(old, base):
                fail and fail((f"index {d}",), f"{p.name} would bind two regions of {target.name}: "
                                               f"offsets {old} and {base} in dimension {d}")
                return False
        return True


def _not_a_store(param, node) -> str:
    """Why ``node`` is not the store to ``param`` a pattern expects; the allocations TVM's
    block lowering moves into a loop are named, since they are why a tile is missed there."""
    found = f"expected a store to {param.name}, found {type(node).__name__}"
    stmts = node.seq if type(node) is tirx.SeqStmt else [node]
    allocated = [s.buffer.name for s in stmts if type(s) is tirx.AllocBuffer]
    if not allocated:
        return found
    names = ", ".join(allocated)
    return (f"{found}: {names} {'is' if len(allocated) == 1 else 'are'} allocated inside this loop, where "
            f"TVM's block lowering (PlanAndUpdateBufferAllocationLocation, CompactBufferAllocation) moved "
            f"{'it' if len(allocated) == 1 else 'them'} and kept one iteration's region, so a tile spanning "
            f"iterations cannot be bound here (Schedule.tensorize binds it before block lowering; allocating at "
            f"an outer loop, with compute_at or cache_read, keeps the tile)")


def _bind_only_what_is_read(p) -> None:
    """A rule reads the bindings of its loop variables and scalar parameters (and binds its
    buffer parameters itself): the other nodes of its pattern need not bind, which makes
    matching cheaper."""
    if p.name is None and not isinstance(p, P.VarPattern):
        p.__dict__["binds_node"] = False
    for child in p.children():
        _bind_only_what_is_read(child)


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
        self._buffer_params = [(p, q, _ParamInfo(p, q)) for p, q in self.params if tirx.is_buffer_var(p)]
        self._infos = {key(p): info for p, _, info in self._buffer_params}
        # variables the replacement body defines itself (loops, Binds, ...): fresh ones per site
        self._body_defs = defined_vars(self.replacement_func.body)
        self._loop_vars: dict = {}
        self._scalars = {key(p): P.Wildcard(f"{self.name}:{p.name}").has_dtype(dtype_of(p))
                         for p in pp if not tirx.is_buffer_var(p)}
        # what a match shows under each parameter's name: m["A"] is the bound target buffer
        self.named = [(p.name, self._infos[key(p)]) for p in pp if tirx.is_buffer_var(p)] + \
                     [(p.name, self._scalars[key(p)].name) for p in pp if not tirx.is_buffer_var(p)]
        self._buffers = {key(p): p for p in pp if tirx.is_buffer_var(p)}
        self._check_replacement()
        # The pattern in canonical form, like the code it is matched against.
        pattern_body = canonicalize(self.pattern_func.body)
        body = self._stmt(pattern_body)
        _bind_only_what_is_read(body)
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

    def _check_replacement(self):
        """What makes every replacement well-formed, checked once here instead of per site:
        the replacement is a well-formed function using nothing but its parameters."""
        func = self.replacement_func
        try:
            tirx.analysis.verify_well_formed(func, assert_mode=True)
        except Exception as err:  # noqa: BLE001 - the verifier reports through exceptions
            raise ValueError(f"rule {self.name!r}: the replacement is ill-formed: "
                             f"{str(err).strip().splitlines()[-1]}") from None
        allowed = {key(v) for v in self._body_defs}
        for q in func.params:
            allowed.add(key(q))
            if tirx.is_buffer_var(q):
                for v in [q.data, q.elem_offset, *q.shape, *q.strides]:
                    if isinstance(v, tirx.Var):
                        allowed.add(key(v))
        for v in vars_used(func.body):
            if key(v) not in allowed:
                raise ValueError(f"rule {self.name!r}: the replacement uses {v.name}, which is not a parameter")
        # A buffer parameter is inlined into the region it binds: its loads and stores, its data
        # pointer, offset and strides. Any other use (the buffer object itself) has no such form.
        params = {key(q): q for q in func.params if tirx.is_buffer_var(q)}
        uses, inlined = {}, {}

        def on_var(v, kind):
            if key(v) in params:
                uses[key(v)] = uses.get(key(v), 0) + 1

        def on_data(call):
            if call.op.name == "tirx.buffer_data" and key(call.args[0]) in params:
                inlined[key(call.args[0])] = inlined.get(key(call.args[0]), 0) + 1

        tvm_ffi.structural_walk(func.body, (ir.Call, on_data), with_def_region_kind=(ir.Var, on_var))
        accesses = _param_accesses(func.body, params)
        for node in accesses:
            k = key(node.source if isinstance(node, ir.TensorLoad) else node.buffer)
            inlined[k] = inlined.get(k, 0) + 1
        for k, n in uses.items():
            if inlined.get(k, 0) != n:
                raise ValueError(f"rule {self.name!r}: the replacement uses buffer parameter {params[k].name} other "
                                 f"than through loads, stores and its data pointer, so it cannot be bound to a region")
        self._accesses_params = bool(accesses)

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

    # -- pattern from the pattern function ----------------------------------------------
    def _stmt(self, s):
        if isinstance(s, tirx.For):
            var = P.VarPattern()
            self._loop_vars[key(s.loop_var)] = var
            return ForPattern(self._stmt(s.body), var=var, extent=self._expr(s.extent))
        if isinstance(s, tirx.SeqStmt):
            return SeqPattern([self._stmt(x) for x in s.seq])
        if isinstance(s, tirx.IfThenElse):
            return IfPattern(self._expr(s.condition), self._stmt(s.then_case),
                               None if s.else_case is None else self._stmt(s.else_case))
        if isinstance(s, tirx.BufferStore):
            param = self._buffers.get(key(s.buffer))
            if param is None:
                raise ValueError(f"rule {self.name!r}: the pattern stores to {s.buffer.name}, which is not a parameter")
            return _ParamAccess(param, self._infos[key(param)], tuple(self._expr(i) for i in s.indices),
                                self._expr(s.value))
        if isinstance(s, tirx.Evaluate):
            return _EvaluatePattern(self._expr(s.value))
        raise ValueError(f"rule {self.name!r}: a {type(s).__name__} in a pattern function is not supported")

    def _expr(self, e):
        if isinstance(e, tirx.Var) and not tirx.is_buffer_var(e):
            k = key(e)
            if k in self._loop_vars:
                return self._loop_vars[k]
            if k in self._scalars:
                return self._scalars[k]
            raise ValueError(f"rule {self.name!r}: the pattern uses {e.name}, which is neither a loop variable nor a parameter")
        if isinstance(e, (tirx.IntImm, tirx.FloatImm)):
            return P.ConstPattern(e.value).has_dtype(dtype_of(e))
        if isinstance(e, ir.TensorLoad):
            param = self._buffers.get(key(e.source))
            if param is None:
                raise ValueError(f"rule {self.name!r}: the pattern loads {e.source.name}, which is not a parameter")
            return _ParamAccess(param, self._infos[key(param)], tuple(self._expr(i) for i in e.indices))
        if isinstance(e, tirx.Cast):
            return P.CastPattern(self._expr(e.value), dtype_of(e))
        if isinstance(e, _COMPARISONS):
            return _Compare(type(e), self._expr(e.a), self._expr(e.b))
        op = P.binop_of(e)
        if op is not None:
            return P.BinOpPattern(op, self._expr(e.a), self._expr(e.b)).has_dtype(dtype_of(e))
        if isinstance(e, ir.Call):
            return P.CallPattern(e.op.name, tuple(self._expr(a) for a in e.args)).has_dtype(dtype_of(e))
        return _Shape(e, self._expr)

    # -- preconditions and bindings -----------------------------------------------------
    def bind_params(self, bound):
        """Per buffer parameter, from what the match has ``bound`` (its Bindings): ``(q, target,
        strides, offset, base, dims, info)``, the bound buffer, the region's strides (of the
        parameter's dimensions), flat element offset, base index (one per target dimension)
        and the target dimensions the parameter's bind to; or ``(None, reason)``."""
        inner = [l.loop_var for l in bound.loops] if self._scalars else ()
        for p, wildcard in self._scalars.items():
            value = bound.captures.get(wildcard.name)
            if value is not None and inner and uses_any(value, inner):
                return None, (f"scalar parameter {wildcard.name.split(':', 1)[-1]} is bound to {value}, "
                              f"which uses a loop of the match (it is gone after the rewrite)")
        params = []
        for p, q, info in self._buffer_params:
            target = bound.captures.get(info)
            if target is None:
                return None, f"pattern parameter {p.name} is never accessed, so it binds no region"
            ty = target.ty  # the buffer's own fields (its properties are Python wrappers around these)
            shape = ty.shape[:]
            dims = bound.captures[(info, "dims")]
            base = [bound.bases[(info, d)] for d in range(len(shape))]
            index_dtype = info.index_dtype
            int_strides = _int_strides(ty, index_dtype, shape)
            affine = None
            if int_strides is None:  # symbolic strides, or not in the view's index type: the general path
                strides = _dim_strides(target)
                offset = target.elem_offset
                for b, st in zip(base, strides):
                    offset = offset + b * st
                offset = as_index(index_dtype, offset)
                view_strides = [as_index(index_dtype, simplify(strides[d])) for d in dims]
                is_compact = all(const_int(simplify(a - b)) == 0 for a, b in zip(view_strides, info.compact))
                actual_ints = [const_int(st) for st in view_strides]
            else:
                affine = _Affine.of(ty.elem_offset, [(b, st) for b, st in zip(base, int_strides)
                                                         if not (type(b) is tirx.IntImm and b.value == 0)])
                if affine is None:
                    offset = target.elem_offset
                    for b, st in zip(base, int_strides):
                        offset = offset + b * st
                actual_ints = [int_strides[d] for d in dims]
                view_strides = [_imm(index_dtype, st) for st in actual_ints]
                is_compact = actual_ints == info.compact_ints
            if affine is None:
                offset = as_index(index_dtype, simplify(offset))
            else:
                offset = affine.expr() if affine.dtype == index_dtype else as_index(index_dtype, affine.expr())
            for factor in info.factors:
                if not (affine is not None and affine.multiple_of(factor)) and \
                        const_int(simplify(tirx.floormod(offset, factor))) != 0:
                    return None, (f"the region of {target.name} bound to {p.name} starts at element {offset}, "
                                  f"not provably a multiple of offset_factor {factor}")
            if info.declared is not None:
                for d, (declared, actual, actual_int) in enumerate(zip(info.declared, view_strides, actual_ints)):
                    if declared is None:  # a variable, bound per site
                        continue
                    if actual_int is not None and isinstance(declared, int):
                        differs = declared != actual_int
                    else:
                        differs = const_int(simplify(declared - actual)) != 0
                    if differs:
                        return None, (f"replacement parameter {q.name} declares stride {declared} in dimension {d}, "
                                      f"but the region of {target.name} has stride {actual}")
            elif not is_compact and not self._scalar_only(q):
                return None, (f"replacement parameter {q.name} declares no strides and is used through a pointer, "
                              f"but the region of {target.name} is not compact (strides {view_strides})")
            elif not is_compact and self._outside_shape(q):
                return None, (f"replacement parameter {q.name} declares no strides and accesses "
                              f"{self._outside_shape(q)}, past its shape {[int(e) for e in q.shape]}, which is only "
                              f"right on a compact region, but the region of {target.name} is not compact "
                              f"(strides {view_strides})")
            if info.elem_offset is not None and const_int(simplify(info.elem_offset - offset)) != 0 \
                    and not self._scalar_only(q):
                return None, (f"replacement parameter {q.name} assumes elem_offset {q.elem_offset}, but the region of "
                              f"{target.name} starts at element {offset}")
            params.append((q, target, view_strides, offset, base, dims, info))
        return params, None

    def _scalar_only(self, q) -> bool:
        """True when the replacement uses ``q`` through loads and stores alone."""
        cache = self.__dict__.setdefault("_scalar_only_cache", {})
        if key(q) not in cache:
            cache[key(q)] = self._count_scalar_uses(q)
        return cache[key(q)]

    def _count_scalar_uses(self, q) -> bool:
        total, scalar = [0], [0]

        def on_var(v, kind):
            if v.same_as(q):
                total[0] += 1

        def on_store(s):
            if s.buffer.same_as(q):
                scalar[0] += 1

        def on_load(l):
            if l.source.same_as(q):
                scalar[0] += 1

        body = self.replacement_func.body
        tvm_ffi.structural_walk(body, [(tirx.BufferStore, on_store), (ir.TensorLoad, on_load)],
                                with_def_region_kind=(ir.Var, on_var))
        return total[0] == scalar[0]

    def _outside_shape(self, q) -> str | None:
        """The first load or store of ``q`` whose indices are not provably inside ``q.shape``.

        Through a view with the region's real strides, such an access (a vector load that
        runs on past the end of a row, say) lands outside the region unless it is compact.
        Bounds come from the replacement's loops, thread extents and ``Bind``s.
        """
        cache = self.__dict__.setdefault("_outside_cache", {})
        if key(q) in cache:
            return cache[key(q)]
        shape = [const_int(e) for e in q.shape]
        found: list = []

        def check(buf, indices, what, span):
            if found or not buf.same_as(q):
                return
            for idx, extent in zip(indices, shape):
                bounds = span(idx)
                if bounds is None or extent is None or bounds[0] < 0 or bounds[1] >= extent:
                    found.append(f"{what} {q.name}[{', '.join(str(i) for i in indices)}]")
                    return

        visit_accesses(self.replacement_func.body, check)
        cache[key(q)] = found[0] if found else None
        return cache[key(q)]

    def replace(self, m):
        """The replacement for one site: its body with the parameters inlined (see the module)."""
        binding = m[self.pattern]
        return binding.rule.replacement(m, binding.params)

    def replacement(self, m, params):
        """The replacement at the site ``m`` of this rule (of the site's index type)."""
        pairs, regions = [], {}
        for q, target, strides, offset, base, dims, info in params:
            regions[key(q)] = (target, base, dims)
            pairs.append((q, target))  # what is left of q after the accesses: its data pointer
            for d, var in info.stride_vars:
                pairs.append((var, strides[d]))
            if info.offset_var is not None:
                pairs.append((info.offset_var, offset))
        for p, wildcard in self._scalars.items():
            pairs.append((self._replacement_of[p], m[wildcard.name]))
        body = self.replacement_func.body
        if self._accesses_params:
            body = _inline_accesses(body, regions)
        # Only uses to replace: parameters are never defined inside the body.
        body = substitute(body, pairs)
        if self._body_defs:
            body = rename_defs(body, {key(v): fresh_var(v) for v in self._body_defs})
        return body


def _param_accesses(body, params: dict) -> list:
    """The loads and stores of ``body`` whose buffer is one of ``params`` (keyed by ``key``)."""
    found = []

    def on_load(load):
        if key(load.source) in params:
            found.append(load)

    def on_store(store):
        if key(store.buffer) in params:
            found.append(store)

    tvm_ffi.structural_walk(body, [(ir.TensorLoad, on_load), (tirx.BufferStore, on_store)])
    return found


def _inline_accesses(body, regions: dict):
    """``body`` with each load and store of a bound parameter made one of its target buffer
    at the region's base plus the index, as ``LowerMatchBuffer`` does (``regions`` maps
    ``key(param)`` to ``(target, base, the target dimensions of the parameter's)``)."""

    def at(base, dims, indices):
        out = list(base)
        for d, i in zip(dims, indices):
            b = base[d]
            out[d] = i if type(b) is tirx.IntImm and b.value == 0 else b + i
        return out

    def on_load(load):
        region = regions.get(key(load.source))
        if region is None:
            return load
        target, base, dims = region
        return tirx.BufferLoad(target, at(base, dims, load.indices))

    def on_store(store):
        region = regions.get(key(store.buffer))
        if region is None:
            return store
        target, base, dims = region
        return tirx.BufferStore(target, store.value, at(base, dims, store.indices))

    return tvm_ffi.structural_map(body, [(ir.TensorLoad, on_load), (tirx.BufferStore, on_store)])


class _EvaluatePattern(StmtPattern):
    """``T.evaluate(expr)`` in a pattern function."""

    root_types = (tirx.Evaluate,)

    def __init__(self, value):
        self.value = value

    def children(self):
        return (self.value,)

    def _body_repr(self):
        return f"evaluate({self.value!r})"

    def compile(self, cc):
        value, fail = cc.compile(self.value, "value"), cc.failure(self)

        def match(node, b, nest, k):
            if type(node) is not tirx.Evaluate:
                return fail and fail(b, node, nest, f"expected an evaluate, found {type(node).__name__}")
            return value(node.value, b, nest, k)

        return match


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

