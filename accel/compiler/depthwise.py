"""Depthwise convolutions on DWMAC: recognising them and laying them out for it.

A depthwise convolution block, as Relax legalises ``conv2d`` with groups = channels and one
output channel per group (topi's ``group_conv2d_nchw`` / ``group_conv2d_nhwc``)::

    C[n, y, x, f] += X[n, y*sy + ry*dy, x*sx + rx*dx, f + rc] * W[ry, rx, rc, f]     (rc < 1)

reads one input channel per output channel: not a matrix product, but DWMAC's per-channel
multiply-accumulate, ``acc[p, c] += inp[p, c] * wgt[c]`` on tiles of 16 output pixels ``x``
by 16 channels ``f``, one instruction per tile, its two loop levels the kernel's taps ``ry``
and ``rx``. :func:`normalise` gives the block that form with schedule primitives, reusing the
convolution normaliser's layout steps (:mod:`accel.compiler.conv`):

- the input is read channels-last (an NCHW input transposed on the CPU with its zero padding;
  a channels-last one read in place, the image border as the LOADs' padding), through a
  re-indexed view ``[n, y, rc, ry, rx, x, f]`` (``[n, rc, ry, rx, y, f]`` for an output one
  pixel wide: its tiles' pixels run down the column) whose tile for one tap ``(ry, rx)`` is
  ``X[n, y*sy + ry*dy, (x0 + p)*sx + rx*dx, f0 + c]``, 16 pixels of 16 channels;
- the weights are reordered on the CPU to ``[KH, KW, C, 1]``, a row of channels per tap;
- an NCHW result is written channels-last by the accelerator and transposed on the CPU.

The scheduler (:func:`accel.compiler.schedule.schedule_in`) then pads ``x`` and ``f`` to whole
tiles (or lays the pixels out over the image: :func:`flatten`), and :func:`band` makes the
block read the view's taps along the pixels from bands ``[n, y, rc, ry, j, f]``: a kernel
row's taps ``rx`` read the same input row at overlapping pixels, so a tile's INP holds one
band per kernel row, ``X[n, y*sy + ry*dy, x0*sx + j, f0 + c]`` for the ``15*sx + (KW-1)*dx + 1``
pixels ``j`` its taps read, one strided LOAD each (``KH`` a tile, not ``KH*KW`` LOADs of 16
pixels), and DWMAC reads tap ``rx`` from ``rx*dx`` rows into the band, rows ``sx*16`` apart.
It tiles, stages and runs the epilogue as for a GEMM.

>>> dw, why = analyse(block, store, (x_load, w_load))     # doctest: +SKIP
>>> view = normalise(sch, dw, notes)                      # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import functools
import math

import tvm_ffi
from tvm import ir, s_tir, sym, tirx

from accel.compiler.blocks import DATA_PAR, REDUCE, mark_layout_stage, read_index
from accel.compiler.conv import (Conv, gather_input, input_read, output_channels_last, permute, var_key, vars_in)

#: The order of the re-indexed input view's dimensions (those it has), the pixels' (``x``, or
#: ``y`` for an output one pixel wide) moved last but the channels: a tap's tile is the last
#: two, pixels by channels (the band's, :func:`band`, has the pixels of a kernel row's taps).
VIEW_ORDER = ("n", "y", "x", "c", "ry", "rx", "f")

GROUPED = ("a grouped convolution with several input channels per group: accel runs depthwise "
           "ones (one input and one output channel per group)")


@dataclass
class Depthwise(Conv):
    """A recognised depthwise conv2d block: :class:`~accel.compiler.conv.Conv`'s roles, with
    ``c`` the reduction over the group's one input channel (extent 1; absent from ``pos``
    when the weight is indexed by the constant 0 there instead) and the input's channel
    dimension indexed by ``f + c`` (or ``f``).

    >>> dw.ext                                        # doctest: +SKIP
    {'n': 1, 'f': 24, 'y': 5, 'x': 5, 'c': 1, 'ry': 3, 'rx': 3}
    """


@dataclass(frozen=True)
class View:
    """What :func:`normalise` leaves for the scheduler: the re-indexed input ``inp`` (its
    dimensions, by role, in :data:`VIEW_ORDER`), the reordered weight, the producers to fold
    into the INP copy (``inline``), the block the epilogue ends before (``stop``), and the
    index map staging an epilogue operand of an NCHW result channels-last."""

    inp: ir.Var
    weight: ir.Var
    dims: tuple
    inline: tuple
    stop: str | None
    source: str
    operand_layout: object = None


def analyse(block, store, loads) -> tuple[Depthwise | None, str | None]:
    """``(Depthwise, None)`` if ``block`` (whose body is ``store`` of ``C + X * W`` with the two
    ``loads``) is a depthwise conv2d, else ``(None, reason)``.

    >>> analyse(sch.get(sch.get_sblock("group_conv2d_nchw")), store, loads)[0].ext   # doctest: +SKIP
    {'n': 1, 'f': 24, 'y': 5, 'x': 5, 'c': 1, 'ry': 3, 'rx': 3}
    """
    iters = list(block.iter_vars)
    pos = {var_key(iv.var): n for n, iv in enumerate(iters)}
    kind = {var_key(iv.var): int(iv.iter_type) for iv in iters}
    not_dw = (None, "it is not a depthwise 2-D convolution (input [N, H, W, C] in some order read at channel "
                    "f + c, weight [KH, KW, 1, F] in some order)")

    def plain(indices):
        keys = [var_key(e) if isinstance(e, tirx.Var) else None for e in indices]
        return keys if all(k in pos for k in keys) and len(set(keys)) == len(keys) else None

    out = plain(store.indices)
    compound = [l for l in loads if any(len(vars_in(e)) > 1 for e in l.indices)]
    if out is None or len(out) != 4 or len(compound) != 1:
        return not_dw
    x_load = compound[0]
    w_load = loads[1] if x_load is loads[0] else loads[0]
    # the weight's group-input-channel index: a reduction of extent 1, or the constant 0 (topi's
    # depthwise_conv2d writes W[f, 0, ry, rx])
    zero = [d for d, e in enumerate(w_load.indices) if isinstance(e, tirx.IntImm) and e.value == 0]
    w_keys = plain([e for d, e in enumerate(w_load.indices) if d not in zero[:1]])
    if w_keys is None or len(w_keys) + len(zero[:1]) != 4:
        return not_dw
    roles, in_dim, spatial = {}, {}, []
    for d, e in enumerate(x_load.indices):
        vs = {var_key(v): v for v in vars_in(e) if var_key(v) in pos}
        coeffs = sym.detect_linear_equation(e, list(vs.values()))
        if len(coeffs) != len(vs) + 1 or not vs:
            return None, (f"its input index {e} is not affine (a grouped convolution with several channels per "
                          "group reads channel f // n * n + c): accel runs depthwise ones")
        coef = dict(zip(vs, (int(c) for c in coeffs)))
        red = [k for k in vs if kind[k] == REDUCE]
        par = [k for k in vs if kind[k] == DATA_PAR]
        if len(par) == 1 and par[0] in w_keys and len(red) <= 1 and all(coef[k] == 1 for k in vs) \
                and int(coeffs[-1]) == 0 and "c" not in in_dim:
            # the channel: the output channel f plus the group's input channel (extent 1)
            in_dim["c"], roles["f"] = d, par[0]
            if red:
                roles["c"] = red[0]
        elif len(vs) == 1 and par and coef[par[0]] == 1 and int(coeffs[-1]) == 0 and "n" not in in_dim:
            in_dim["n"], roles["n"] = d, par[0]
        elif len(red) == 1 and len(par) == 1:
            spatial.append((d, par[0], red[0], (coef[par[0]], coef[red[0]], int(coeffs[-1]))))
        else:
            return not_dw
    if len(spatial) != 2 or set(in_dim) != {"n", "c"}:
        return not_dw
    if ("c" in roles) == bool(zero):
        return not_dw
    (dy, y, ry, taps_y), (dx, x, rx, taps_x) = spatial
    in_dim.update(y=dy, x=dx)
    roles.update(y=y, x=x, ry=ry, rx=rx)
    weight_roles = {roles[r] for r in ("f", "c", "ry", "rx") if r in roles}
    if len(set(roles.values())) != len(roles) or set(w_keys) != weight_roles or \
            set(out) != {roles[r] for r in ("n", "y", "x", "f")}:
        return not_dw
    ext = {"c": 1}
    for r, k in roles.items():
        e = iters[pos[k]].dom.extent
        if not isinstance(e, tirx.IntImm):
            return None, f"dynamic shape: {e} is not a constant"
        ext[r] = int(e.value)
    if ext["c"] != 1:
        return None, GROUPED
    by_key = {k: r for r, k in roles.items()}
    w_dims = [d for d in range(4) if d not in zero[:1]]
    w_dim = {by_key[k]: d for d, k in zip(w_dims, w_keys)}
    if zero:
        w_dim["c"] = zero[0]
    return Depthwise(block.name_hint, x_load.source, w_load.source, {r: pos[k] for r, k in roles.items()}, ext,
                     in_dim, w_dim, {by_key[k]: d for d, k in enumerate(out)}, {"y": taps_y, "x": taps_x}), None


def pixels(dw: Depthwise) -> str | None:
    """The output dimension a DWMAC tile's rows run along: ``x``, or ``y`` when the output
    is one pixel wide (TVM drops an extent-1 iter from the input's index); None when it is
    one pixel in all (no tile of pixels to gather).

    >>> pixels(dw)                                # doctest: +SKIP
    'x'
    """
    return "x" if dw.ext["x"] > 1 else "y" if dw.ext["y"] > 1 else None


def normalise(sch: s_tir.Schedule, dw: Depthwise, notes) -> View:
    """Lay the depthwise block of ``sch`` out for DWMAC (see the module docstring); CPU steps
    go to ``notes.on_cpu``. Returns the :class:`View` the scheduler tiles.

    >>> view = normalise(sch, dw, notes)       # doctest: +SKIP
    >>> view.dims                              # doctest: +SKIP
    ('n', 'y', 'ry', 'rx', 'x', 'f')
    """
    blk = sch.get_sblock(dw.block)
    inline, source = gather_input(sch, blk, dw, True, notes)
    weight = _weights(sch, blk, dw, notes)
    stop = output_channels_last(sch, blk, dw, notes)
    keys = [var_key(iv.var) for iv in sch.get(blk).iter_vars]
    role_of = {keys[dw.pos[r]]: r for r in dw.pos}
    view = sch.reindex(blk, ("read", input_read(sch, blk, weight)))
    view_buffer = sch.get(view).writes[0].source
    read = sch.get(blk).reads[read_index(sch, blk, view_buffer)]
    # TVM leaves out of the view the iters of extent 1 that it dropped from the input's indices
    dims = {role_of[var_key(r.min)]: n for n, r in enumerate(read.region)}
    pix = pixels(dw)
    order = tuple(r for r in VIEW_ORDER if r in dims and r not in (pix, "f")) + (pix, "f")
    sch.transform_layout(view, ("write", 0), permute(dims, order))
    return View(sch.get(view).writes[0].source, weight, order, (*inline, sch.get(view).name_hint), stop, source,
                None if dw.channels_last_output else permute(dw.out_dim, ("n", "y", "x", "f")))


def _weights(sch, blk, dw: Depthwise, notes) -> ir.Var:
    """Reorder the weights on the CPU to ``[KH, KW, C, 1]``; returns the reordered buffer."""
    stage = sch.cache_read(blk, read_index(sch, blk, dw.weight), "global")
    sch.transform_layout(stage, ("write", 0), permute(dw.w_dim, ("ry", "rx", "f", "c")))
    mark_layout_stage(sch, stage)
    notes.on_cpu.append((sch.get(stage).name_hint, "reorders the weights to [KH, KW, C] on the CPU (DWMAC "
                         "reads a row of channels per kernel tap)"))
    return sch.get(stage).writes[0].source


@dataclass(frozen=True)
class Flat:
    """The output pixels of a depthwise convolution run over its image (``pixels="image"``)
    instead of row by row: pixel ``q = y*width + x`` of a virtual width ``width`` (at least
    the padded input's, which the CPU lays out with rows ``width`` pixels apart), so that a
    tap's input pixel ``q*sx + ry*dy*width + rx*dx`` is affine in ``q`` across image rows and
    a DWMAC tile of 16 consecutive ``q`` is one strided LOAD per kernel row (:func:`band`). The columns
    ``x >= W`` read the next row's pixels (garbage, never stored); a block of output tiles is
    ``rows`` whole virtual rows, ``height`` the image's rows padded to whole blocks.

    >>> Flat(width=24, rows=2, height=20).tiles_per_block(16)
    3
    """

    width: int
    rows: int
    height: int

    def tiles_per_block(self, t: int) -> int:
        """The output tiles of a block of :attr:`rows` virtual rows."""
        return self.rows * self.width // t

    def tiles(self, t: int) -> int:
        """The output tiles of the whole image (per batch item and tile of channels)."""
        return self.height * self.width // t


def input_extent(dw: Depthwise, role: str) -> int:
    """The extent of the (padded) input the convolution reads along ``role`` (``y``, ``x``)."""
    return int(dw.input.shape[dw.in_dim[role]])


def flat_layouts(dw: Depthwise, t: int, limit: int) -> list:
    """The :class:`Flat` layouts worth trying for ``dw`` (tiles of ``t`` pixels, at most
    ``limit`` tiles a block), fewest output tiles first: per virtual width from the padded
    input's up to 15 more, the fewest whole rows a block holds (``rows * width`` a whole
    number of tiles) and the image's rows padded to whole blocks; none where the output is one
    pixel wide or one row high (its tiles run down the column or along the row already), or
    where the strides differ (a pixel's input address is affine in ``q`` for one stride).

    >>> flat_layouts(dw, 16, 16)[0]          # doctest: +SKIP
    Flat(width=24, rows=2, height=20)
    """
    if pixels(dw) != "x" or dw.ext["y"] < 2 or dw.taps["y"][0] != dw.taps["x"][0]:
        return []
    out = []
    for width in range(input_extent(dw, "x"), input_extent(dw, "x") + t):
        rows = t // math.gcd(width, t)
        if rows * width // t > limit:
            continue
        # the rows padded to whole blocks (the last block's rows past the image's computed, not stored)
        out.append(Flat(width, rows, -(-dw.ext["y"] // rows) * rows))
    return sorted(out, key=lambda f: (f.tiles(t), f.rows, f.width))


def flatten(sch: s_tir.Schedule, name: str, dw: Depthwise, view: View, flat: Flat, f_pad: int, notes) -> View:
    """Lay the depthwise block ``name`` (after :func:`normalise`) out over its image's pixels
    (:class:`Flat`): the CPU writes the input channels-last with rows ``flat.width`` apart
    (zeros beyond the padded image, and rows enough for the garbage columns' reads), the
    block is padded to ``flat.height x flat.width`` pixels and ``f_pad`` channels, and its
    pixels ``(y, x)`` become one iter ``q = y*width + x`` (the accumulator ``[.., q, f]``).
    The padded pixels read the input where the flat layout puts them, not zeros: the one
    step no schedule primitive takes, since it changes what the garbage columns compute,
    which only the epilogue's STORE of the valid ``(y, x)`` may read (it never does).
    Returns the :class:`View` with the block's iters ``(.., q, ..)`` (``x`` the fused one,
    ``y`` gone)."""
    e, width = dw.ext, flat.width
    reindex = sch.get_sblock(view.inline[-1])
    source = sch.get(reindex).reads[0].source
    stage = next((p for p in sch.get_producers(reindex)
                  if any(w.source.same_as(source) for w in sch.get(p).writes)), None)
    inline = view.inline[:-1]
    if stage is None:       # the input itself: copied by the CPU into the flat layout
        stage = sch.cache_read(reindex, 0, "global")
        notes.on_cpu.append((sch.get(stage).name_hint, "copies the input with rows of the virtual width "
                             "(DWMAC tiles run over the image's pixels)"))
    elif sch.get(stage).name_hint in inline:    # the border LOADs would pad: the CPU pads
        inline = tuple(b for b in inline if b != sch.get(stage).name_hint)
        notes.on_cpu.append((sch.get(stage).name_hint, "zero-pads the input with rows of the virtual width "
                             "(DWMAC tiles run over the image's pixels)"))
    dims = _channels_last(dw)
    # the last input element a padded pixel reads (the garbage columns wrap into the next row)
    (sy, dy, oy), (sx, dx, ox) = dw.taps["y"], dw.taps["x"]
    last = ((flat.height - 1) * sy + (e["ry"] - 1) * dy + oy) * width + (width - 1) * sx + (e["rx"] - 1) * dx + ox
    height = max(last // width + 1, input_extent(dw, "y"))
    sch.transform_layout(stage, ("write", 0), lambda *ax: (
        ax[dims["n"]], ax[dims["y"]] // height, ax[dims["y"]] % height, ax[dims["x"]] // width,
        ax[dims["x"]] % width, ax[dims["c"]]), pad_value=0)
    sch.transform_layout(stage, ("write", 0), lambda n, a, y, b, x, c: (n, (a * height + y + b) * width + x, c))
    blk = sch.get_sblock(name)
    keys = [var_key(iv.var) for iv in sch.get(blk).iter_vars]
    padded = [width if k == keys[dw.pos["x"]] else flat.height if k == keys[dw.pos["y"]] else
              f_pad if k == keys[dw.pos["f"]] else int(iv.dom.extent.value)
              for k, iv in zip(keys, sch.get(blk).iter_vars)]
    if padded != [int(iv.dom.extent.value) for iv in sch.get(blk).iter_vars]:
        sch.pad_einsum(blk, padded)
    padder = next((p for p in sch.get_producers(blk) if sch.get(p).name_hint.endswith("_pad") and
                   len(sch.get(p).writes[0].source.shape) == len(view.dims)), None)
    if padder is None:      # the view is not padded (a virtual width of the output's): its own block
        padder, inline = reindex, (*inline, view.inline[-1])
    else:
        sch.compute_inline(reindex)

    def fuse(ax, order):
        """``ax`` (in the roles' ``order``) with ``y`` and ``x`` made one, ``y*width + x``, where ``x`` was."""
        return tuple(ax[order.index("y")] * width + ax[order.index("x")] if r == "x" else ax[order.index(r)]
                     for r in order if r != "y")

    # the pixels next to each other first: then fused (TVM inverts a fusion of adjacent axes)
    adjacent = tuple(r for r in view.dims if r not in ("y", "x", "f")) + ("y", "x", "f")
    sch.transform_layout(padder, ("write", 0), permute({r: n for n, r in enumerate(view.dims)}, adjacent))
    sch.transform_layout(padder, ("write", 0), lambda *ax: fuse(ax, adjacent))
    # the padded view's producer iterates its pixels as q too, so that its bounds and the input's
    # index are in q alone (the index simplified to q*sx + ..., affine in q)
    dtype = sch.get(padder).iter_vars[0].var.ty.dtype
    sch.transform_block_layout(padder, tirx.IndexMap.from_func(
        lambda *ax: fuse(permute({r: n for n, r in enumerate(view.dims)}, adjacent)(*ax), adjacent),
        ndim=len(view.dims), index_dtype=dtype))
    _read_padding(sch, padder, adjacent.index("x") - 1)
    roles = tuple(sorted(dw.pos, key=dw.pos.get))
    dtype = sch.get(blk).iter_vars[0].var.ty.dtype
    sch.transform_block_layout(blk, tirx.IndexMap.from_func(lambda *ax: fuse(ax, roles), ndim=len(roles),
                                                            index_dtype=dtype))
    return View(view.inp, view.weight, tuple(r for r in adjacent if r != "y"), inline, view.stop,
                sch.get(stage).name_hint, view.operand_layout)


def _channels_last(dw: Depthwise) -> dict:
    """The positions of ``n, y, x, c`` in the channels-last input the CPU stage writes."""
    if dw.channels_last_input:
        return dict(dw.in_dim)
    return {"n": 0, "y": 1, "x": 2, "c": 3}


def _read_padding(sch: s_tir.Schedule, padder, pixel: int) -> None:
    """Drop from the padded input view's producer ``padder`` (``if_then_else(in bounds,
    X[..], 0)``, or a plain load of ``X`` where nothing is padded; its iter ``pixel`` the
    fused pixel ``q``) the bounds on the pixels, keeping the channels': a padded pixel reads
    the flat input where its address falls (:func:`flatten`); its index simplified, so that
    it is affine in ``q``."""
    block = sch.get(padder)
    q = block.iter_vars[pixel].var
    value = block.body.value
    guard, load = _guarded_load(value)
    if not isinstance(load, ir.TensorLoad):
        raise ValueError(f"the input view {block.name_hint} is not a load of the input (if in bounds): {value}")
    analyzer = sym.Analyzer()
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    load = tirx.BufferLoad(load.source, [analyzer.simplify(i) for i in load.indices])
    cond = _without(guard, (q,)) if guard is not None else None
    new_value = load if cond is None else tirx.if_then_else(cond, load, value.args[2])
    body = tirx.BufferStore(block.body.buffer, new_value, block.body.indices)
    # the same buffer read: the block's access regions stand (TVM recomputes them as it needs)
    new = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init,
                       block.alloc_buffers, block.match_buffers, block.annotations)
    sch.state.replace(sch.get_sref(padder), new, {block: new})


def flatten_accumulator(sch: s_tir.Schedule, name: str, dw: Depthwise, width: int) -> None:
    """Lay the accumulator of the flattened block ``name`` (:func:`flatten`; the epilogue
    inlined into the block that reads it) out as ``[n, y*width + x, f]``: a DWMAC tile's 16
    pixels ``q`` are then 16 consecutive rows of it, and the epilogue reads a valid pixel
    ``(y, x)`` at row ``y*width + x``."""
    order = tuple(sorted(dw.out_dim, key=dw.out_dim.get)) if dw.channels_last_output else ("n", "y", "x", "f")
    fused = tuple(r for r in order if r not in ("y", "x", "f")) + ("q", "f")
    sch.transform_layout(sch.get_sblock(name), ("write", 0), lambda *ax: tuple(
        ax[order.index("y")] * width + ax[order.index("x")] if r == "q" else ax[order.index(r)] for r in fused))


#: The kernel taps along each dimension a DWMAC tile's pixels run: the taps a band serves.
_BAND_TAP = {"x": "rx", "y": "ry"}


def band_rows(dw: Depthwise, t: int) -> int | None:
    """The input pixels one INP band holds: what the taps along the pixels (``rx``, or
    ``ry`` for an output one pixel wide) of a tile of ``t`` output pixels read of one input
    row (a kernel row), ``(t - 1)*s + (K - 1)*d + 1`` for stride ``s``, dilation ``d`` and
    ``K`` taps; None where a band is not fewer LOADs of no more bytes than a tile per tap
    (one tap along the pixels; a stride larger than the taps, whose band has pixels no
    tap reads).

    >>> dw = Depthwise("conv", None, None, {}, {"y": 8, "x": 20, "ry": 3, "rx": 3}, {}, {}, {},
    ...                {"y": (2, 1, 0), "x": (2, 1, 0)})     # 3 x 3, stride 2
    >>> band_rows(dw, 16)
    33
    """
    pix = pixels(dw)
    if pix is None:
        return None
    k = dw.ext[_BAND_TAP[pix]]
    s, d, _ = dw.taps[pix]
    rows = _reach(t, k, s, d)
    return rows if k > 1 and rows <= k * t else None


def _reach(pixels: int, taps: int, stride: int, dilation: int) -> int:
    """The input pixels ``taps`` taps of ``pixels`` consecutive output pixels read (stride and
    dilation along them): ``(pixels - 1)*stride + (taps - 1)*dilation + 1``.

    >>> _reach(16, 3, 2, 1)
    33
    """
    return (pixels - 1) * stride + (taps - 1) * dilation + 1


def input_loads(dw: Depthwise, t: int) -> tuple[int, int]:
    """``(LOADs, pixels each)`` of a tile's input: a band of :func:`band_rows` pixels per tap
    across the pixels (:func:`band`), else a tile of ``t`` pixels per tap.

    >>> dw = Depthwise("conv", None, None, {}, {"y": 8, "x": 20, "ry": 3, "rx": 3}, {}, {}, {},
    ...                {"y": (2, 1, 0), "x": (2, 1, 0)})     # 3 x 3, stride 2
    >>> input_loads(dw, 16)
    (3, 33)
    """
    rows = band_rows(dw, t)
    if rows is None:
        return dw.ext["ry"] * dw.ext["rx"], t
    return dw.ext["ry" if _BAND_TAP[pixels(dw)] == "rx" else "rx"], rows


def inp_elements(dw: Depthwise, t: int) -> int:
    """The INP elements a tile's input takes: its :func:`input_loads` of ``t`` channels.

    >>> dw = Depthwise("conv", None, None, {}, {"y": 8, "x": 20, "ry": 3, "rx": 3}, {}, {}, {},
    ...                {"y": (2, 1, 0), "x": (2, 1, 0)})     # 3 x 3, stride 2
    >>> inp_elements(dw, 16), 3 * 3 * 16 * 16         # 3 bands of 33 pixels, not 9 tiles of 16
    (1584, 2304)
    """
    loads, rows = input_loads(dw, t)
    return loads * rows * t


def band(sch: s_tir.Schedule, name: str, dw: Depthwise, view: View, t: int) -> View:
    """Make the depthwise block ``name`` (laid out, padded, perhaps over the image: the
    block reading ``view`` as ``V[.., ry, rx, x, f]``) read its input through bands:
    ``B[.., ry, j, f]``, the input row of kernel row ``ry`` at input pixel ``j`` (pixel
    ``j`` of a virtual width over the image), which the block reads at ``j = x*s + rx*d``.
    Staged at a tile of ``t`` pixels, ``B``'s region is one LOAD per kernel row of
    :func:`band_rows` pixels, whose taps ``rx`` DWMAC reads ``rx*d`` rows in with row
    stride ``s*t``, not a LOAD per tap of overlapping pixels. The view's producer (a
    load of the input, guarded where padded) becomes the band's: the guards on the
    channels kept, those on the pixels (the padded pixels' zeros: they compute columns no
    STORE reads) dropped, and bounds added where the band reaches past the input (the
    LOAD's padding). The step no schedule primitive takes (the view's elements are not
    one-to-one with the band's); where :func:`band_rows` is None ``view`` is returned as it
    is.

    >>> view = band(sch, name, dw, view, 16)      # doctest: +SKIP
    >>> view.dims                                 # doctest: +SKIP
    ('n', 'y', 'ry', 'x', 'f')
    """
    if band_rows(dw, t) is None:
        return view
    pix = pixels(dw)
    tap = _BAND_TAP[pix]
    s_, d_, _ = dw.taps[pix]
    blk = sch.get_sblock(name)
    read = next(r for r in sch.get(blk).reads if not r.source.same_as(view.weight))
    producer = next(p for p in sch.get_producers(blk) if sch.get(p).writes[0].source.same_as(read.source))
    reindex = next((p for p in sch.get_producers(producer) if sch.get(p).writes[0].source.same_as(view.inp)), None)
    inline = view.inline
    if reindex is not None:     # into the padding's guard: the padded view's producer loads the input
        inline = tuple(b for b in inline if b != sch.get(reindex).name_hint)
        sch.compute_inline(reindex)
    old = sch.get(producer)
    store, value = old.body, old.body.value
    guard, load = _guarded_load(value)
    if not isinstance(load, ir.TensorLoad) or len(store.indices) != len(view.dims) or \
            not all(isinstance(i, tirx.Var) for i in store.indices):
        raise ValueError(f"the input view's producer {old.name_hint} is not V[{', '.join(view.dims)}] = a load "
                         f"of the input (where in bounds): {value}")
    at = {r: n for n, r in enumerate(view.dims)}
    iters = {var_key(iv.var): iv for iv in old.iter_vars}
    vp, vt = store.indices[at[pix]], store.indices[at[tap]]
    [k] = [n for n, e in enumerate(load.indices) if any(v.same_as(vp) or v.same_as(vt) for v in vars_in(e))]
    rest = _pixel_offset(load.indices[k], vp, vt, (s_, d_))
    shape = [int(e) for e in read.source.shape]
    width = _reach(shape[at[pix]], shape[at[tap]], s_, d_)
    j = tirx.Var("j", vp.ty.dtype)
    index = sym.Analyzer().simplify(j + rest)
    band_iters = [tirx.IterVar(ir.Range.from_min_extent(tirx.IntImm(vp.ty.dtype, 0), tirx.IntImm(vp.ty.dtype, width)),
                               j, DATA_PAR) if r == pix else iters[var_key(store.indices[n])]
                  for n, r in enumerate(view.dims) if r != tap]
    analyzer = sym.Analyzer()
    for iv in band_iters:
        analyzer.bind(iv.var, iv.dom)
    # bounds where the band reaches past the input (the padded pixels' columns read there)
    bounds = [c for c in (0 <= index, index < load.source.shape[k]) if not analyzer.can_prove(c)]
    # the padded pixels (vp >= valid: zeros in the view) read zeros past the last valid pixel's
    # taps: those that read only there stay zero, values the simulator's batched replay folds
    valid = _upper_bound(guard, vp) if guard is not None else None
    if valid is not None and _reach(valid, shape[at[tap]], s_, d_) < width:
        bounds.append(j < _reach(valid, shape[at[tap]], s_, d_))
    conds = [c for c in (_without(guard, (vp, vt)) if guard is not None else None, *bounds) if c is not None]
    cond = functools.reduce(tirx.And, conds) if conds else None
    source = tirx.BufferLoad(load.source, [index if n == k else e for n, e in enumerate(load.indices)])
    src = read.source
    bands = tirx.decl_buffer([width if r == pix else shape[n] for n, r in enumerate(view.dims) if r != tap],
                             str(src.dtype), f"{src.name}_band", scope=src.scope())
    indices = [iv.var for iv in band_iters]
    new_value = source if cond is None else tirx.if_then_else(cond, source, tirx.IntImm(str(src.dtype), 0))

    def point(buffer, idx):
        return ir.TensorRegion(buffer, [ir.Range.from_min_extent(i, 1) for i in idx], read.ty)

    producer_block = s_tir.SBlock(band_iters, [point(load.source, source.indices)], [point(bands, indices)],
                                  old.name_hint, tirx.BufferStore(bands, new_value, indices))
    loops = [tirx.Var(f"ax{n}", vp.ty.dtype) for n in range(len(band_iters))]
    nest = s_tir.SBlockRealize(loops, True, producer_block)
    for lv, iv in reversed(list(zip(loops, band_iters))):
        nest = tirx.For(lv, iv.dom.min, iv.dom.extent, tirx.ForKind.SERIAL, nest)

    def banded(idx):
        """The block's index ``[.., ry, rx, x, f]`` of the view as the band's ``[.., ry, x*s + rx*d, f]``."""
        return [idx[at[pix]] * s_ + idx[at[tap]] * d_ if r == pix else idx[n]
                for n, r in enumerate(view.dims) if r != tap]

    def on_load(l):
        return tirx.BufferLoad(bands, banded(l.indices)) if l.source.same_as(src) else l

    compute = sch.get(blk)
    reads = [point(bands, banded([r.min for r in x.region])) if x.source.same_as(src) else x for x in compute.reads]
    new_compute = s_tir.SBlock(compute.iter_vars, reads, compute.writes, compute.name_hint,
                               tvm_ffi.structural_map(compute.body, (ir.TensorLoad, on_load)), compute.init,
                               compute.alloc_buffers, compute.match_buffers, compute.annotations)
    _replace_in_root(sch, {old: producer_block, compute: new_compute}, nest, src, bands)
    return View(bands, view.weight, tuple(r for r in view.dims if r != tap), inline, view.stop, view.source,
                view.operand_layout)


def _pixel_offset(index, vp: ir.Var, vt: ir.Var, steps: tuple) -> ir.Expr:
    """``rest`` of the input's index ``index = vp*s + vt*d + rest`` along the pixels (``vp``
    the view's pixel, ``vt`` the tap along them, ``steps`` the stride and dilation ``(s,
    d)``): a constant, or over the image the kernel row's offset ``ry*dy*width``.

    >>> x, rx, ry = (tirx.Var(n, "int32") for n in ("x", "rx", "ry"))
    >>> _pixel_offset(x * 2 + rx + ry * 48 + 1, x, rx, (2, 1))
    ry * 48 + 1
    """
    coeffs = sym.detect_linear_equation(index, [vp, vt])
    if not coeffs:
        # over the image a stride of 2 leaves the index in // and % of the virtual width (the
        # columns past a row's end read the next row's pixels), which TVM does not simplify:
        # affine all the same, by the flat layout's construction (flatten)
        zero = tirx.IntImm(vp.ty.dtype, 0)
        return sym.Analyzer().simplify(tvm_ffi.structural_map(
            index, (ir.Var, lambda v: zero if v.same_as(vp) or v.same_as(vt) else v)))
    if (int(coeffs[0]), int(coeffs[1])) != steps:
        raise ValueError(f"the input view reads pixel {index}, not {vp.name}*{steps[0]} + {vt.name}*{steps[1]} + ..")
    return coeffs[2]


def _replace_in_root(sch: s_tir.Schedule, blocks: dict, nest, old_buffer: ir.Var, new_buffer: ir.Var) -> None:
    """Replace in ``sch``'s root block each block of ``blocks`` (old: new), the nest of loops
    around the first by ``nest`` (the new block's own), and the allocation of
    ``old_buffer`` by ``new_buffer``."""
    root = sch.get(sch.get_sblock("root"))
    first, *_ = blocks
    swap = (s_tir.SBlock, lambda b: next((new for old, new in blocks.items() if b.same_as(old)), b))
    seq = [nest if _holds(stmt, first) else tvm_ffi.structural_map(stmt, swap) for stmt in root.body.seq]
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, tirx.SeqStmt(seq), root.init,
                            [new_buffer if b.same_as(old_buffer) else b for b in root.alloc_buffers],
                            root.match_buffers, root.annotations)
    sch.state.replace(sch.get_sref(sch.get_sblock("root")), new_root, {root: new_root, **blocks})


def _holds(stmt, block) -> bool:
    """Whether the statement ``stmt`` holds ``block``."""
    found = []
    tvm_ffi.structural_walk(stmt, (s_tir.SBlock, lambda b: found.append(b) if b.same_as(block) else None))
    return bool(found)


def _guarded_load(value) -> tuple:
    """``(guard, load)`` of an input view's value: ``if_then_else(guard, load, pad)`` where it
    is padded, else ``(None, value)``."""
    if isinstance(value, ir.Call) and value.op.name == "prim.if_then_else":
        return value.args[0], value.args[1]
    return None, value


def _upper_bound(cond, var: ir.Var) -> int | None:
    """``c`` if a conjunct of ``cond`` is ``var < c`` (a constant ``c``), else None.

    >>> x, f = tirx.Var("x", "int32"), tirx.Var("f", "int32")
    >>> _upper_bound(tirx.And(x < 20, f < 8), x), _upper_bound(f < 8, x)
    (20, None)
    """
    if isinstance(cond, tirx.And):
        found = [b for b in (_upper_bound(cond.a, var), _upper_bound(cond.b, var)) if b is not None]
        return min(found) if found else None
    if isinstance(cond, tirx.LT) and cond.a.same_as(var) and isinstance(cond.b, tirx.IntImm):
        return int(cond.b.value)
    return None


def _without(cond, variables):
    """The conjunction of the conjuncts of ``cond`` that use none of ``variables``; None if
    every one does."""
    if isinstance(cond, tirx.And):
        parts = [p for p in (_without(cond.a, variables), _without(cond.b, variables)) if p is not None]
        return None if not parts else parts[0] if len(parts) == 1 else tirx.And(*parts)
    return None if any(v.same_as(u) for v in vars_in(cond) for u in variables) else cond
