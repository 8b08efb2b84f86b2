"""CPU schedules for the layout loops a partition leaves on the host: its copies run in the
order of the memory they write, in tiles of the memory they read.

An offloaded partition keeps some work on the CPU: the copies between the model's NCHW
tensors and the device's channels-last rows (an input staged as ``x_global[h, w, c] =
x[c, h, w]``, a result written back as ``y[c, h, w] = y_global[h, w, c]``), the zero padding
of an input, the im2col matrix of a convolution whose few input channels the device would
pad. The schedule states them in the order of the tensor they come from, which for half of
them writes memory a channel count apart at every step; they are also compiled at -O0
(:data:`tirpat.model.native.OFFLOADED_OPT_LEVEL`), so nothing reorders them later. On the
PaddleOCR v6 detector those loops were ~7% of a steady call (~25 of ~340 ms; ~7 ms once
ordered as below).

:func:`order_copy_nests` reorders such a loop nest (perfect, serial, constant extents, a
single store of values read from other buffers) so that its loops follow the strides of
the store, largest outside: consecutive iterations write consecutive bytes. When the
innermost loop then reads memory far apart (a transpose), the loop that reads consecutive
bytes is tiled with it: a tile of ``t x t`` elements reads ``t`` short runs and writes
``t`` short runs, both within a few cache lines. The innermost loop is vectorised where its
tile is a whole vector. Where those reads are a multiple of 4 KB apart (the channel planes of
a 64 x 64 int8 input) they all fall in one L1 set, tiles or not: the loop that reads
consecutive bytes runs innermost instead, the channels around it (mobilenet_v2: ~0.7 ms of a
~14 ms steady call). Only the order of the iterations changes: each iteration still
stores the same value at the same place, and a nest is reordered only when no two
iterations write the same element and none reads what the nest writes, so the result is
the same as before (``tests/model/test_host_loops.py`` checks that on random nests).

>>> mod = host_loops()(mod)              # doctest: +SKIP
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import ir, sym, tirx

from tirpat.tir.analysis import const_int, int_strides, linear_form

__all__ = ["order_copy_nests", "host_loops"]

#: The side of a tile (elements) along the loop that reads consecutive memory and along the
#: one that writes it: 16 x 16 int8 elements are 16 cache-line pieces of 16 bytes each way.
TILE = 16
#: The most lanes a vectorised innermost loop gets (a 512-bit vector of int8).
MAX_LANES = 64
#: The bytes of one way of an L1 data cache (64 sets of 64-byte lines): reads this far apart, or
#: a multiple, all fall in one set (see :func:`_plane_reader`).
L1_WAY = 4096
#: The most bytes apart the loop run innermost by :func:`_plane_reader` may write.
NEAR = 1024


def order_copy_nests(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (lowered TIR, buffers not yet flattened) with each of its copy-like loop nests
    in the order of the memory it writes, tiled against the memory it reads (see the module
    docstring); ``func`` itself when no nest changes.

    >>> from tvm.script import tirx as T
    >>> @T.prim_func
    ... def nchw(x: T.Buffer((8, 4, 4), "int8"), y: T.Buffer((4, 4, 8), "int8")):
    ...     for c, h, w in T.grid(8, 4, 4):
    ...         y[h, w, c] = x[c, h, w]
    >>> [l.strip() for l in order_copy_nests(nchw).script().splitlines() if l.strip().startswith("for")]
    ['for h, w in T.grid(4, 4):', 'for c in T.vectorized(8):']
    """
    if not isinstance(func, tirx.PrimFunc):
        raise TypeError(f"order_copy_nests takes a PrimFunc, got {type(func).__name__}")

    def on_for(node, mutator):
        done = _reordered(node)
        return mutator.default_mutate(node) if done is None else done

    body = tvm_ffi.structural_mutate(func.body, (tirx.For, on_for))
    return func if body.same_as(func.body) else func.with_body(body)


class _Loop:
    """One loop of a nest: its variable, start, extent; its stride in the store, the load."""

    __slots__ = ("var", "min", "extent", "store", "load")

    def __init__(self, var, start, extent):
        self.var, self.min, self.extent = var, start, extent
        self.store = self.load = 0


def _reordered(nest: tirx.For):
    """``nest`` reordered and tiled, or None (the walk descends) when it is not a copy nest
    or is already in order."""
    loops, body = [], nest
    while isinstance(body, tirx.For):
        if int(body.kind) != int(tirx.ForKind.SERIAL) or body.annotations or body.thread_binding is not None \
                or not isinstance(body.extent, tirx.IntImm) or not isinstance(body.min, tirx.IntImm):
            return None
        loops.append(_Loop(body.loop_var, int(body.min.value), int(body.extent.value)))
        body = body.body
    if len(loops) < 2 or not isinstance(body, tirx.BufferStore):
        return None
    store = body
    offset = _flat_offset(store.buffer, store.indices)
    loads = _loads(store.value)
    if offset is None or loads is None or any(load.source.same_as(store.buffer) for load in loads):
        return None
    variables = [l.var for l in loops]
    coefficients = _coefficients(offset, variables)
    if coefficients is None or not _injective([(abs(c), l.extent) for c, l in zip(coefficients, loops)]):
        return None
    for c, l in zip(coefficients, loops):
        l.store = abs(c)
    main, load_bits = _main_load(loads, variables)
    if main is not None:
        for c, l in zip(main, loops):
            l.load = abs(c)
    order = sorted(loops, key=lambda l: -l.store)     # stable: ties keep their order
    inner = order[-1]
    reader = _plane_reader(order, inner, load_bits, store.buffer.dtype.bits)
    if reader is not None:
        # a gather of channels from planes whose reads share an L1 set: the loop that reads
        # consecutive elements innermost, the channels around it (writes a channel count apart)
        return _build([l for l in order if l is not reader] + [reader], reader, None, store)
    tiling = _tile_partner(order, inner)
    if tiling is None and loops[-1].store * store.buffer.dtype.bits <= _DENSE_BITS:
        # already writes within a few bytes at each step: the order stays, and a loop of
        # consecutive stores still becomes vectors
        last = loops[-1]
        if last.store != 1 or not (_is_vector(last.extent) or _tile(last.extent)) or _guarded(store.value, last.var):
            return None
        order, inner = loops, last
    return _build(order, inner, tiling, store)


#: an innermost loop storing at most this many bits apart keeps its order when nothing is tiled
_DENSE_BITS = 128


def _flat_offset(buffer, indices):
    """The element offset ``indices`` address in ``buffer`` (row-major, or its strides), or
    None when a stride is not a constant."""
    strides = int_strides(buffer)
    if strides is None or len(strides) != len(indices):
        return None
    offset = None
    for index, stride in zip(indices, strides):
        term = index * tirx.const(stride, index.ty.dtype) if stride != 1 else index
        offset = term if offset is None else offset + term
    return offset


def _coefficients(expr, variables):
    """The integer coefficient of each of ``variables`` in ``expr``, linear in them; None
    when it is not (an index through ``//``, say) or a coefficient is not a constant."""
    form = linear_form(expr, variables)
    if form is None:
        return None
    coefficients = [const_int(c) for c in form[0]]
    return None if None in coefficients else coefficients


def _injective(strides_extents) -> bool:
    """Whether ``sum(stride_i * v_i)`` over ``0 <= v_i < extent_i`` takes a different value at
    every point: sorted by stride, each stride exceeds the largest offset the smaller ones
    reach (a mixed radix). Sufficient, not necessary: a nest it refuses keeps its order."""
    reach = 0
    for stride, extent in sorted(strides_extents):
        if extent == 1:
            continue
        if stride <= reach:
            return False
        reach += stride * (extent - 1)
    return True


def _loads(value):
    """The loads in ``value``, or None when it holds anything else that is not pure
    arithmetic on them (a call, say, which may have effects)."""
    loads, other = [], []

    def look(node):
        if isinstance(node, ir.TensorLoad):
            loads.append(node)
        elif isinstance(node, ir.Call) and node.op.name not in _PURE:
            other.append(node)
            return tvm_ffi.VisitInterrupt(node)
        return None

    tvm_ffi.structural_walk(value, look)
    return None if other else loads


_IF_THEN_ELSE = ir.Op.get("prim.if_then_else").name
#: calls that compute a value from their arguments and nothing else (by the names TVM registers)
_PURE = frozenset({_IF_THEN_ELSE, ir.Op.get("prim.likely").name, ir.Op.get("tirx.reinterpret").name})


def _main_load(loads, variables):
    """The coefficients of the loop variables in the offset of the load that reads the most
    bytes per iteration (the first such) and its bits per iteration, or ``(None, 0)`` when no
    load is linear in them."""
    best, best_bytes = None, 0
    for load in loads:
        offset = _flat_offset(load.source, load.indices)
        if offset is None:
            continue
        coefficients = _coefficients(offset, variables)
        size = load.source.dtype.bits * load.source.dtype.lanes
        if coefficients is not None and size > best_bytes:
            best, best_bytes = coefficients, size
    return best, best_bytes


def _tile(extent: int) -> int | None:
    """The side of a tile along a loop of ``extent``: the largest power of two up to
    :data:`TILE` that divides it, or None when that is below 4 (too short to pay)."""
    side = TILE
    while side >= 4:
        if extent % side == 0:
            return side
        side //= 2
    return None


def _plane_reader(order, inner, load_bits: int, store_bits: int):
    """The loop reading consecutive elements of the main load, to run innermost, when
    ``inner`` (writing consecutive elements, at least :data:`TILE` of them) reads a multiple of
    :data:`L1_WAY` bytes apart and that loop, at least :data:`TILE` long, writes at most
    :data:`NEAR` bytes apart (an NCHW input staged channels-last from 64 x 64 int8 planes);
    else None.

    Addresses a multiple of :data:`L1_WAY` apart share an L1 set: a vector of 16 channels, or a
    16 x 16 tile, reads 16 lines of one set, more than its 8-12 ways, and every load misses
    (mobilenet_v2's 96 x 66 x 66 staging: 1.1 ms at -O3, 0.15 ms read along the rows; 0.57 and
    0.12 ms unpadded). Along the rows the reads are consecutive and the writes a channel count
    apart, within a few rows of the output."""
    if inner.store != 1 or inner.extent < TILE or not inner.load or inner.load * load_bits % (L1_WAY * 8):
        return None
    reader = next((l for l in order if l is not inner and l.load == 1), None)
    if reader is None or reader.extent < TILE or reader.store * store_bits > NEAR * 8:
        return None
    return reader


def _tile_partner(order, inner):
    """The loop to tile with the innermost one, ``inner``, and the two tile sides: the loop
    reading consecutive elements of the main load, when ``inner`` reads far apart; None when
    there is none, or a side would be too short."""
    if inner.store != 1 or inner.load in (0, 1):
        return None
    partner = next((l for l in order if l is not inner and l.load == 1), None)
    if partner is None:
        return None
    sides = _tile(partner.extent), _tile(inner.extent)
    return None if None in sides else (partner, *sides)


def _build(order, inner, tiling, store):
    """The nest over ``order`` (outermost first) around ``store``. With ``tiling`` (a partner
    loop and the tile sides along it and along ``inner``), both are split into tiles, the
    tile loops innermost (``inner``'s last). The innermost loop is vectorised when it writes
    consecutive elements, a power of two of them up to :data:`MAX_LANES` (a longer one is
    split into such vectors), and no padding's condition depends on it."""
    sides = {tiling[0]: tiling[1], inner: tiling[2]} if tiling else {}
    substitution, loops, tiles = {}, [], []       # (var, min, extent), outermost first
    for l in order:
        dtype = l.var.ty.dtype
        side = sides.get(l)
        if side is None or side == l.extent:      # a whole loop (a whole loop is its own tile)
            fresh = tirx.Var(l.var.name, dtype)
            substitution[l.var.__chandle__()] = fresh
            (loops if side is None else tiles).append((fresh, l.min, l.extent, l))
        else:
            outer, tile = tirx.Var(f"{l.var.name}_o", dtype), tirx.Var(f"{l.var.name}_t", dtype)
            substitution[l.var.__chandle__()] = outer * tirx.const(side, dtype) + tile + tirx.const(l.min, dtype)
            loops.append((outer, 0, l.extent // side, l))
            tiles.append((tile, 0, side, l))
    loops += sorted(tiles, key=lambda t: t[3] is inner)     # inner's tile innermost
    body = tvm_ffi.structural_map(store, (ir.Var, lambda v: substitution.get(v.__chandle__(), v)))
    analyzer = sym.Analyzer()
    body = _simplified(body, analyzer)
    # the innermost loop runs along inner (order ends with it); a whole inner loop that writes
    # consecutive elements is split into vectors when its extent is not one
    var, start, extent, _ = loops[-1]
    vectors = inner.store == 1 and not _guarded(store.value, inner.var)
    lanes = _tile(extent) if vectors and not tiles and not _is_vector(extent) else None
    if lanes is not None:
        dtype = var.ty.dtype
        outer, lane = tirx.Var(f"{var.name}_o", dtype), tirx.Var(f"{var.name}_v", dtype)
        body = tvm_ffi.structural_map(body, (ir.Var, lambda v: outer * tirx.const(lanes, dtype) + lane
                                             + tirx.const(start, dtype) if v.same_as(var) else v))
        body = _simplified(body, analyzer)
        loops[-1:] = [(outer, 0, extent // lanes, inner), (lane, 0, lanes, inner)]
    vectorise = vectors and _is_vector(loops[-1][2])
    for n, (var, start, extent, _) in enumerate(reversed(loops)):
        kind = tirx.ForKind.VECTORIZED if n == 0 and vectorise else tirx.ForKind.SERIAL
        dtype = var.ty.dtype
        body = tirx.For(var, tirx.const(start, dtype), tirx.const(extent, dtype), kind, body)
    return body


def _simplified(store, analyzer):
    """``store`` with its indices and those of its loads simplified (the split loops' sums);
    the value's own arithmetic is left as it is: a float ``x + 0.0`` is not ``x`` for -0.0."""
    value = tvm_ffi.structural_map(store.value, (ir.TensorLoad, lambda load: tirx.BufferLoad(
        load.source, [analyzer.simplify(i) for i in load.indices])))
    return tirx.BufferStore(store.buffer, value, [analyzer.simplify(i) for i in store.indices])


def _is_vector(lanes: int) -> bool:
    """Whether a loop of ``lanes`` iterations makes a whole vector: a power of two from 4 to
    :data:`MAX_LANES`."""
    return 4 <= lanes <= MAX_LANES and lanes & (lanes - 1) == 0


def _guarded(value, var) -> bool:
    """Whether ``value`` selects between values (a padding) by a condition on ``var``:
    vectorised along ``var``, TVM would compute the selection lane by lane. (A condition
    without ``var`` selects a whole vector at once, by a branch: nothing out of bounds is read.)"""
    found = []

    def uses_var(cond) -> bool:
        hit = []

        def seen(v):
            if v.same_as(var):
                hit.append(v)
                return tvm_ffi.VisitInterrupt(v)
            return None

        tvm_ffi.structural_walk(cond, (ir.Var, seen))
        return bool(hit)

    def look(node):
        if isinstance(node, ir.Call) and node.op.name == _IF_THEN_ELSE and uses_var(node.args[0]):
            found.append(node)
            return tvm_ffi.VisitInterrupt(node)
        return None

    tvm_ffi.structural_walk(value, look)
    return bool(found)


def host_loops() -> tvm.transform.Pass:
    """A module pass: :func:`order_copy_nests` on every PrimFunc of the module that no
    schedule has scheduled (``tirx.is_scheduled``: a schedule's loop order is its author's).

    >>> mod = host_loops()(mod)          # doctest: +SKIP
    """
    @tvm.transform.module_pass(opt_level=0, name="tirpat.HostLoops")
    def run(mod: ir.IRModule, ctx) -> ir.IRModule:
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc) and not bool((func.attrs or {}).get("tirx.is_scheduled", False)):
                done = order_copy_nests(func)
                if not done.same_as(func):
                    mod[gv] = done
        return mod

    return run
