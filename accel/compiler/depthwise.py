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
  pixel wide: its tiles' pixels run down the column) whose INP tile for one tap ``(ry, rx)`` is
  ``X[n, y*sy + ry*dy, (x0 + p)*sx + rx*dx, f0 + c]``: 16 rows of 16 channels, one strided LOAD;
- the weights are reordered on the CPU to ``[KH, KW, C, 1]``, a row of channels per tap;
- an NCHW result is written channels-last by the accelerator and transposed on the CPU.

The scheduler (:func:`accel.compiler.schedule.schedule_in`) then pads ``x`` and ``f`` to whole
tiles, tiles, stages and runs the epilogue as for a GEMM.

>>> dw, why = analyse(block, store, (x_load, w_load))     # doctest: +SKIP
>>> view = normalise(sch, dw, notes)                      # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import ir, s_tir, sym, tirx

from accel.compiler.blocks import DATA_PAR, REDUCE, mark_layout_stage, read_index
from accel.compiler.conv import (Conv, gather_input, input_read, output_channels_last, permute, var_key, vars_in)

#: The order of the re-indexed input view's dimensions (those it has), the pixels' (``x``, or
#: ``y`` for an output one pixel wide) moved last but the channels: a tap's INP tile is the
#: last two, pixels by channels.
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
