"""Regions: which elements of a buffer a matched loop nest touches.

A :class:`Region` is the affine footprint of one access inside a nest: the index at the
nest's origin (``base``) and the element stride of each nest loop. A :class:`CopyRegion`
pairs the destination and source regions of a copy nest with its extents, cast and
padding — everything a DMA engine needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tvm import tirx

from .analysis import const_int, dtype_of, linear_form, row_major_strides, simplify, substitute, uses_any


class RegionError(ValueError):
    """An access whose footprint is not an affine region with constant strides."""


@dataclass(frozen=True)
class Region:
    """The elements of ``buffer`` that a nest accesses.

    ``base`` has one expression per buffer dimension (the index at the nest's origin, free
    of the nest's loop variables); ``strides`` has one int per nest loop (its element stride
    in the row-major flattened buffer); ``extents`` has one per nest loop.

    >>> r = m.region("A")                  # doctest: +SKIP
    >>> r.base, r.strides, r.offset        # doctest: +SKIP
    ([i_0 * 16, k_0 * 16], (64, 1), i_0 * 1024 + k_0 * 16)
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

    >>> m = tp.is_copy(name="c").match(nest)     # doctest: +SKIP
    >>> c = m["c"]; c.src.offset, c.dst.strides, c.extents, c.pad   # doctest: +SKIP
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

    >>> tp.padding(tp.is_copy(name="c").match(nest)["c"].predicate, m.loops)   # doctest: +SKIP
    ((1, 3),)                       # 1 <= i and i < 11 over for i in range(14)
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
