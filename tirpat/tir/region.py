"""Regions: which elements of a buffer a matched loop nest touches.

A :class:`Region` is the affine footprint of one access inside a nest: the index at the
nest's origin (``base``) and the element stride of each nest loop. A :class:`CopyRegion`
pairs the destination and source regions of a copy nest with its extents, cast and
padding — everything a DMA engine needs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import tvm_ffi
from tvm import ir, sym, tirx

from .analysis import (const_int, dtype_of, key, linear_form, int_strides, simplify, substitute, uses_any,
                       vars_used)
from .canonical import stepped


class RegionError(ValueError):
    """An access whose footprint is not an affine region with constant strides."""


@dataclass(frozen=True)
class Region:
    """The elements of ``buffer`` that a nest accesses.

    ``base`` has one expression per buffer dimension (the index at the nest's origin, free
    of the nest's loop variables); ``strides`` has one int per nest loop (its element stride
    in the row-major flattened buffer); ``extents`` has one per nest loop.

    >>> from tvm import tirx
    >>> io, i = tirx.Var("io", "int32"), tirx.Var("i", "int32")
    >>> A, B = tirx.decl_buffer((8, 8), "int8", "A"), tirx.decl_buffer((4,), "int8", "B")
    >>> nest = tirx.For(i, 0, 4, tirx.ForKind.SERIAL, tirx.BufferStore(B, tirx.BufferLoad(A, [io, i * 2 + 1]), [i]))
    >>> r = tp.is_copy(name="c").match(nest)["c"].src
    >>> r.base, r.strides, r.offset           # every other element of row io, from column 1
    ((io, 1), (2,), io * 8 + 1)
    """

    buffer: object
    base: tuple
    strides: tuple
    extents: tuple

    @property
    def offset(self):
        """The flattened element offset of ``base`` (row-major, or the buffer's strides)."""
        dim_strides = int_strides(self.buffer)
        if dim_strides is None:
            raise RegionError(f"buffer {self.buffer.name} has non-constant strides")
        total = 0
        for b, s in zip(self.base, dim_strides):
            total = total + b * s
        return simplify(total) if not isinstance(total, int) else tirx.IntImm("int32", total)

    def __repr__(self):
        base = ", ".join(str(b) for b in self.base)
        return f"Region({self.buffer.name}[{base}], strides={list(self.strides)}, extents={list(self.extents)})"


@dataclass(frozen=True)
class CopyRegion:
    """A copy nest ``dst[...] = src[...]`` seen as a DMA.

    ``extents`` has one int per loop (outermost first); ``cast`` is None or the dtype the
    value is cast to; a padded copy has ``predicate`` (its guard), ``pad_value`` and, when
    the guard is a conjunction of affine bounds, ``pad``: one ``(before, after)`` pair of
    expressions per loop (:func:`padding`; a condition on enclosing loops alone, as on a
    pooling window's row, excludes every iteration where it fails, and
    :func:`split_guard` keeps it apart). A *partial* copy (a guarded store with no else, as
    at the ragged edge of a tiled loop) has ``predicate`` and ``pad`` but ``pad_value``
    None: the elements outside the guard are left as they are.

    >>> from tvm import tirx
    >>> i = tirx.Var("i", "int32")
    >>> A, B = tirx.decl_buffer((8,), "int8", "A"), tirx.decl_buffer((10,), "int8", "B")
    >>> padded = tirx.if_then_else(tirx.And(1 <= i, i < 9), tirx.BufferLoad(A, [i - 1]), tirx.IntImm("int8", 0))
    >>> c = tp.is_copy(name="c").match(tirx.For(i, 0, 10, tirx.ForKind.SERIAL, tirx.BufferStore(B, padded, [i])))["c"]
    >>> c.extents, c.pad, c.pad_value, c.src.offset
    ((10,), ((1, 1),), T.int8(0), -1)
    """

    dst: Region
    src: Region
    extents: tuple
    cast: str | None = None
    pad_value: object = None
    predicate: object = None
    pad: tuple | None = None

    def __repr__(self):
        extra = "" if self.cast is None else f", cast={self.cast!r}"
        if self.predicate is not None:
            pads = None if self.pad is None else [(str(a), str(b)) for a, b in self.pad]
            extra += f", pad_value={self.pad_value}, pad={pads}"
        return f"CopyRegion(dst={self.dst!r}, src={self.src!r}, extents={list(self.extents)}{extra})"


def _extent_value(loop):
    value = const_int(loop.extent)
    return loop.extent if value is None else value


def access_region(buffer, indices: Sequence, loops: Sequence) -> Region:
    """The Region of ``buffer[indices]`` inside ``loops`` (For nodes, outermost first).

    Raises :class:`RegionError` when an index is not affine in the loop variables or a
    stride is not an integer constant.
    """
    loop_vars = [l.loop_var for l in loops]
    dim_strides = int_strides(buffer)
    if dim_strides is None:
        raise RegionError(f"buffer {buffer.name} has non-constant strides "
                          f"{list(buffer.strides) or list(buffer.shape)}")
    for n, l in enumerate(loops):
        if uses_any(l.min, loop_vars[:n]) or uses_any(l.extent, loop_vars[:n]):
            raise RegionError(f"the nest is not rectangular: loop {l.loop_var.name} runs over "
                              f"[{l.min}, {l.min} + {l.extent}), which depends on an outer loop of the nest")
    origin = [(l.loop_var, l.min) for l in loops]
    strides = [0] * len(loops)
    base = []
    for dim, index in enumerate(indices):
        form = linear_form(index, loop_vars)
        if form is None:
            raise RegionError(f"index {index} of {buffer.name} is not affine in the loop variables "
                              f"{[v.name for v in loop_vars]}")
        coeffs, _ = form
        base.append(simplify(substitute(index, origin)))
        for n, c in enumerate(coeffs):
            c_int = const_int(c)
            if c_int is None:
                raise RegionError(f"index {index} of {buffer.name} has the non-constant stride {c} "
                                  f"for loop {loop_vars[n].name}")
            if c_int == 0:
                continue
            if dim_strides is None:
                raise RegionError(f"buffer {buffer.name} has non-constant strides {list(buffer.shape)}")
            strides[n] += c_int * dim_strides[dim]
    return Region(buffer, tuple(base), tuple(strides), tuple(_extent_value(l) for l in loops))


# ---------------------------------------------------------------------------------------
# tile bases: an index as a base free of the nest's loops plus what the pattern expects
# ---------------------------------------------------------------------------------------
def tile_base(idx, want, loops: Sequence, nest: Sequence, context: Sequence = ()):
    """``idx - want`` (``idx`` itself when ``want`` is None) as an expression free of the
    ``nest`` variables: the base of a tile, ``idx == base + want``; None when it depends on
    them. ``loops`` are the matched For nodes (their ranges), ``context`` the enclosing ones.

    An index written after ``CompactBufferAllocation`` or a layout transform can be affine
    in the nest only given its loops' bounds: ``(k0*8 + k1*4 + i) % 16 * 16`` is
    ``(k0*8 + k1*4) % 16 * 16 + i*16`` when ``0 <= i < 4``. Each ``floormod`` and
    ``floordiv`` by a constant is split first (:func:`split_loop_part`), then the
    difference is simplified with the loops bound. A base that uses only the enclosing
    (``context``) loops and takes one value over all their iterations is that value
    (TVM's simplifier cannot see that ``(k0*8) % 16 * 16 - max(0, k0*128 - k0 // 2 * 256)``
    is 0; counting through the iterations can, when there are few of them).

    >>> ko, i = tirx.Var("ko", "int32"), tirx.Var("i", "int32")
    >>> loop = tirx.For(i, 0, 4, tirx.ForKind.SERIAL, tirx.Evaluate(0))
    >>> tile_base(ko * 16 + i, i, [loop], [i]), tile_base((ko * 8 + i) % 16, i, [loop], [i])
    (ko * 16, ko % 2 * 8)
    """
    base = idx if want is None else _minus(idx, want)
    if not nest or not uses_any(base, nest):
        return base
    ana = sym.Analyzer()
    for loop in loops:
        ana.bind(loop.loop_var, ir.Range.from_min_extent(loop.min, loop.extent))
    idx = split_loop_part(idx, nest, ana)
    diff = ana.simplify(idx if want is None else idx - want)
    if uses_any(diff, nest):
        return None
    value = _single_value(diff, context)
    return diff if value is None else tirx.IntImm(dtype_of(diff), value)


def _minus(idx, want):
    """``idx - want`` simplified; canonical ``base + want`` and ``want`` itself without a call."""
    if idx.same_as(want):
        return tirx.IntImm(dtype_of(idx), 0)
    if type(idx) is tirx.Add:  # an Add's operands have its dtype, so either one is the base
        if idx.b.same_as(want):
            return idx.a
        if idx.a.same_as(want):
            return idx.b
    return simplify(idx - want)


_MAX_POINTS = 1024  # iterations counted through by _single_value


def _single_value(expr, loops) -> int | None:
    """The one value ``expr`` takes over every iteration of ``loops`` (constant bounds,
    at most ``_MAX_POINTS`` iterations, and the only variables ``expr`` uses), else None."""
    if type(expr) is tirx.IntImm:
        return None
    used = {key(v) for v in vars_used(expr)}
    ranges = []
    for loop in loops:
        if key(loop.loop_var) in used:
            lo, n = const_int(loop.min), const_int(loop.extent)
            if lo is None or n is None or stepped(loop):
                return None
            ranges.append((loop.loop_var, range(lo, lo + n)))
            used.discard(key(loop.loop_var))
    if used or not ranges or math.prod(len(r) for _, r in ranges) > _MAX_POINTS:
        return None
    value = None
    for point in itertools.product(*(r for _, r in ranges)):
        at = const_int(substitute(expr, [(v, tirx.IntImm(dtype_of(v), x)) for (v, _), x in zip(ranges, point)]))
        if at is None or value is not None and at != value:
            return None
        value = at
    return value


def split_loop_part(expr, nest, ana):
    """``expr`` with ``floormod(S + A, c)`` rewritten to ``floormod(S, c) + A`` and
    ``floordiv(S + A, c)`` to ``floordiv(S, c)``, where ``A`` holds the terms that use the
    ``nest`` variables, wherever that is exact: ``S`` is ``r`` modulo ``M = gcd(c, the
    stride TVM's modular analysis finds for S)`` and ``r + A`` stays in ``[0, M)`` (``A``'s
    bounds from the analyzer ``ana``)."""
    if type(expr) not in (tirx.FloorMod, tirx.FloorDiv, tirx.Add, tirx.Sub, tirx.Mul):
        return expr

    def on(node):
        if type(node) not in (tirx.FloorMod, tirx.FloorDiv) or type(node.b) is not tirx.IntImm or node.b.value <= 0:
            return node
        terms = []
        stack = [(node.a, 1)]
        while stack:  # the terms of the sum, with their signs
            e, sign = stack.pop()
            if type(e) is tirx.Add or type(e) is tirx.Sub:
                stack.append((e.a, sign))
                stack.append((e.b, sign if type(e) is tirx.Add else -sign))
            else:
                terms.append(e if sign > 0 else -e)
        fixed = [t for t in terms if not uses_any(t, nest)]
        moving = [t for t in terms if uses_any(t, nest)]
        if not fixed or not moving:
            return node
        S, A = fixed[0], moving[0]
        for t in fixed[1:]:
            S = S + t
        for t in moving[1:]:
            A = A + t
        c = node.b.value
        mod = ana.modular_set(S)
        M = math.gcd(int(mod.coeff), c)
        if M <= 1:
            return node
        r = int(mod.base) % M
        bound = ana.const_int_bound(A)
        if not (0 <= r + bound.min_value and r + bound.max_value < M):
            return node
        if type(node) is tirx.FloorMod:
            return tirx.floormod(S, node.b) + A
        return tirx.floordiv(S, node.b)

    return tvm_ffi.structural_map(expr, [(tirx.FloorMod, on), (tirx.FloorDiv, on)])


def padding(predicate, loops: Sequence) -> tuple | None:
    """Per-loop ``(before, after)``: how many leading and trailing iterations of each loop
    a guard excludes, or None if it is not a conjunction of single-variable affine bounds on
    the loop variables and conditions on enclosing loops alone. Useful for guarded
    (partial-tile) stores as well as padded copies. A condition on enclosing loops alone
    excludes everything where it is false (a pooling window's row that lies in the padding):
    every loop's ``before`` is then its extent (:func:`split_guard` keeps it apart); with no
    loops there is no extent to say that by, and the result is None.

    >>> from tvm import tirx
    >>> r, i = tirx.Var("r", "int32"), tirx.Var("i", "int32")
    >>> loop = tirx.For(i, 0, 14, tirx.ForKind.SERIAL, tirx.Evaluate(0))
    >>> tp.padding(tirx.And(1 <= i, i < 11), [loop])      # i runs over [1, 11) of [0, 14)
    ((1, 3),)
    >>> tp.padding(tirx.And(r >= 1, i < 11), [loop])      # nothing at all unless r >= 1
    ((T.if_then_else(1 <= r, 0, 14), T.if_then_else(1 <= r, 3, 0)),)
    """
    split = split_guard(predicate, loops)
    if split is None:
        return None
    pads, outer = split
    if outer is None:
        return pads
    if not loops:
        return None
    return tuple((simplify(tirx.if_then_else(outer, before, l.extent)),
                  simplify(tirx.if_then_else(outer, after, tirx.IntImm(dtype_of(after), 0))))
                 for (before, after), l in zip(pads, loops))


def split_guard(predicate, loops: Sequence) -> tuple | None:
    """``(pads, outer)``: the per-loop ``(before, after)`` that the guard's bounds on the
    loop variables give (see :func:`padding`), and the conjunction of its conjuncts that use
    none of them, a condition on enclosing loops (None when there is none). None when a
    conjunct that uses the loop variables is not a single-variable affine bound.

    >>> from tvm import tirx
    >>> r, i = tirx.Var("r", "int32"), tirx.Var("i", "int32")
    >>> loop = tirx.For(i, 0, 14, tirx.ForKind.SERIAL, tirx.Evaluate(0))
    >>> tp.split_guard(tirx.And(r >= 1, i < 11), [loop])   # where r >= 1, i runs over [0, 11)
    (((0, 3),), r >= 1)
    """
    loop_vars = [l.loop_var for l in loops]
    lower = [[] for _ in loops]
    upper = [[] for _ in loops]
    outer = []
    for c in conjuncts(predicate):
        if not uses_any(c, loop_vars):
            outer.append(c)
            continue
        bound = loop_bound(c, loop_vars)
        if bound is None:
            return None
        n, a, rest = bound
        # a*v + rest >= 0 with v = min + t, t in [0, extent)
        rest = rest + a * loops[n].min
        if a > 0:   # t >= ceil(-rest / a)
            lower[n].append(tirx.floordiv(-rest + (a - 1), a))
        else:       # t <= floor(rest / -a)
            upper[n].append(tirx.floordiv(rest, -a))
    pads = []
    for n, l in enumerate(loops):
        ext = l.extent
        zero = tirx.IntImm(dtype_of(ext), 0)  # pads are in the loop's index type
        before = zero
        if lower[n]:
            for lo in lower[n]:
                before = tirx.max(before, lo)
            before = simplify(tirx.min(before, ext))
        after = zero
        for hi in upper[n]:
            after = tirx.max(after, ext - 1 - hi)
        after = simplify(tirx.min(after, ext))
        pads.append((before, after))
    return tuple(pads), conjunction(outer)


def guards_in_extents(node, levels: Sequence[int], ranges: Sequence = ()):
    """The perfect nest from the For ``node`` with the upper bounds that guard its innermost
    body, on the variables of its loops at ``levels`` (0 is ``node``), moved into those
    loops' extents; None when there are none. ``for i in range(16): if 16*o + i < 50: S``
    (the last, partial tile a ``split`` leaves) is ``for i in range(min(16, 50 - 16*o)): S``.
    The For nodes ``ranges`` (the enclosing loops) bound the simplification of the extents.

    >>> from tvm import tirx
    >>> o, i = tirx.Var("o", "int32"), tirx.Var("i", "int32")
    >>> A = tirx.decl_buffer((50,), "int8", "A")
    >>> guarded = tirx.IfThenElse(o * 16 + i < 50, tirx.BufferStore(A, tirx.IntImm("int8", 0), [o * 16 + i]), None)
    >>> outer = tirx.For(o, 0, 4, tirx.ForKind.SERIAL, tirx.For(i, 0, 16, tirx.ForKind.SERIAL, guarded))
    >>> print(guards_in_extents(outer.body, [0], [outer]).extent)
    T.min(16, 50 - o * 16)
    """
    chain, cur = [], node
    while type(cur) is tirx.For:
        chain.append(cur)
        cur = cur.body
    if type(cur) is not tirx.IfThenElse or cur.else_case is not None:
        return None
    loop_vars = [l.loop_var for l in chain]
    ends: dict = {}
    kept = []
    for c in conjuncts(cur.condition):
        bound = loop_bound(c, loop_vars)
        if bound is not None and bound[0] in levels and bound[1] < 0 and not stepped(chain[bound[0]]):
            n, a, rest = bound   # a*v + rest >= 0, v = min + t: t < floor((rest + a*min) / -a) + 1
            ends.setdefault(n, []).append(tirx.floordiv(rest + a * chain[n].min, -a) + 1)
        else:
            kept.append(c)
    if not ends:
        return None
    ana = sym.Analyzer()
    for loop in ranges:
        ana.bind(loop.loop_var, ir.Range.from_min_extent(loop.min, loop.extent))
    body = cur.then_case if not kept else tirx.IfThenElse(conjunction(kept), cur.then_case, None)
    for n in reversed(range(len(chain))):
        loop = chain[n]
        extent = loop.extent
        if n in ends:
            for end in ends[n]:
                extent = tirx.min(extent, end)
            extent = ana.simplify(tirx.max(extent, tirx.IntImm(dtype_of(extent), 0)))
        body = tirx.For(loop.loop_var, loop.min, extent, loop.kind, body, loop.thread_binding, loop.annotations,
                        loop.step)
    return body


def loop_bound(cond, loop_vars: Sequence) -> tuple | None:
    """A comparison as a bound on one of ``loop_vars``: ``(n, a, rest)`` meaning
    ``a * loop_vars[n] + rest >= 0`` (``a`` a nonzero int, ``rest`` free of ``loop_vars``),
    or None when it is not one (not a comparison, not affine, several variables).

    >>> from tvm import tirx
    >>> o, i = tirx.Var("o", "int32"), tirx.Var("i", "int32")
    >>> loop_bound(o * 16 + i < 50, [i])            # -i + (49 - 16*o) >= 0
    (0, -1, 49 - o * 16)
    """
    # Bring the comparison to "expr >= 0" with integer arithmetic.
    if isinstance(cond, tirx.LE):
        expr = cond.b - cond.a
    elif isinstance(cond, tirx.LT):
        expr = cond.b - cond.a - 1
    elif isinstance(cond, tirx.GE):
        expr = cond.a - cond.b
    elif isinstance(cond, tirx.GT):
        expr = cond.a - cond.b - 1
    else:
        return None
    form = linear_form(expr, loop_vars)
    if form is None:
        return None
    coeffs, rest = form
    nonzero = [(n, const_int(k)) for n, k in enumerate(coeffs) if const_int(k) != 0]
    if len(nonzero) != 1 or nonzero[0][1] is None:
        return None
    n, a = nonzero[0]
    return n, a, rest


def conjuncts(predicate) -> list:
    """The conditions of ``a and b and ...``, in order (the predicate itself if not an ``and``)."""
    if isinstance(predicate, tirx.And):
        return conjuncts(predicate.a) + conjuncts(predicate.b)
    return [predicate]


def conjunction(conditions: Sequence):
    """``c0 and c1 and ...``; None for no conditions."""
    out = None
    for c in conditions:
        out = c if out is None else tirx.And(out, c)
    return out


def footprint(region: Region) -> tuple | None:
    """The ``(lowest, highest)`` element, relative to ``region.offset``, that a region with
    constant extents touches; ``()`` when it touches none; None when an extent is symbolic."""
    lo = hi = 0
    for stride, extent in zip(region.strides, region.extents):
        if not isinstance(extent, int):
            return None
        if extent == 0:
            return ()
        lo += min(0, stride * (extent - 1))
        hi += max(0, stride * (extent - 1))
    return lo, hi


class Aliases:
    """Which buffers share memory, learnt from the ``DeclBuffer`` statements passed so far.

    A view declared over another buffer's data (``T.decl_buffer(..., data=A.data)``, printed
    ``A.view(...)``) shares A's memory, its elements counted from the same pointer with its
    own ``elem_offset``; so do two views of one handle. A view over other pointer arithmetic
    is known only to share memory with the buffers and handles it uses. Any other buffer
    owns its memory.

    >>> from tvm import tirx
    >>> A, B = tirx.decl_buffer((16,), "int32", "A"), tirx.decl_buffer((16,), "int32", "B")
    >>> V = tirx.decl_buffer((8,), "int32", "V", data=A.data, elem_offset=8)
    >>> aliases = Aliases()
    >>> aliases.declare(tirx.DeclBuffer(V, data=A.data))
    >>> aliases.shared(V, A), aliases.shared(V, B)
    (True, False)
    """

    def __init__(self):
        self._roots: dict = {}  # key(buffer) -> (frozenset of root keys, offsets comparable)

    def declare(self, decl) -> None:
        """Learn from one ``DeclBuffer``."""
        data = decl.data
        if data is None:
            return
        if isinstance(data, ir.Call) and getattr(data.op, "name", "") == "tirx.buffer_data":
            root = self.root(data.args[0])
        elif isinstance(data, tirx.Var) and not tirx.is_buffer_var(data):
            root = (frozenset({key(data)}), True)
        else:
            roots: set = set()
            for v in vars_used(data):
                roots |= self.root(v)[0] if tirx.is_buffer_var(v) else {key(v)}
            root = (frozenset(roots), False)
        self._roots[key(decl.buffer)] = root

    def root(self, buffer) -> tuple:
        """``(roots, exact)``: the memory ``buffer`` lives in, and whether its ``elem_offset``
        counts from that memory's start."""
        found = self._roots.get(key(buffer))
        return found if found is not None else (frozenset({key(buffer)}), True)

    def shared(self, a, b) -> bool:
        """True when buffers ``a`` and ``b`` may share memory."""
        return bool(self.root(a)[0] & self.root(b)[0])

    def overlap(self, written: Region, read: Region) -> str | None:
        """Why the elements of ``written`` may be among those of ``read`` (then copying one to
        the other is not a plain copy: the order of the elements matters), or None."""
        a, b = written.buffer, read.buffer
        (roots_a, exact_a), (roots_b, exact_b) = self.root(a), self.root(b)
        if not roots_a & roots_b:
            return None
        what = f"{a.name} is both written and read" if a.same_as(b) else \
            f"{a.name} and {b.name} are views of one buffer's memory"
        if not (exact_a and exact_b):
            return f"{what}, at offsets that are not known"
        if str(a.dtype) != str(b.dtype):
            return f"{what}, with different element types"
        spans = footprint(written), footprint(read)
        if () in spans:
            return None
        distance = const_int(simplify((a.elem_offset + written.offset) - (b.elem_offset + read.offset)))
        if distance is None or None in spans:
            return f"{what}, and the copy's regions are not at a constant distance from each other"
        (lo_a, hi_a), (lo_b, hi_b) = spans
        if distance + hi_a < lo_b or hi_b < distance + lo_a:
            return None
        return f"{what}, and the elements written overlap the elements read"
