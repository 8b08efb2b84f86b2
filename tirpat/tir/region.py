"""Regions: which elements of a buffer a matched loop nest touches.

A :class:`Region` is the affine footprint of one access inside a nest: the index at the
nest's origin (``base``) and the element stride of each nest loop. A :class:`CopyRegion`
pairs the destination and source regions of a copy nest with its extents, cast and
padding — everything a DMA engine needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tvm import ir, tirx

from .analysis import const_int, dtype_of, key, linear_form, row_major_strides, simplify, substitute, uses_any, vars_used


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
        dim_strides = row_major_strides(self.buffer)
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
    expressions per loop. A *partial* copy (a guarded store with no else, as at the ragged
    edge of a tiled loop) has ``predicate`` and ``pad`` but ``pad_value`` None: the elements
    outside the guard are left as they are.

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
    dim_strides = row_major_strides(buffer)
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


def padding(predicate, loops: Sequence) -> tuple | None:
    """Per-loop ``(before, after)``: how many leading and trailing iterations of each loop
    a guard excludes, or None if it is not a conjunction of single-variable affine bounds on
    the loop variables. Useful for guarded (partial-tile) stores as well as padded copies.

    >>> from tvm import tirx
    >>> i = tirx.Var("i", "int32")
    >>> loop = tirx.For(i, 0, 14, tirx.ForKind.SERIAL, tirx.Evaluate(0))
    >>> tp.padding(tirx.And(1 <= i, i < 11), [loop])      # i runs over [1, 11) of [0, 14)
    ((1, 3),)
    """
    conjuncts = []
    stack = [predicate]
    while stack:
        e = stack.pop()
        if isinstance(e, tirx.And):
            stack += [e.a, e.b]
        else:
            conjuncts.append(e)
    loop_vars = [l.loop_var for l in loops]
    lower = [[] for _ in loops]
    upper = [[] for _ in loops]
    for c in conjuncts:
        # Bring every comparison to "expr >= 0" or "expr > 0" with integer arithmetic.
        if isinstance(c, tirx.LE):
            expr = c.b - c.a
        elif isinstance(c, tirx.LT):
            expr = c.b - c.a - 1
        elif isinstance(c, tirx.GE):
            expr = c.a - c.b
        elif isinstance(c, tirx.GT):
            expr = c.a - c.b - 1
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
    return tuple(pads)


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
