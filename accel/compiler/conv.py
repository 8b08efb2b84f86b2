"""Convolutions as GEMMs: recognising conv2d blocks and rewriting them into GEMM form.

A conv2d block, as topi's ``conv2d_nchw`` and ``conv2d_nhwc`` write it (any layout of input,
weight and output, any stride, padding and dilation, groups = 1)::

    C[n, y, x, f] += X[n, y*sy + ry*dy, x*sx + rx*dx, c] * W[ry, rx, c, f]

is a GEMM with M = output columns ``x``, N = output channels ``f`` and K = ``(ry, rx, c)``,
batched over ``(n, y)`` (M is ``y`` or ``n`` instead when ``x`` has extent 1: TVM drops such
an iter from ``x*sx + rx*dx``). :func:`normalise` turns it into that form with schedule primitives,
so that the scheduler's GEMM path (padding, tiling, scratchpad staging, epilogues) applies:

- **direct gather** (the default): K stays three loops, ``ry`` and ``rx`` outside the tile and
  ``c`` tiled. One INP tile is then ``X[n, y*sy + ry*dy, (x0 + i)*sx + rx*dx, c0 + k]`` for
  ``i, k < 16``: a strided 2-D view of the channels-last input, so the im2col matrix is never
  built; the copy into INP becomes a strided LOAD, and the image border its padding (rows
  of the tile outside the image, or the whole tile where ``y*sy + ry*dy`` is outside);
- **im2col on the CPU**: when the channels are few (padding ``c`` to a whole tile would waste
  more than an eighth of every INP tile, e.g. 3 channels of an RGB image), K is fused into
  one loop and the CPU builds the im2col matrix.

M runs over one output row's pixels (``pixels="row"``), or, with the im2col gather, over a
whole image's (``"image"``: ``m = y*W + x``). A row short of a whole tile pads each row
(rows of 20 pixels to 32: 1.6 times the MACs), an image only its end (400 pixels are 25
tiles), so :func:`image_pays` takes the image where it pads fewer pixels and the im2col
matrix costs the CPU nothing the direct gather does not (a 1x1 kernel reading an NCHW input,
whose transpose to channels-last it is; or channels too few for the direct gather). Where
the result goes through a CPU transpose to NCHW anyway, its channels-last intermediate is
laid out ``[N, H*W, F]``, so a block of pixels is stored as one run whatever the width, and
the blocks are a plain GEMM's (on ppocrv6_det_small's 20 x 20 and 10 x 10 outputs, 1.6
times fewer MACs).

The input is read channels-last (an NCHW input is transposed on the CPU, together with its
zero padding), the weights are reordered on the CPU to ``[ry, rx, F, C]`` (direct) or
``[F, K]`` (im2col), since the GEMM reads weight rows along K, and an NCHW result is written
channels-last by the accelerator and transposed on the CPU. Every CPU step is recorded with
its reason.

>>> conv, why = analyse(block, store, (x_load, w_load))    # doctest: +SKIP
>>> gemm = normalise(sch, conv, config, notes)             # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import tvm_ffi
from tvm import ir, s_tir, sym, tirx
from tvm.s_tir.schedule import SBlockRV

from accel.compiler.blocks import (DATA_PAR, REDUCE, GemmAnalysis, mark_layout_stage,
                                   pointwise_dag, read_index)
from accel.hw.config import Config

DEPTHWISE = ("a depthwise or grouped convolution: each output channel reads only its own group "
             "of input channels, which is not one matrix product")


@dataclass
class Conv:
    """A recognised conv2d block: its name, buffers, and where each role sits.

    ``pos`` maps a role (``n``, ``y``, ``x``, ``f``, ``ry``, ``rx``, ``c``) to its block iter
    position; ``in_dim``, ``w_dim`` and ``out_dim`` map roles to buffer dimensions.

    >>> conv.ext["c"], conv.in_dim["c"]      # doctest: +SKIP
    (64, 3)
    """

    block: str
    input: ir.Var
    weight: ir.Var
    pos: dict
    ext: dict
    in_dim: dict
    w_dim: dict
    out_dim: dict
    taps: dict       # "y"/"x": (stride, dilation, offset) of the input index y*s + ry*d + offset

    @property
    def channels_last_input(self) -> bool:
        return self.in_dim["c"] == 3

    @property
    def channels_last_output(self) -> bool:
        return [self.out_dim[r] for r in ("n", "y", "x", "f")] == [0, 1, 2, 3]


def vars_in(e: ir.Expr) -> list[ir.Var]:
    """The scalar variables (not buffer handles) that ``e`` uses, in the order met.

    >>> y, ry = tirx.Var("y", "int32"), tirx.Var("ry", "int32")
    >>> [v.name for v in vars_in(y * 2 + ry)]
    ['y', 'ry']
    """
    found = []
    tvm_ffi.structural_walk(e, (ir.Var, lambda v: found.append(v) if not tirx.is_buffer_var(v) else None))
    return found


def var_key(v: ir.Var) -> int:
    """A variable's identity as a dict key (TVM objects compare structurally otherwise).

    >>> v = tirx.Var("y", "int32")
    >>> var_key(v) == var_key(v) != var_key(tirx.Var("y", "int32"))
    True
    """
    return v.__chandle__()


def analyse(block, store, loads) -> tuple[Conv | None, str | None]:
    """``(Conv, None)`` if ``block`` (whose body is ``store`` of ``C + X * W`` with the two
    ``loads``) is a conv2d with groups = 1, else ``(None, reason)``.

    >>> analyse(sch.get(sch.get_sblock("conv2d_nchw")), store, loads)[0].ext   # doctest: +SKIP
    {'n': 1, 'f': 16, 'y': 5, 'x': 5, 'c': 8, 'ry': 3, 'rx': 3}
    """
    iters = list(block.iter_vars)
    pos = {var_key(iv.var): n for n, iv in enumerate(iters)}
    kind = {var_key(iv.var): int(iv.iter_type) for iv in iters}
    not_conv = (None, "it is not a 2-D convolution (input [N, H, W, C] in some order, weight "
                      "[KH, KW, C, F] in some order)")

    def plain(indices):
        keys = [var_key(e) if isinstance(e, tirx.Var) else None for e in indices]
        return keys if all(k in pos for k in keys) else None

    out = plain(store.indices)
    # the input is the operand indexed by sums of loop variables (y*s + ry*d)
    compound = [l for l in loads if any(len(vars_in(e)) > 1 for e in l.indices)]
    if out is None or len(out) != 4 or len(compound) != 1:
        return not_conv
    x_load = compound[0]
    w_load = loads[1] if x_load is loads[0] else loads[0]
    shared = {var_key(v) for e in w_load.indices for v in vars_in(e)} & \
        {var_key(v) for e in x_load.indices for v in vars_in(e)}
    if any(kind.get(k) == DATA_PAR for k in shared):
        return None, DEPTHWISE
    w_keys = plain(w_load.indices)
    if w_keys is None:
        return not_conv
    f = [k for k in w_keys if kind[k] == DATA_PAR]
    if len(f) != 1 or len(w_keys) != 4 or len(set(w_keys)) != 4:
        return not_conv
    f = f[0]
    roles = {"f": f}
    in_dim, spatial = {}, []
    for d, e in enumerate(x_load.indices):
        vs = {var_key(v): v for v in vars_in(e) if var_key(v) in pos}
        coeffs = sym.detect_linear_equation(e, list(vs.values()))
        if len(coeffs) != len(vs) + 1:
            return None, f"its input index {e} is not affine"
        red = [k for k in vs if kind[k] == REDUCE]
        par = [k for k in vs if kind[k] == DATA_PAR]
        if len(vs) == 1 and par and int(coeffs[0]) == 1 and int(coeffs[1]) == 0 and "n" not in in_dim:
            in_dim["n"], roles["n"] = d, par[0]
        elif len(vs) == 1 and red and int(coeffs[0]) == 1 and int(coeffs[1]) == 0 and "c" not in in_dim:
            in_dim["c"], roles["c"] = d, red[0]
        elif len(red) == 1 and len(par) == 1:
            coef = dict(zip(vs, (int(c) for c in coeffs)))
            spatial.append((d, par[0], red[0], (coef[par[0]], coef[red[0]], int(coeffs[-1]))))
        else:
            return not_conv
    if len(spatial) != 2 or set(in_dim) != {"n", "c"}:
        return not_conv
    (dy, y, ry, taps_y), (dx, x, rx, taps_x) = spatial
    in_dim.update(y=dy, x=dx)
    roles.update(y=y, x=x, ry=ry, rx=rx)
    if len(set(roles.values())) != 7 or set(w_keys) != {f, roles["c"], ry, rx} or \
            set(out) != {roles[r] for r in ("n", "y", "x", "f")}:
        return not_conv
    by_key = {k: r for r, k in roles.items()}
    ext = {}
    for r, k in roles.items():
        e = iters[pos[k]].dom.extent
        if not isinstance(e, tirx.IntImm):
            return None, f"dynamic shape: {e} is not a constant"
        ext[r] = int(e.value)
    return Conv(block.name_hint, x_load.source, w_load.source,
                {r: pos[k] for r, k in roles.items()}, ext, in_dim,
                {by_key[k]: d for d, k in enumerate(w_keys)},
                {by_key[k]: d for d, k in enumerate(out)}, {"y": taps_y, "x": taps_x}), None


def direct_gather(conv: Conv, config: Config) -> bool:
    """Whether the INP tiles are gathered by LOADs straight from the input: for 1x1 kernels
    (K is the channels either way) and when padding the channels to a whole tile costs at
    most an eighth of the work; else the CPU builds the im2col matrix.

    >>> direct_gather(conv_with_64_channels, accel.Config())   # doctest: +SKIP
    True
    """
    t = config.tile
    c = conv.ext["c"]
    return conv.ext["ry"] * conv.ext["rx"] == 1 or (-(-c // t) * t - c) * 8 <= c


def has_image(conv: Conv) -> bool:
    """Whether M can run over ``conv``'s image rather than one output row: only with more
    than one output row and column. An image of one row is that row; one of a single
    column (or pixel) stays by rows, since TVM drops the unit dimension from the im2col
    index and the fused pixels then read the wrong input (on the PaddleOCR classifier's 1x1
    outputs the tuner's image candidates computed wrong results).

    >>> has_image(Conv("c", None, None, {}, {"y": 20, "x": 20}, {}, {}, {}, {}))
    True
    >>> has_image(Conv("c", None, None, {}, {"y": 1, "x": 1}, {}, {}, {}, {}))
    False
    """
    return conv.ext["y"] > 1 and conv.ext["x"] > 1


def image_pays(conv: Conv, config: Config) -> bool:
    """Whether M over each image's output pixels (rows fused) pads fewer of them to whole
    tiles than M over each output row: an output row short of a tile (20 pixels padded to
    32) pads every row, the image (400 pixels, 25 tiles) only its end.

    >>> ext = {"y": 20, "x": 20}
    >>> image_pays(Conv("c", None, None, {}, ext, {}, {}, {}, {}), Config())
    True
    >>> image_pays(Conv("c", None, None, {}, {"y": 8, "x": 32}, {}, {}, {}, {}), Config())
    False
    """
    t, h, w = config.tile, conv.ext["y"], conv.ext["x"]
    return has_image(conv) and -(-h * w // t) < h * -(-w // t)


def _image_heuristic(sch, blk, conv: Conv, config: Config, gather: str | None) -> bool:
    """The heuristic's pixels: the image's (:func:`image_pays`) where its im2col gather
    costs the CPU no more than the direct gather does (a 1x1 kernel on an NCHW input, which
    the direct gather transposes anyway; channels too few for the direct gather) and the
    result can be laid out by pixels (:func:`_pixels_as_rows`); else a row's."""
    taps = conv.ext["ry"] * conv.ext["rx"]
    if gather == "direct" or not image_pays(conv, config) or taps * conv.ext["c"] == 1:
        return False        # (a K of one element: TVM drops its unit reduction from the im2col GEMM)
    cheap = not direct_gather(conv, config) or \
        (taps == 1 and not conv.channels_last_input)
    return (cheap and not conv.channels_last_output
            and not _wide_epilogue_operand(sch, blk, _epilogue_blocks(sch, blk)))


def _wide_epilogue_operand(sch, blk, chain: list) -> bool:
    """Whether the epilogue ``chain`` of the conv block ``blk`` (:func:`_epilogue_blocks`)
    reads an operand that varies along more than one dimension (a residual, in the result's
    own layout): staged in ACC, it is read where the result's rows are, which pixels as rows
    leave to the row loops."""
    made = {sch.get(b).writes[0].source.__chandle__() for b in [blk] + chain}
    for b in chain:
        for r in sch.get(b).reads:
            if r.source.__chandle__() not in made and sum(1 for d in r.source.shape if int(d) > 1) > 1:
                return True
    return False


def _blank_pixels(conv: Conv, image: dict) -> bool:
    """Whether an output pixel sees only the zero border: its input tile would be all padding
    for TVM to fold to a constant, which no LOAD can express (``image`` maps ``y``/``x`` to
    ``(border before, image size)`` in the padded input's coordinates)."""
    for dim, r in (("y", "ry"), ("x", "rx")):
        stride, dilation, offset = conv.taps[dim]
        before, size = image[dim]
        for o in range(conv.ext[dim]):
            if all(not before <= o * stride + t * dilation + offset < before + size for t in range(conv.ext[r])):
                return True
    return False


def _border(sch, producer, conv: Conv) -> dict | None:
    """``(border before, image size)`` per spatial dim of a zero-padding block that reads the
    image at ``index - border``; None if it is not such a block."""
    block = sch.get(producer)
    load = block.body.value
    while not isinstance(load, ir.TensorLoad):
        if not (isinstance(load, ir.Call) and load.op.name.endswith("if_then_else")):
            return None
        load = load.args[1]
    out = {}
    for dim in ("y", "x"):
        e = load.indices[conv.in_dim[dim]]
        vs = vars_in(e)
        coeffs = sym.detect_linear_equation(e, vs)
        if len(vs) != 1 or len(coeffs) != 2 or int(coeffs[0]) != 1:
            return None
        out[dim] = (-int(coeffs[1]), int(load.source.shape[conv.in_dim[dim]]))
    return out


def _loads_can_pad(sch, producer, conv: Conv) -> bool:
    """Whether the input's producer (a copy, or a zero padding) can fold into the LOADs."""
    if _is_plain_copy(sch.get(producer)):
        return True
    border = _border(sch, producer, conv)
    return border is not None and not _blank_pixels(conv, border)


def permute(dims: dict[str, int], order: tuple[str, ...]) -> Callable:
    """An index map ``*axes -> axes`` in the order of the roles in ``order`` (``dims``: each
    role's position among the axes).

    >>> permute({"n": 0, "c": 1, "y": 2, "x": 3}, ("n", "y", "x", "c"))("N", "C", "Y", "X")
    ('N', 'Y', 'X', 'C')
    """
    return lambda *ax: tuple(ax[dims[r]] for r in order)


def _producer(sch, block_rv, buffer):
    for p in sch.get_producers(block_rv):
        if any(w.source.same_as(buffer) for w in sch.get(p).writes):
            return p
    return None


def _is_plain_copy(block) -> bool:
    return isinstance(block.body, tirx.BufferStore) and isinstance(block.body.value, ir.TensorLoad)


def normalise(sch: s_tir.Schedule, conv: Conv, config: Config, notes, gather: str | None = None,
              fuse_rows: bool | None = False) -> GemmAnalysis:
    """Rewrite the conv block of ``sch`` into batched-GEMM form (see the module docstring);
    CPU steps go to ``notes.on_cpu``. ``gather`` is ``"direct"``, ``"im2col"`` or None
    (:func:`direct_gather` decides). ``fuse_rows``: M is the output pixels of an image, rows
    and columns fused (``y*W + x``), instead of one row's (the CPU's im2col only); None: the
    heuristic's (:func:`image_pays`, with the im2col gather it needs). Returns the GEMM the
    scheduler tiles, with the convolution's extras set (see :class:`GemmAnalysis`).

    >>> gemm = normalise(sch, conv, accel.Config(), notes, gather="im2col")     # doctest: +SKIP
    """
    blk = sch.get_sblock(conv.block)
    by_image = fuse_rows is None and _image_heuristic(sch, blk, conv, config, gather)
    if by_image:
        fuse_rows, gather = True, "im2col"
    direct = direct_gather(conv, config) if gather is None else gather == "direct"
    inline, source = gather_input(sch, blk, conv, direct, notes)
    w_buffer = _weights(sch, blk, conv, direct, notes)
    # the image needs the CPU's im2col and an image of more than one row and column (a
    # knob asking for it otherwise gets a row's, as the heuristic would)
    fuse_rows = bool(fuse_rows) and not direct and has_image(conv)
    # the epilogue, found while it reads the conv's result pointwise (output_channels_last
    # lays the result out as pixels as rows: its blocks no longer do)
    chain = _epilogue_blocks(sch, blk) if fuse_rows else []
    stop = output_channels_last(sch, blk, conv, notes, _pixel_map(conv) if fuse_rows else None)

    # The im2col operand: a view of the input for the direct gather, a CPU buffer otherwise.
    keys = [var_key(iv.var) for iv in sch.get(blk).iter_vars]
    role_of = {keys[conv.pos[r]]: r for r in conv.pos}
    re_block = sch.reindex(blk, ("read", input_read(sch, blk, w_buffer)))
    re_name = sch.get(re_block).name_hint
    re_buffer = sch.get(re_block).writes[0].source
    re_read = sch.get(blk).reads[read_index(sch, blk, re_buffer)]
    # TVM drops an extent-1 iter from an index like y*s + ry, so the reindexed buffer may lack
    # a dimension; M must be one it has (the batch index is never dropped)
    dims = {role_of[var_key(r.min)]: n for n, r in enumerate(re_read.region)}
    m_role = next(r for r in ("x", "y", "n") if r in dims)
    rows = [r for r in ("n", "y", "x") if r != m_role] + [m_role]
    contiguous = False
    if fuse_rows:
        contiguous = _pixels_as_rows(sch, blk, conv, stop, chain)
        rows, m_role = ["n", "m"], "m"
    if direct:
        inline.append(re_name)
        note = f"im2col gather by strided, padded LOADs from {source}"
    else:
        _fuse_k(sch, blk, re_block, conv, dims, rows)
        for name in inline:        # the input's padding folds into the im2col gather
            sch.compute_inline(sch.get_sblock(name))
        inline = []
        c_ = conv.ext["c"]
        waste = -(-c_ // config.tile) * config.tile - c_
        rows_pad = -(-conv.ext["x"] // config.tile) * config.tile - conv.ext["x"]
        why = (f"M runs over the image's pixels: each output row of {conv.ext['x']} pixels would pad its tiles "
               f"with {rows_pad} rows" if by_image else "the accel.gather knob chose it" if gather is not None else
               f"gathering {c_} input channels per kernel tap by LOAD would pad each INP row with {waste} zeros")
        notes.on_cpu.append((re_name, f"builds the im2col matrix on the CPU: {why}"))
        note = f"im2col on the CPU ({re_name})"

    block = sch.get(blk)
    keys = [var_key(iv.var) for iv in block.iter_vars]
    ext = {k: int(iv.dom.extent.value) for k, iv in zip(keys, block.iter_vars)}
    if direct:
        at = {r: keys[conv.pos[r]] for r in conv.pos}
        k, k_outer = at["c"], [at["ry"], at["rx"]]
    else:
        at = dict(zip(rows + ["f", "k"], keys))
        k, k_outer = at["k"], []
    return GemmAnalysis(
        out=block.writes[0].source, inp=re_buffer, weight=w_buffer, m=at[m_role], n=at["f"], k=k,
        extents=ext, order=tuple(keys), batch=tuple(at[r] for r in rows[:-1]), k_outer=tuple(k_outer),
        inline=tuple(inline), stop=stop, gather=note, method="direct" if direct else "im2col",
        pixels="image" if fuse_rows else "row", row_width=conv.ext["x"] if fuse_rows and not contiguous else None,
        operand_layout=None if conv.channels_last_output else permute(conv.out_dim, ("n", "y", "x", "f")))


def gather_input(sch: s_tir.Schedule, blk: SBlockRV, conv: Conv, direct: bool, notes) -> tuple[list, str]:
    """Make the conv read its input channels-last; returns the producer blocks to inline into
    the gather and the name of what the LOADs read."""
    producer = _producer(sch, blk, conv.input)
    cl = ("n", "y", "x", "c")
    if producer is not None and (not direct or (conv.channels_last_input and _loads_can_pad(sch, producer, conv))):
        # the gather (LOADs, or the CPU's im2col) reads the input itself, padding included
        return [sch.get(producer).name_hint], sch.get(producer).reads[0].source.name
    if producer is not None:
        what = "zero-pads the input" if not _is_plain_copy(sch.get(producer)) else "copies the input"
        if not conv.channels_last_input:
            sch.transform_layout(producer, ("write", 0), permute(conv.in_dim, cl))
            what += " and transposes it to channels-last on the CPU (a LOAD row is a run of channels)"
        else:
            what += (" on the CPU (some output pixels see only the border: their INP tiles would be "
                     "constants, not LOADs)")
        notes.on_cpu.append((sch.get(producer).name_hint, what))
        return [], sch.get(producer).name_hint
    if direct and not conv.channels_last_input:
        stage = sch.cache_read(blk, read_index(sch, blk, conv.input), "global")
        sch.transform_layout(stage, ("write", 0), permute(conv.in_dim, cl))
        notes.on_cpu.append((sch.get(stage).name_hint, "transposes the input to channels-last on the "
                             "CPU (a LOAD row is a run of channels)"))
        return [], sch.get(stage).name_hint
    return [], conv.input.name


def _weights(sch, blk, conv: Conv, direct: bool, notes) -> ir.Var:
    """Reorder the weights on the CPU into rows along K; returns the reordered buffer."""
    c_, s_, d = conv.ext["c"], conv.ext["rx"], conv.w_dim
    stage = sch.cache_read(blk, read_index(sch, blk, conv.weight), "global")
    if direct:
        sch.transform_layout(stage, ("write", 0), permute(d, ("ry", "rx", "f", "c")))
        layout = "[KH, KW, F, C]"
    else:
        sch.transform_layout(stage, ("write", 0), lambda *ax: (
            ax[d["f"]], (ax[d["ry"]] * s_ + ax[d["rx"]]) * c_ + ax[d["c"]]))
        layout = "[F, KH*KW*C]"
    mark_layout_stage(sch, stage)
    notes.on_cpu.append((sch.get(stage).name_hint, f"reorders the weights to {layout} on the CPU "
                         "(the GEMM reads weight rows along K)"))
    return sch.get(stage).writes[0].source


def output_channels_last(sch: s_tir.Schedule, blk: SBlockRV, conv: Conv, notes,
                         then: Callable | None = None) -> str | None:
    """Make the conv (and its epilogue) write channels-last; an NCHW result gets a CPU
    transpose at the end, whose block name is returned (the epilogue chain stops there).
    ``then``: a map of the channels-last result applied after it (:func:`_pixel_map`) to the
    conv's result and the forking epilogue's when it has one, in the same
    ``transform_layout`` call (each call re-infers the access regions of every block: the
    forking epilogues of a model's convs make hundreds). Returns None when the output is
    channels-last already (nothing done, ``then`` neither).

    >>> stop = output_channels_last(sch, blk, conv, notes)      # doctest: +SKIP
    """
    if conv.channels_last_output:
        return None
    to_nhwc = permute(conv.out_dim, ("n", "y", "x", "f"))
    later = to_nhwc if then is None else lambda *ax: then(*to_nhwc(*ax))
    index_map = tirx.IndexMap.from_func(to_nhwc, ndim=4, index_dtype="int32")
    blocks = _epilogue_blocks(sch, blk)
    final = blocks[-1] if blocks else blk
    back = sch.cache_write(final, 0, "global")
    for b in blocks[:-1]:       # the blocks of an epilogue that forks: channels-last too
        sch.transform_layout(b, ("write", 0), later)
        sch.transform_block_layout(b, index_map)
    if blocks:
        sch.transform_layout(final, ("write", 0), to_nhwc)
        sch.transform_layout(blk, ("write", 0), later)
        sch.transform_block_layout(final, index_map)
    else:
        sch.transform_layout(blk, ("write", 0), to_nhwc)
    notes.on_cpu.append((sch.get(back).name_hint, "transposes the result from channels-last to NCHW on "
                         "the CPU (a STORE row is a run of channels)"))
    return sch.get(back).name_hint


def _fuse_k(sch, blk, re_block, conv: Conv, dims: dict, rows: list) -> None:
    """Lay the im2col buffer out as ``[rows.., K]`` and the conv block as ``(rows.., f, K)``
    with ``K = (ry*KW + rx)*C + c`` (the order of the reordered weights); a row ``m`` is
    the pixel ``y*W + x``."""
    c_, s_, w_, p = conv.ext["c"], conv.ext["rx"], conv.ext["x"], conv.pos
    fused = lambda get: (get("ry") * s_ + get("rx")) * c_ + get("c")  # noqa: E731
    pixel = lambda get: get("y") * w_ + get("x")  # noqa: E731

    def row(r, get):
        return pixel(get) if r == "m" else get(r)

    def present(r):
        return r in dims or (r == "m" and ("y" in dims or "x" in dims))

    def buffer_map(*ax):
        get = lambda r: ax[dims[r]] if r in dims else 0  # noqa: E731
        return tuple(row(r, get) for r in rows if present(r)) + (fused(get),)

    sch.transform_layout(re_block, ("write", 0), buffer_map)
    sch.transform_block_layout(blk, tirx.IndexMap.from_func(
        lambda *it: tuple(row(r, lambda q: it[p[q]]) for r in rows + ["f"]) + (fused(lambda r: it[p[r]]),),
        ndim=7, index_dtype="int32"))


def _pixels_as_rows(sch, blk, conv: Conv, stop: str | None, blocks: list) -> bool:
    """Lay the conv's result out as ``[n, y*W + x, f]`` (it is channels-last by now) and
    make the last block of its epilogue (a copy back when there is none) iterate over
    ``(n, y*W + x, f)``, writing the channels-last output at ``[n, m // W, m % W, f]``: the
    same bytes, so its STOREs write the output directly, a row of the image at a time. When
    that output is an intermediate the CPU transposes to NCHW (``stop``) and the epilogue
    reads no residual, it is laid out ``[n, y*W + x, f]`` too: a block of pixels is then one
    run of it, whatever the width. ``blocks``: the epilogue (:func:`_epilogue_blocks`, up
    to ``stop``). Returns whether it is."""
    contiguous = stop is not None and not _wide_epilogue_operand(sch, blk, blocks)
    final = blocks[-1] if blocks else sch.cache_write(blk, 0, "global")
    pixel = _pixel_map(conv)
    rows = tirx.IndexMap.from_func(pixel, ndim=4, index_dtype="int32")
    # an NCHW result with an epilogue is laid out so already (output_channels_last's ``then``)
    done = stop is not None and bool(blocks)
    for b in blocks[:-1]:       # the blocks of an epilogue that forks: pixels as rows too
        if not done:
            sch.transform_layout(b, ("write", 0), pixel)
        sch.transform_block_layout(b, rows)
    if not done:
        sch.transform_layout(blk, ("write", 0), pixel)
    if contiguous:
        sch.transform_layout(final, ("write", 0), pixel)
    sch.transform_block_layout(final, rows)
    return contiguous


def _pixel_map(conv: Conv) -> Callable:
    """The map of the conv's channels-last result to pixels as rows, ``[n, y*W + x, f]``."""
    w_ = conv.ext["x"]
    return lambda n, y, x, f: (n, y * w_ + x, f)


def _epilogue_blocks(sch, blk, stop: str | None = None) -> list:
    """The blocks of the conv's epilogue (:func:`~accel.compiler.blocks.pointwise_dag`),
    producers first, left as Relax made them: each is laid out as the conv's result is.
    Inlined here, the chain would be one expression on the CPU wherever the ALU then declines
    it, and LLVM, its int32 arithmetic being "no signed wrap", would fold it as if nothing
    wrapped (``min(max(x, 0) * 231919, 146733)`` to ``x > 0 ? 146733 : 0``); the scheduler
    inlines it only for the ALU (:mod:`accel.compiler.wrapping`)."""
    return list(pointwise_dag(sch, blk, stop))


def input_read(sch: s_tir.Schedule, blk: SBlockRV, weight: ir.Var) -> int:
    """The read of the conv block that is its input: the one that is not ``weight``."""
    for n, r in enumerate(sch.get(blk).reads):
        if not r.source.same_as(weight):
            return n
    raise ValueError(f"{sch.get(blk).name_hint} reads no input")
