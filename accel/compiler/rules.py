"""The tirpat rules that offload lowered TIR to accel, written with tirpat's public API.

- ``load``: a copy nest from host memory into a scratchpad scope -> LOAD (2-D strided DMA,
  padding from the copy's guard; where the guard tests enclosing loops alone, as at a
  convolution's image border, a LOAD of all padding);
- ``gemm``: a nest of 16x16x16 tiles ``C += int32(A) * int32(W)`` on ACC/INP/WGT -> GEMM,
  up to two enclosing loops of tiles folded into its loop fields; a nest of 16x16 tiles
  ``C[p, c] += int32(A[p, c]) * int32(W[c])`` (a depthwise convolution) -> DWMAC, likewise;
- ``zero_init``: a nest storing 0 into ACC in whole tiles -> GEMM in its reset form;
- ``alu``: an in-place elementwise nest on ACC (bias add, ReLU/clip, requantise) -> ALU; or
  a nest writing a second ACC region from the accumulator (an epilogue's temporary, where its
  requantise reads the accumulator twice) -> ALU ``x * 0``, ``+ acc``, then its chain (one
  ALU chain once merged);
- ``elementwise``: the calls :mod:`accel.compiler.elementwise` wrote at schedule time for an
  element-wise chain of int8 tensors, taken as they are;
- ``store``: a nest writing host memory from ACC, possibly through an elementwise epilogue
  and a narrowing cast -> ALU (in place, on the accumulator) then STORE (a guard that ends a
  loop around the 2-D box early runs that loop fewer times); a plain cast wraps,
  a clip to [-128, 127] then cast saturates; a clip to int8 then a lookup in a 256-entry int8
  table staged in WGT (:func:`table_lookup`) -> the ALU's clip, LUT, then a STORE.

Each rule emits the declared instructions' calls (:mod:`accel.hw.instructions`, arguments by
name); a scratchpad operand is a :class:`Region` of a scratchpad buffer, passed as its
``access_ptr`` (of the operand's declared role), which :mod:`accel.compiler.planner`
replaces by the planned address. The declarations fix ``deps = AUTO``: the runtime orders
instructions with dependency tokens.

>>> import accel
>>> rw = accel.rules()
>>> [r.name for r in rw.rules]
['accel.load', 'accel.gemm', 'accel.zero_init', 'accel.alu', 'accel.store', 'accel.elementwise', 'accel.upsample']
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, sym, tirx

import tirpat as tp
from accel.hw import instructions
from accel.hw.config import Config
from accel.hw.instructions import ALU, DWMAC, GEMM, GEMM_RESET, LOAD, LUT, LUT_ENTRIES, SCOPES, STORE, AluOp, StoreMode, distinct_starts
from accel.compiler import elementwise, upsample
from accel.compiler.wrapping import strip

#: The scratchpads' storage scopes (their declarations are :mod:`accel.hw.instructions`').
INP, WGT, ACC = instructions.INP.scope, instructions.WGT.scope, instructions.ACC.scope
#: Simplifies a loop's extent less the iterations a guard excludes.
_SIMPLIFY = sym.Analyzer()
#: AttrStmt key marking an epilogue that overwrites its accumulator in place.
IN_PLACE = "accel.in_place_epilogue"
#: Loop annotations of a forking epilogue whose shared steps run once (the scheduler's
#: ``fork="once"``): on the first temporary's nest, how many of its leading steps run in place
#: on the accumulator before it is copied; on the other temporaries' and the epilogue's, how
#: many of their leading steps (the same ones) to leave out.
PREFIX_IN_PLACE, PREFIX_DONE = "accel.prefix_in_place", "accel.prefix_done"


def is_scratchpad(buffer) -> bool:
    """True for a buffer in one of accel's scratchpad scopes."""
    return buffer.scope() in SCOPES


def _int(e):
    if isinstance(e, int):
        return e
    return int(e.value) if isinstance(e, tirx.IntImm) else None


@dataclass(frozen=True)
class Region:
    """A scratchpad operand: ``buffer[offset:]`` (the planner resolves its address)."""

    buffer: tirx.Buffer
    offset: object


def address(buffer: tirx.Buffer, offset: ir.Expr | int) -> Region:
    """The scratchpad operand starting at ``buffer[offset]``, for a declared instruction's call."""
    return Region(buffer, offset)


def _around(loops, strides_per_operand, make_call):
    """Wrap a call in For loops over ``loops`` (outermost first); ``make_call(shifts)`` gets,
    per operand, the offset those loops add (loop var times the operand's stride)."""
    fresh = [tirx.Var(f"{l.loop_var.name}_acc", l.loop_var.ty) for l in loops]
    shifts = []
    for strides in strides_per_operand:
        shift = tirx.IntImm("int32", 0)
        for v, s in zip(fresh, strides):
            if s:
                shift = shift + v * s
        shifts.append(shift)
    stmt = make_call(shifts)
    for l, v in reversed(list(zip(loops, fresh))):
        stmt = tirx.For(v, tirx.IntImm("int32", 0), l.extent, tirx.ForKind.SERIAL, stmt)
    return stmt


# ----------------------------------------------------------------------------- LOAD
def _load(m):
    c = m["copy"]
    dst, src = c.dst, c.src
    mem = SCOPES[dst.buffer.scope()]
    if c.cast is not None:
        raise _Unsupported(f"the copy casts to {c.cast}: a LOAD moves bytes unchanged")
    if is_scratchpad(src.buffer):
        raise _Unsupported(f"the source {src.buffer.name} is itself a scratchpad buffer")
    n = len(c.extents)
    pads, outside = tuple((0, 0) for _ in range(n)), None
    if c.predicate is not None:     # bounds on the copy's loops, and on enclosing loops alone
        pads, outside = tp.split_guard(c.predicate, m.loops) or (None, None)
        if pads is None:
            raise _Unsupported(f"the copy's guard {c.predicate} is not a box of affine bounds")
    ext = [_int(e) for e in c.extents]
    if any(e is None for e in ext):
        raise _Unsupported(f"the copy's extents {list(c.extents)} are not constants")
    # The innermost loop is the DMA row when both sides are contiguous along it.
    inner = n > 0 and dst.strides[-1] == 1 and src.strides[-1] == 1
    col = n - 1 if inner else None
    row = (n - 2 if inner else n - 1) if n - (1 if inner else 0) > 0 else None
    outer = list(range(row if row is not None else (col if col is not None else 0)))
    for k in outer:
        if not (_int(pads[k][0]) == 0 and _int(pads[k][1]) == 0):
            raise _Unsupported(f"padding along loop {m.loops[k].loop_var.name}, outside the 2-D DMA box")
    cols = ext[col] if col is not None else 1
    rows = ext[row] if row is not None else 1
    pl, pr = pads[col] if col is not None else (0, 0)
    pt, pb = pads[row] if row is not None else (0, 0)
    if outside is not None:     # bounds from an enclosing loop's offset may leave an empty box
        pr, pb = tirx.min(pr, cols - pl), tirx.min(pb, rows - pt)
    dram_ld = src.strides[row] if row is not None else 0
    sram_ld = dst.strides[row] if row is not None else cols
    if rows > 1 and sram_ld < cols:
        raise _Unsupported(f"the scratchpad rows overlap (row stride {sram_ld} < {cols} columns)")
    unit = 1 if col is not None else 0
    start = src.offset + pt * dram_ld + pl * unit
    dst_start = dst.offset
    partial = c.predicate is not None and c.pad_value is None
    if partial:
        # Only the guarded box is written: a smaller DMA, no padding.
        dst_start = dst.offset + pt * sram_ld + pl * unit
        pad_fields = (0, 0, 0, 0)
        pad_value = 0
    else:
        pad_fields = (pt, pb, pl, pr)
        pad_value = 0 if c.pad_value is None else _int(c.pad_value)
        if pad_value is None:
            raise _Unsupported(f"the pad value {c.pad_value} is not an integer constant")
    loops = m.loops[:len(outer)]

    def make(shifts):
        return LOAD[mem].call(host=src.buffer, elem_offset=start + shifts[0],
                    sram_addr=address(dst.buffer, dst_start + shifts[1]), sram_ld=sram_ld,
                    rows=rows - pt - pb, cols=cols - pl - pr, dram_ld=dram_ld,
                    **dict(zip(("pad_top", "pad_bottom", "pad_left", "pad_right"), pad_fields)),
                    pad_value=pad_value)

    def all_padding(shifts):
        return LOAD[mem].call(host=src.buffer, elem_offset=0,
                    sram_addr=address(dst.buffer, dst.offset + shifts[1]), sram_ld=sram_ld, rows=0,
                    cols=cols, dram_ld=dram_ld, pad_top=rows, pad_bottom=0, pad_left=0, pad_right=0,
                    pad_value=pad_value)

    strides = [[src.strides[k] for k in outer], [dst.strides[k] for k in outer]]
    load = _around(loops, strides, make)
    if outside is None:
        return load
    # where the guard on enclosing loops fails, the block is all padding (or, for a partial
    # copy, not written)
    return tirx.IfThenElse(outside, load, None if partial else _around(loops, strides, all_padding))


def _loop_fields(loops, regions, tile_start: int, t: int, what: str):
    """``(outer, (ext_out, strides_out), (ext_in, strides_in))`` for a tile instruction whose tile
    loops start at ``tile_start``: the (up to) two loops just outside the tile fold into the
    instruction's loop fields, the ones outside those (``outer``, indices) loop over it. The
    strides are ``(acc, inp, wgt)`` ones, read from ``regions``."""
    blocks = list(range(max(0, tile_start - 2), tile_start))
    fields = []
    for k in blocks:
        strides = tuple(r.strides[k] for r in regions)
        if any(s % t for s in strides):
            raise _Unsupported(f"loop {loops[k].loop_var.name} steps by {strides}, not whole tiles")
        fields.append((_int(loops[k].extent), strides))
    while len(fields) < 2:
        fields.insert(0, (1, (0, 0, 0)))
    if any(e is None for e, _ in fields):
        raise _Unsupported(f"the loops folded into the {what} have symbolic extents")
    return list(range(0, max(0, tile_start - 2))), fields[0], fields[1]


# ----------------------------------------------------------------------------- GEMM
def _gemm(m, config):
    t = config.tile
    rc, ra, rw = m.region("C"), m.region("A"), m.region("W")
    n = len(m.loops)
    if _per_channel(m.loops, (rc, ra, rw), t):
        return _dwmac(m.loops, (rc, ra, rw), t)
    if n < 3:
        raise _Unsupported(f"a GEMM tile needs 3 loops (m, n, k), found {n}")
    roles = {}
    for k in range(n - 3, n):
        if _int(m.loops[k].extent) != t:
            raise _Unsupported(f"loop {m.loops[k].loop_var.name} has extent {m.loops[k].extent}, not the tile {t}")
        sig = (rc.strides[k], ra.strides[k], rw.strides[k])
        if sig[0] == 0 and sig[1] == 1 and sig[2] == 1:
            roles["k"] = k
        elif sig[0] == 1 and sig[1] == 0 and sig[2] != 0:
            roles["n"] = k
        elif sig[0] != 0 and sig[2] == 0 and sig[1] != 0:
            roles["m"] = k
    if len(roles) != 3:
        raise _Unsupported("the innermost three loops are not a tile's m, n and k "
                           "(C[m, n] += A[m, k] * W[n, k], each contiguous in its last index)")
    acc_ld, inp_ld, wgt_ld = rc.strides[roles["m"]], ra.strides[roles["m"]], rw.strides[roles["n"]]
    outer, (eo, so), (ei, si) = _loop_fields(m.loops, (rc, ra, rw), n - 3, t, "GEMM")

    def make(shifts):
        return GEMM.call(acc_addr=address(rc.buffer, rc.offset + shifts[0]),
                    inp_addr=address(ra.buffer, ra.offset + shifts[1]),
                    wgt_addr=address(rw.buffer, rw.offset + shifts[2]), acc_ld=acc_ld, inp_ld=inp_ld,
                    wgt_ld=wgt_ld, ext_out=eo, ext_in=ei, acc_stride_out=so[0], acc_stride_in=si[0],
                    inp_stride_out=so[1], inp_stride_in=si[1], wgt_stride_out=so[2], wgt_stride_in=si[2])

    return _around(m.loops[:len(outer)], [[r.strides[k] for k in outer] for r in (rc, ra, rw)], make)


def _per_channel(loops, regions, t) -> bool:
    """Whether the innermost two loops are a DWMAC tile: ``C[p, c] += A[p, c] * W[c]``, the
    channels ``c`` innermost and contiguous everywhere, the weight the same for every pixel ``p``."""
    if len(loops) < 2 or any(_int(l.extent) != t for l in loops[-2:]):
        return False
    rc, ra, rw = regions
    k = len(loops) - 1
    return (rc.strides[k], ra.strides[k], rw.strides[k]) == (1, 1, 1) and \
        rc.strides[k - 1] != 0 and ra.strides[k - 1] != 0 and rw.strides[k - 1] == 0


def _dwmac(loops, regions, t):
    """The per-channel multiply-accumulate nest as DWMAC calls: up to two loops around the tile
    (a kernel's taps) folded into its loop fields, any further ones looping over it."""
    rc, ra, rw = regions
    n = len(loops)
    outer, (eo, so), (ei, si) = _loop_fields(loops, regions, n - 2, t, "DWMAC")

    def make(shifts):
        return DWMAC.call(acc_addr=address(rc.buffer, rc.offset + shifts[0]),
                          inp_addr=address(ra.buffer, ra.offset + shifts[1]),
                          wgt_addr=address(rw.buffer, rw.offset + shifts[2]), acc_ld=rc.strides[n - 2],
                          inp_ld=ra.strides[n - 2], ext_out=eo, ext_in=ei, acc_stride_out=so[0],
                          acc_stride_in=si[0], inp_stride_out=so[1], inp_stride_in=si[1], wgt_stride_out=so[2],
                          wgt_stride_in=si[2])

    return _around(loops[:len(outer)], [[r.strides[k] for k in outer] for r in (rc, ra, rw)], make)


def _zero_init(m, config):
    return _reset(m.region("C"), m.loops, config.tile)


def _reset(r, loops, t: int):
    """GEMM in its reset form zeroing the region ``r`` the nest ``loops`` writes: whole
    ``t x t`` tiles in its two innermost loops; where those are one tile, up to two loops
    just outside it that step by whole tiles (a block of accumulator tiles) fold into the
    instruction's loop fields, as a GEMM's do (one instruction per block, not per tile:
    the issue overhead paid once); the loops further out around it."""
    n = len(loops)
    if n < 2:
        raise _Unsupported("a reset covers whole tiles: it needs at least 2 loops")
    rows, cols = _int(loops[n - 2].extent), _int(loops[n - 1].extent)
    ld = r.strides[n - 2]
    if rows is None or cols is None or rows % t or cols % t or r.strides[n - 1] != 1 or ld % t or ld < cols:
        raise _Unsupported(f"the zeroed region ({rows} x {cols}, row stride {ld}) is not whole {t} x {t} tiles")
    fields = [(rows // t, t * ld), (cols // t, t)]
    outer = list(range(n - 2))
    if (rows, cols) == (t, t):
        folded: list = []
        for k in (n - 3, n - 4):
            if k < 0 or _int(loops[k].extent) is None or r.strides[k] % t:
                break
            folded.insert(0, k)
        fields = [(1, 0)] * (2 - len(folded)) + [(_int(loops[k].extent), r.strides[k]) for k in folded]
        outer = outer[:len(outer) - len(folded)]
    (ext_out, stride_out), (ext_in, stride_in) = fields

    def make(shifts):
        return GEMM_RESET.call(acc_addr=address(r.buffer, r.offset + shifts[0]), inp_addr=0,
                    wgt_addr=0, acc_ld=ld, inp_ld=t, wgt_ld=t, ext_out=ext_out, ext_in=ext_in,
                    acc_stride_out=stride_out, acc_stride_in=stride_in, inp_stride_out=0, inp_stride_in=0,
                    wgt_stride_out=0, wgt_stride_in=0)

    return _around(loops[:len(outer)], [[r.strides[k] for k in outer]], make)


# ----------------------------------------------------------------------------- epilogues
_OPS = {tirx.Add: AluOp.ADD, tirx.Max: AluOp.MAX, tirx.Min: AluOp.MIN, tirx.Mul: AluOp.MUL}
_IMM_MAX = 2**31


@dataclass
class _Step:
    """One instruction of an epilogue: ALU ``spine = op(spine, imm or operand)``, or, with
    ``op`` None, LUT ``spine = table[spine + 128]``."""

    op: AluOp | None
    imm: int | None = None
    operand: object = None      # an ACC load
    table: object = None        # a LUT's table buffer (256 int8 entries)


def _acc_load(e):
    return e if isinstance(e, ir.TensorLoad) and e.source.scope() == ACC else None


def epilogue_chain(e, is_spine, is_operand):
    """``(spine load, [steps])`` if ``e`` is a chain of ALU operations applied to one value
    (``is_spine(load)``) with constant or tensor (``is_operand(load)``) operands, else None.

    >>> epilogue_chain(T.max(C[i, j] + bias[j], 0), is_c, is_int32)   # doctest: +SKIP
    (C[i, j], [_Step(ADD, operand=bias[j]), _Step(MAX, imm=0)])
    """
    if isinstance(e, ir.TensorLoad) and is_spine(e):
        return e, []
    if isinstance(e, tirx.Cast) and str(e.ty.dtype) == "int32" and str(e.value.ty.dtype) == "int32":
        return epilogue_chain(e.value, is_spine, is_operand)
    if isinstance(e, tirx.Sub) and _int(e.b) is not None:
        inner = epilogue_chain(e.a, is_spine, is_operand)
        return None if inner is None else (inner[0], inner[1] + [_Step(AluOp.ADD, _wrap32(-_int(e.b)))])
    if isinstance(e, tirx.RShift) and _int(e.b) is not None:
        inner = epilogue_chain(e.a, is_spine, is_operand)
        return None if inner is None else (inner[0], inner[1] + [_Step(AluOp.SHR, _int(e.b))])
    if isinstance(e, tirx.Add):
        factored = _factored(e, is_spine, is_operand)
        if factored is not None:
            return factored
    op = _OPS.get(type(e))
    if op is None:
        return None
    for spine, other in ((e.a, e.b), (e.b, e.a)):
        inner = epilogue_chain(spine, is_spine, is_operand)
        if inner is None:
            continue
        if _int(other) is not None and -_IMM_MAX <= _int(other) < _IMM_MAX:
            return inner[0], inner[1] + [_Step(op, _int(other))]
        if isinstance(other, ir.TensorLoad) and is_operand(other) and not other.source.same_as(inner[0].source):
            return inner[0], inner[1] + [_Step(op, operand=other)]
    return None


def table_step(table: tirx.Buffer | None) -> _Step:
    """The epilogue step that looks the accumulator up in ``table`` (a 256-entry int8 buffer
    in WGT): accel's LUT.

    >>> table_step(None).op is None
    True
    """
    return _Step(None, table=table)


def _widening(e) -> bool:
    """Whether ``e`` is a cast to int32 or int64 of an integer that it keeps as it is."""
    return isinstance(e, tirx.Cast) and str(e.ty.dtype) in ("int32", "int64") and \
        str(e.value.ty.dtype) in ("int8", "int32", "int64") and \
        np.dtype(str(e.value.ty.dtype)).itemsize <= np.dtype(str(e.ty.dtype)).itemsize


def _bounded(e, op, bound: int):
    """The other operand of ``e`` if ``e`` is ``op(x, bound)`` in either order, else None."""
    if isinstance(e, op):
        for x, c in ((e.a, e.b), (e.b, e.a)):
            if _int(c) == bound:
                return x
    return None


def table_lookup(e: ir.Expr) -> tuple[ir.Expr, ir.Expr] | None:
    """``(table load, x)`` if ``e`` is ``table[x + 128]`` with a 1-D int8 table of 256
    entries and ``x`` an int32 provably inside [-128, 127], e.g. clipped there (cast to int8 and back, or not, and the
    index clamped to [0, 255] or not: how TOPI lowers integerize's ``take(table, x + 128)``),
    else None. The clip makes the casts and the clamp identities: accel's LUT computes it.

    >>> table_lookup(T[T.min(T.max(0, T.Cast("int32", T.Cast("int8", clip)) + 128), 255)])   # doctest: +SKIP
    (T[...], clip)
    """
    if not (isinstance(e, ir.TensorLoad) and str(e.source.dtype) == "int8" and len(e.indices) == 1
            and len(e.source.shape) == 1 and _int(e.source.shape[0]) == LUT_ENTRIES):
        return None
    index = e.indices[0]
    while True:
        inner = _bounded(index, tirx.Min, LUT_ENTRIES - 1)
        inner = inner if inner is not None else _bounded(index, tirx.Max, 0)
        if inner is None and _widening(index):
            inner = index.value
        if inner is None:
            break
        index = inner
    x = _bounded(index, tirx.Add, 128)
    if x is None and isinstance(index, tirx.Sub) and _int(index.b) == -128:
        x = index.a
    while x is not None and _widening(x):
        x = x.value
    if isinstance(x, tirx.Cast) and str(x.ty.dtype) == "int8":
        x = x.value
    if x is None or str(x.ty.dtype) != "int32" or not _within_int8(x):
        return None
    return e, x


def _within_int8(e) -> bool:
    """Whether ``e`` provably lies in [-128, 127]: a clip to bounds inside int8, or what is
    left of one where TVM's simplifier dropped the end the requantise cannot reach (the
    analyzer bounds the mathematical value, so a bound inside int8 also rules out a wrap)."""
    bound = tvm.sym.Analyzer().const_int_bound(e)
    return -128 <= bound.min_value and bound.max_value <= 127


def _wrap32(v: int) -> int:
    """``v`` modulo 2**32 as an int32 (``x - c`` is ``x + (-c)`` in wrapping arithmetic,
    also for ``c = -2**31``)."""
    return (v + 2**31) % 2**32 - 2**31


def _scaled(e):
    """``(x, c)`` if ``e`` is ``x * c`` with ``c`` a constant, else None."""
    if isinstance(e, tirx.Mul):
        for x, c in ((e.a, e.b), (e.b, e.a)):
            if _int(c) is not None:
                return x, _int(c)
    return None


def _factored(e, is_spine, is_operand):
    """``x*c + y*c`` as ``(x + y) * c`` (equal in int32's wrap-around arithmetic): the form
    TVM's simplifier leaves when it inlines a bias add into a requantise multiply."""
    for left, right in ((e.a, e.b), (e.b, e.a)):
        lhs, rhs = _scaled(left), _scaled(right)
        if lhs is None or rhs is None or lhs[1] != rhs[1] or not (-_IMM_MAX <= lhs[1] < _IMM_MAX):
            continue
        inner = epilogue_chain(lhs[0], is_spine, is_operand)
        other = rhs[0]
        if inner is not None and isinstance(other, ir.TensorLoad) and is_operand(other) \
                and not other.source.same_as(inner[0].source):
            return inner[0], inner[1] + [_Step(AluOp.ADD, operand=other), _Step(AluOp.MUL, lhs[1])]
    return None


def _chain(e):
    return epilogue_chain(e, lambda l: _acc_load(l) is not None, lambda l: _acc_load(l) is not None)


def clipped_to_int8(e):
    """``x`` if ``e`` clips ``x`` to [-128, 127] (either nesting), else None: a clip the
    STORE does by saturating (the scheduler's estimate counts no ALU step for it).

    >>> x = tirx.Var("x", "int32")
    >>> clipped_to_int8(tirx.Max(tirx.Min(x, 127), -128)).same_as(x), clipped_to_int8(tirx.Max(x, 0))
    (True, None)
    """
    for outer, inner, lo, hi in ((tirx.Max, tirx.Min, -128, 127), (tirx.Min, tirx.Max, 127, -128)):
        if isinstance(e, outer):
            for a, b in ((e.a, e.b), (e.b, e.a)):
                if _int(b) == lo and isinstance(a, inner):
                    for x, y in ((a.a, a.b), (a.b, a.a)):
                        if _int(y) == hi:
                            return x
    return None


@dataclass
class _Grid:
    """An elementwise nest as ``rows x cols`` blocks: ``cols`` is the innermost loop if the
    first region is contiguous along it (else a virtual loop of 1), ``rows`` the loop
    around it (or a virtual 1), ``outer`` the real loops further out."""

    outer: list
    rows: object
    cols: object
    row_stride: list
    col_ok: bool
    rows_after: object = 0
    cols_after: object = 0

    def outer_strides(self, region):
        return [region.strides[k] for k in range(len(self.outer))] if region is not None else [0] * len(self.outer)


def _grid(loops, regions, valid=None):
    n = len(loops)
    valid = valid or [(0, 0)] * n
    contiguous = n > 0 and regions[0].strides[-1] == 1
    k_cols = n - 1 if contiguous else None
    k_rows = (n - 2 if contiguous else n - 1)
    k_rows = k_rows if k_rows >= 0 else None
    cols = loops[k_cols].extent if k_cols is not None else 1
    rows = loops[k_rows].extent if k_rows is not None else 1
    col_ok = all(r is None or k_cols is None or r.strides[k_cols] == 1 for r in regions)
    row_stride = [0 if r is None or k_rows is None else r.strides[k_rows] for r in regions]
    n_outer = k_rows if k_rows is not None else (k_cols if k_cols is not None else 0)
    return _Grid(list(loops[:n_outer]), rows, cols, row_stride, col_ok,
                 valid[k_rows][1] if k_rows is not None else 0, valid[k_cols][1] if k_cols is not None else 0)


def _alu_calls(steps, spine, operands, loops, config, partial_ok):
    """ALU instructions applying ``steps`` in place on the ``spine`` region, or None.

    Columns are cut into ``tile``-lane vectors (``ext_in``), rows become ``ext_out``, loops
    further out become For loops around the instruction; with one vector a row, the rows take
    ``ext_in`` and the loop around them ``ext_out`` (one instruction for two loops of rows).
    ``partial_ok``: a last partial vector may change the lanes after the region (an epilogue
    whose accumulator is dead after its store, which the planner checks; not an ALU nest whose
    buffer is read on).
    """
    t = config.tile
    g = _grid(loops, [spine] + list(operands))
    inner, ext_out = _int(g.cols), _int(g.rows)
    if inner is None or ext_out is None:
        raise _Unsupported("the elementwise nest has symbolic extents")
    if not g.col_ok:
        raise _Unsupported("an operand is not contiguous along the innermost loop")
    vectors = -(-inner // t)
    dso = g.row_stride[0]
    # one vector a row (16 channels, or fewer): its loop level is free, so the rows take it and
    # the loop around them (the rows of a depthwise block over the image's pixels, each a
    # virtual row apart) the outer level: one instruction for the nest, not one per row
    folded = vectors == 1 and g.outer and _int(g.outer[-1].extent) is not None
    if folded:
        outer_strides = [_int(r.strides[len(g.outer) - 1]) if r is not None else 0 for r in [spine] + list(operands)]
        folded = None not in outer_strides and all(s % t == 0 for s in outer_strides)
    if folded:
        ext_in, ext_out = ext_out, _int(g.outer[-1].extent)
        strides_in, strides_out = list(g.row_stride), outer_strides
        g = _Grid(g.outer[:-1], g.rows, g.cols, g.row_stride, g.col_ok)
    else:
        ext_in, strides_out = vectors, list(g.row_stride)
        strides_in = [t] * len(strides_out)
    dso, dsi = strides_out[0], strides_in[0]
    if inner % t:
        if not partial_ok:
            raise _Unsupported(f"{inner} columns are not whole {t}-lane vectors, and the lanes after them are read on")
        # A partial last vector also works on the padding after it: only where that padding
        # lies inside the spine's own rows and allocation (scratchpad buffers are planned in
        # whole vectors).
        base = _int(spine.offset)
        size = _allocation(spine.buffer)
        if base is None or (ext_out > 1 and dso < vectors * t) or (ext_in > 1 and dsi < t) or \
                base + (ext_out - 1) * dso + (ext_in - 1) * dsi + t > -(-size // t) * t:
            raise _Unsupported(f"the last partial vector would write past the rows of {spine.buffer.name}")
    calls = []
    for step, operand, sso, ssi_ in zip(steps, operands, strides_out[1:], strides_in[1:]):
        if dso % t or sso % t or dsi % t or ssi_ % t or (ext_out > 1 and dso == 0) or (ext_in > 1 and dsi == 0):
            raise _Unsupported(f"row strides {dso}, {sso} are not whole {t}-lane vectors")
        if step.op is None:     # a table lookup: the whole table, staged in WGT once
            def lookup(shifts, table=step.table):
                return LUT.call(dst_addr=address(spine.buffer, spine.offset + shifts[0]), lut_addr=address(table, 0),
                                ext_out=ext_out, ext_in=ext_in, dst_stride_out=dso, dst_stride_in=dsi)

            calls.append(_around(g.outer, [g.outer_strides(spine), g.outer_strides(None)], lookup))
            continue
        ssi = 0 if operand is None else ssi_

        def make(shifts, step=step, operand=operand, sso=sso, ssi=ssi):
            src = 0 if operand is None else address(operand.buffer, operand.offset + shifts[1])
            return ALU[step.op, operand is None].call(
                        dst_addr=address(spine.buffer, spine.offset + shifts[0]), src_addr=src,
                        imm=step.imm if operand is None else 0, ext_out=ext_out, ext_in=ext_in,
                        dst_stride_out=dso, dst_stride_in=dsi, src_stride_out=sso, src_stride_in=ssi)

        calls.append(_around(g.outer, [g.outer_strides(spine), g.outer_strides(operand)], make))
    return calls


def _operand_regions(m, steps):
    regions = []
    for s in steps:
        regions.append(None if s.operand is None else m.region(s.operand.source))
    return regions


def _alu(m, store, config):
    value = strip(store.value)      # the operations the scheduler kept from the simplifier, as the ALU runs them
    chain = _chain(value)
    if chain is None:
        raise _Unsupported(f"{value} is not a chain of ALU operations (add, max, min, mul, "
                           "shift right) on one accumulator value")
    spine, steps = chain
    copy = not spine.source.same_as(store.buffer)
    prefix = []
    steps = steps[_prefix(m.loops, PREFIX_DONE, steps):]       # run once already, by the first temporary
    n = _prefix(m.loops, PREFIX_IN_PLACE, steps) if copy else 0
    if n:
        # the steps every branch shares run here, once, on the accumulator itself: whatever a
        # partial last vector changes past the block's lanes is the accumulator's own padding
        # (its rows are whole vectors apart, which _alu_calls checks), which nothing stores
        _within_allocation(m.region(spine.source), m.loops)
        prefix = _alu_calls(steps[:n], m.region(spine.source), _operand_regions(m, steps[:n]), m.loops, config,
                            partial_ok=True)
        steps = steps[n:]
    if copy:
        # a temporary of an epilogue (a second ACC region): the ALU works in place, so it
        # first copies what it reads there (x * 0 + src), then applies the chain: one ALU chain
        # (accel.compiler.chains), whose first step, a product by 0, the planner knows writes
        # the temporary anew (its in-place checks). Its lanes after a partial last vector are its
        # own padding, read by no one but the epilogue's lanes after the store's (dead too).
        steps = [_Step(AluOp.MUL, 0), _Step(AluOp.ADD, operand=spine)] + steps
    elif not steps or not _same_indices(spine, store):
        raise _Unsupported("not an in-place update of the accumulator element it reads")
    if m.get("alu_guard") is not None:
        # a temporary may be computed for the whole block, the guarded lanes after the
        # result's edge too (what they read of the accumulator is its padding), if they lie
        # inside its allocation; the accumulator's own lanes may be read on: left as they are
        if not copy:
            raise _Unsupported(f"an in-place update of the accumulator under the guard {m['alu_guard']}")
        _within_allocation(m.region(store.buffer), m.loops)
    calls = _alu_calls(steps, m.region(store.buffer), _operand_regions(m, steps), m.loops, config, partial_ok=copy)
    calls = prefix + calls
    return calls[0] if len(calls) == 1 else tirx.SeqStmt(calls)


def _prefix(loops, key: str, steps) -> int:
    """The count of leading steps a loop of the nest ``loops`` is annotated with under ``key``
    (:data:`PREFIX_IN_PLACE`, :data:`PREFIX_DONE`), 0 without one; more than the nest's
    ``steps`` is refused."""
    counts = {_int(loop.annotations[key]) for loop in loops if loop.annotations and key in loop.annotations}
    if not counts:
        return 0
    if len(counts) > 1 or None in counts or max(counts) > len(steps):
        raise _Unsupported(f"{key} = {sorted(counts, key=str)} is not a count of the nest's {len(steps)} steps")
    return counts.pop()


def _within_allocation(region, loops) -> None:
    """Raise unless every element the nest ``loops`` writes through ``region`` lies inside its
    buffer's allocation (its rows' aligned strides included)."""
    last = _int(region.offset)
    for stride, loop in zip(region.strides, loops):
        if last is None or _int(stride) is None or _int(loop.extent) is None:
            raise _Unsupported(f"{region.buffer.name}'s region is not constant")
        last += _int(stride) * (_int(loop.extent) - 1)
    if last is None or last >= _allocation(region.buffer):
        raise _Unsupported(f"the whole block would write past {region.buffer.name}'s allocation")


def _allocation(buffer) -> int:
    """Elements a scratchpad buffer's allocation spans: its shape, or its strides where a
    storage_align set them (rows aligned to whole vectors)."""
    size = 1
    for d in buffer.shape:
        size *= _int(d)
    strides = [_int(x) for x in buffer.strides]
    if strides and None not in strides:
        size = max(size, max(st * _int(d) for st, d in zip(strides, buffer.shape)))
    return size


def _store(m, store, config):
    out = store.buffer
    value = strip(store.value)      # the operations the scheduler kept from the simplifier, as the ALU runs them
    mode = StoreMode.INT32
    lookup = table_lookup(value) if str(out.dtype) == "int8" else None
    if lookup is not None:
        # the clip stays an ALU step (MAX, MIN), the LUT leaves int8 values: a plain STORE
        table, value = lookup[0].source, lookup[1]
        if table.scope() != WGT:
            raise _Unsupported(f"the table {table.name} of a lookup is not staged in WGT")
        mode = StoreMode.WRAP
    elif str(out.dtype) == "int8":
        if not isinstance(value, tirx.Cast):
            raise _Unsupported(f"an int8 store of {value} without a narrowing cast")
        value = value.value
        clipped = clipped_to_int8(value)
        mode = StoreMode.WRAP if clipped is None else StoreMode.SATURATE
        value = value if clipped is None else clipped
    elif str(out.dtype) != "int32":
        raise _Unsupported(f"{out.name} is {out.dtype}: a STORE writes int8 or int32")
    chain = _chain(value)
    if chain is None:
        raise _Unsupported(f"{value} is not a chain of ALU operations (add, max, min, mul, shift right) "
                           "on one accumulator value")
    spine, steps = chain
    if lookup is not None:
        steps = steps + [table_step(table)]
    loops = m.loops
    steps = steps[_prefix(loops, PREFIX_DONE, steps):]     # run once already, by the first temporary
    n = len(loops)
    guard = m.get("guard")
    valid = [(0, 0)] * n
    if guard is not None:
        valid = tp.padding(guard, loops)
        if valid is None or any(_int(b) != 0 for b, _ in valid):
            raise _Unsupported(f"the guard {guard} is not an upper bound on the nest's loops")
    acc = m.region(spine.source)
    dst = m.region(out)
    calls = []
    if steps:
        calls += _alu_calls(steps, acc, _operand_regions(m, steps), loops, config, partial_ok=True)
    g = _grid(loops, [acc, dst], valid)
    step = 1
    if not g.col_ok:
        # the accumulator contiguous, the output a constant stride apart: STORE's element stride
        step = _int(dst.strides[-1]) if loops and _int(acc.strides[-1]) == 1 else None
        if step is None or step < 1:
            raise _Unsupported(f"{out.name} or the accumulator is not contiguous along the innermost loop")
    # a guard that ends a loop outside the 2-D box early (the last block of whole image rows
    # holds rows past the image's: their accumulator rows are computed, never stored) runs
    # that loop fewer times
    outer = [l if _int(after) == 0 else
             tirx.For(l.loop_var, l.min, _SIMPLIFY.simplify(l.extent - after), l.kind, l.body)
             for l, (_, after) in zip(g.outer, valid)]
    sram_ld, dram_ld = g.row_stride
    rows, cols = g.rows - g.rows_after, g.cols - g.cols_after
    if step > 1 and not (None not in (_int(rows), _int(cols), _int(dram_ld))
                         and distinct_starts(_int(rows), _int(dram_ld), _int(cols), step)):
        raise _Unsupported(f"{out.name}'s {rows} x {cols} block ({dram_ld} and {step} apart) writes an element twice")

    def make(shifts):
        return STORE[mode].call(host=out, elem_offset=dst.offset + shifts[0],
                    sram_addr=address(acc.buffer, acc.offset + shifts[1]), sram_ld=sram_ld, rows=rows,
                    cols=cols, dram_ld=dram_ld, dram_step=step)

    calls.append(_around(outer, [g.outer_strides(dst), g.outer_strides(acc)], make))
    body = calls[0] if len(calls) == 1 else tirx.SeqStmt(calls)
    if steps:
        # The epilogue runs in place on the accumulator: the planner checks that nothing
        # reads it again afterwards.
        body = tirx.AttrStmt(acc.buffer, IN_PLACE, tirx.IntImm("int32", 0), body)
    return body


# ----------------------------------------------------------------------------- the rule set
def _scratch(name, scope=None):
    if scope is not None:
        return tp.is_buffer(name, scope=scope)
    return tp.is_buffer(name, scope=INP) | tp.is_buffer(name, scope=WGT) | tp.is_buffer(name, scope=ACC)


def _same_indices(a, b) -> bool:
    return len(a.indices) == len(b.indices) and all(
        tvm_ffi.structural_equal(x, y) for x, y in zip(a.indices, b.indices))


def rules(config: Config | None = None) -> tp.Rewriter:
    """accel's rewrite rules as one tirpat Rewriter (ordered: load, gemm, zero_init, alu, store).

    >>> [r.name for r in rules().rules][:2]
    ['accel.load', 'accel.gemm']
    """
    config = config or Config()
    copy_in = tp.is_copy(dst=_scratch("dst"), src=tp.is_buffer("src"), name="copy")

    C, A, W = _scratch("C", ACC), _scratch("A", INP), _scratch("W", WGT)
    acc = tp.is_load(C, None)
    update = tp.is_store(C, None, acc + tp.is_load(A, None).astype("int32") * tp.is_load(W, None).astype("int32"))
    gemm = tp.is_nest(None, update).where(lambda m: _same_indices(m[update], m[acc]))

    zero_store = tp.is_store(_scratch("C", ACC), None, tp.is_const(0))
    zero = tp.is_nest(None, zero_store)

    in_place = tp.is_store(_scratch("C", ACC), None, tp.wildcard())
    alu = tp.is_nest(None, in_place) | tp.is_nest(None, tp.is_if(tp.wildcard("alu_guard"), in_place)) | in_place

    host = tp.is_buffer("out").where(lambda m: not is_scratchpad(m["out"]))
    to_host = tp.is_store(host, None, tp.wildcard())
    guarded = tp.is_if(tp.wildcard("guard"), to_host)
    store = tp.is_nest(None, to_host) | tp.is_nest(None, guarded) | to_host | guarded

    return (
        tp.Rewriter.from_pattern(copy_in, _declining(_load), name="accel.load")
        | tp.Rewriter.from_pattern(gemm, _declining(lambda m: _gemm(m, config)), name="accel.gemm")
        | tp.Rewriter.from_pattern(zero, _declining(lambda m: _zero_init(m, config)), name="accel.zero_init")
        | tp.Rewriter.from_pattern(alu, _declining(lambda m: _alu(m, m[in_place], config)), name="accel.alu")
        | tp.Rewriter.from_pattern(store, _declining(lambda m: _store(m, m[to_host], config)), name="accel.store")
        | elementwise.rule()
        | upsample.rule()
    )


class _Unsupported(Exception):
    """A site a rule matched but cannot offload; the message says why."""


def _declining(callback):
    """``callback``, declining the site with its reason (listed by the rewrite report and by
    ``tp.explain``) where it cannot be offloaded; the scratchpad access is then left
    unmatched and the planner names it."""
    def run(m):
        try:
            return callback(m)
        except _Unsupported as why:
            return tp.decline(str(why))
        except tp.RegionError as err:
            return tp.decline(f"an access is not an affine region: {err}")

    return run
