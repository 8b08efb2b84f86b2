"""Binding a rule's buffer parameters to regions of the code, by TVM's ``match_buffer`` rules.

A pattern function's buffer parameter binds to a sub-region of the buffer its loads and
stores meet: any offset (the tile base of each index, :func:`tirpat.tir.region.tile_base`),
dimensions where the region has extent 1 dropped, ``offset_factor`` as an alignment
precondition, dtype and scope checked. TVM drops only leading dimensions; any dimension fixed
in the matched loops can go, as long as the parameter's dimensions keep their order (a
``(16,)`` parameter binds ``A[0, i, 0]`` of a ``(1, 16, 1)`` buffer, or a column, whose
stride the replacement's declared strides must then allow), leading ones tried first.
:func:`bind_params` then checks the replacement's declarations (strides, ``elem_offset``,
alignment) against each bound region, and gives what :mod:`tirpat.tir.inlining` inlines.

>>> A = tirx.decl_buffer((16,), "int8", "A")
>>> ParamInfo(A, A, tirx.Evaluate(0)).alignments(3)      # the target dimensions A can sit at
((2,), (1,), (0,))
"""

from __future__ import annotations

import functools
import itertools

import tvm_ffi
from tvm import ir, tirx

from . import pattern as P
from .analysis import (Affine, const_int, dim_strides, dtype_of, imm, int_strides, same_value, simplify,
                       uses_any, visit_accesses)
from .index_dtype import as_index
from .region import tile_base


def scope_of(buf: tirx.Buffer) -> str:
    """The storage scope of a buffer, ``"global"`` for the default one.

    >>> scope_of(tirx.decl_buffer((4,), "int8", "A")), scope_of(tirx.decl_buffer((4,), "int8", "S", scope="shared"))
    ('global', 'shared')
    """
    s = buf.scope()
    return "global" if s in ("", "global") else s


class ParamInfo:
    """What :func:`bind_params` needs of a (pattern ``p``, replacement ``q``) buffer parameter
    pair, computed once; ``body`` is the replacement's body (how it uses ``q``). It is also the
    key the parameter's bound buffer is captured under in a match."""

    def __init__(self, p, q, body):
        self.param, self.body = q, body
        self.rank = len(p.shape)
        self.compact = dim_strides(tirx.decl_buffer(q.shape, q.dtype))
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

    @functools.cached_property
    def scalar_only(self) -> bool:
        """True when the replacement uses its parameter through loads and stores alone."""
        q = self.param
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

        tvm_ffi.structural_walk(self.body, [(tirx.BufferStore, on_store), (ir.TensorLoad, on_load)],
                                with_def_region_kind=(ir.Var, on_var))
        return total[0] == scalar[0]

    @functools.cached_property
    def outside_shape(self) -> str | None:
        """The first load or store of the replacement's parameter whose indices are not
        provably inside its shape.

        Through a view with the region's real strides, such an access (a vector load that
        runs on past the end of a row, say) lands outside the region unless it is compact.
        Bounds come from the replacement's loops, thread extents and ``Bind``s.
        """
        q = self.param
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

        visit_accesses(self.body, check)
        return found[0] if found else None


class ParamAccess(P.Pattern):
    """A load (``value`` None) or store of a pattern buffer parameter, with the patterns of its
    indices (and stored value), bound to a region of a target buffer: ``info`` is the
    parameter's :class:`ParamInfo`.

    >>> A = tirx.decl_buffer((8,), "int8", "A")
    >>> ParamAccess(A, ParamInfo(A, A, tirx.Evaluate(0)), (P.VarPattern(),))
    A[is_var()]
    """

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
        self._scope = scope_of(param)

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
                fail and fail((), not_a_store(p, node))
                return None
            target = node.buffer
        bound = b.captures.get(self.info)
        if bound is None:
            if dtype_of(target) != self._dtype:
                fail and fail((), f"{p.name} has dtype {p.dtype}, {target.name} has dtype {target.dtype}")
                return None
            if scope_of(target) != self._scope:
                fail and fail((), f"{p.name} has scope {self._scope}, {target.name} has scope {scope_of(target)}")
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
            elif not same_value(old, base):
                fail and fail((f"index {d}",), f"{p.name} would bind two regions of {target.name}: "
                                               f"offsets {old} and {base} in dimension {d}")
                return False
        return True


def not_a_store(param: tirx.Buffer, node: tirx.Stmt) -> str:
    """Why ``node`` is not the store to ``param`` a pattern expects; the allocations TVM's
    block lowering moves into a loop are named, since they are why a tile is missed there.

    >>> not_a_store(tirx.decl_buffer((4,), "int8", "B"), tirx.Evaluate(0))
    'expected a store to B, found Evaluate'
    """
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


def bind_params(bound, buffer_params: list, scalars: dict) -> tuple:
    """Per buffer parameter, from what the match has ``bound`` (its Bindings): ``(q, target,
    strides, offset, base, dims, info)``, the bound buffer, the region's strides (of the
    parameter's dimensions), flat element offset, base index (one per target dimension)
    and the target dimensions the parameter's bind to; or ``(None, reason)``.
    ``buffer_params``: ``[(p, q, ParamInfo), ...]``; ``scalars``: the wildcards of the
    scalar parameters, by ``key`` (their values must not use the matched loops).

    >>> bind_params(None, [], {})
    ([], None)
    """
    inner = [l.loop_var for l in bound.loops] if scalars else ()
    for p, wildcard in scalars.items():
        value = bound.captures.get(wildcard.name)
        if value is not None and inner and uses_any(value, inner):
            return None, (f"scalar parameter {wildcard.name.split(':', 1)[-1]} is bound to {value}, "
                          f"which uses a loop of the match (it is gone after the rewrite)")
    params = []
    for p, q, info in buffer_params:
        target = bound.captures.get(info)
        if target is None:
            return None, f"pattern parameter {p.name} is never accessed, so it binds no region"
        ty = target.ty  # the buffer's own fields (its properties are Python wrappers around these)
        shape = ty.shape[:]
        dims = bound.captures[(info, "dims")]
        base = [bound.bases[(info, d)] for d in range(len(shape))]
        index_dtype = info.index_dtype
        ints = int_strides(ty, index_dtype, shape)
        affine = None
        if ints is None:  # symbolic strides, or not in the view's index type: the general path
            strides = dim_strides(target)
            offset = target.elem_offset
            for b, st in zip(base, strides):
                offset = offset + b * st
            offset = as_index(index_dtype, offset)
            view_strides = [as_index(index_dtype, simplify(strides[d])) for d in dims]
            is_compact = all(const_int(simplify(a - b)) == 0 for a, b in zip(view_strides, info.compact))
            actual_ints = [const_int(st) for st in view_strides]
        else:
            affine = Affine.of(ty.elem_offset, [(b, st) for b, st in zip(base, ints)
                                                    if not (type(b) is tirx.IntImm and b.value == 0)])
            if affine is None:
                offset = target.elem_offset
                for b, st in zip(base, ints):
                    offset = offset + b * st
            actual_ints = [ints[d] for d in dims]
            view_strides = [imm(index_dtype, st) for st in actual_ints]
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
        elif not is_compact and not info.scalar_only:
            return None, (f"replacement parameter {q.name} declares no strides and is used through a pointer, "
                          f"but the region of {target.name} is not compact (strides {view_strides})")
        elif not is_compact and info.outside_shape:
            return None, (f"replacement parameter {q.name} declares no strides and accesses "
                          f"{info.outside_shape}, past its shape {[int(e) for e in q.shape]}, which is only "
                          f"right on a compact region, but the region of {target.name} is not compact "
                          f"(strides {view_strides})")
        if info.elem_offset is not None and const_int(simplify(info.elem_offset - offset)) != 0 \
                and not info.scalar_only:
            return None, (f"replacement parameter {q.name} assumes elem_offset {q.elem_offset}, but the region of "
                          f"{target.name} starts at element {offset}")
        params.append((q, target, view_strides, offset, base, dims, info))
    return params, None

