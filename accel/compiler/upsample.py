"""Upsampling on accel by DMA: a nearest resize by integer factors and a pixel shuffle (the
second half of a ConvTranspose as integerize writes it), int8 tensors moved, not computed.

Both give every output element one input element's value, in a pattern STORE's element
stride (``dram_step``, accel/ISA.md section 4) writes directly. Seen from the output laid out
as ``[P, Y, sy, X, sx]`` (``P`` the leading dimensions, the last two ``Y*sy`` and ``X*sx``),
output ``[p, y, a, x, b]`` reads input ``base[p, a, b] + y*gy + x``: a row of ``X``
consecutive input elements goes to output row ``(p*Y + y)*sy + a``, columns ``b, b + sx,
...``. A nearest resize by ``(sy, sx)`` reads one input row for all ``sy*sx`` places
(``base`` does not depend on ``a, b``); :func:`tirpat.model.integerize`'s pixel shuffle of a
ConvTranspose ``[N, C*kh*kw, H, W] -> [N, C, H*kh, W*kw]`` reads one input plane per tap
``(a, b)``. :func:`analyse` finds that form in the index map of a partition (which input element
each output element reads), and :func:`lower` writes, per block of input rows and per distinct
input block:

- a LOAD of the rows into INP (padded to whole tiles), a LOAD of padding alone that zeroes an
  ACC block, and a DWMAC by a weight row of ones that widens them into ACC (LOAD into ACC
  takes int32 host data only; the element-wise core widens the same way);
- one STORE ``WRAP`` per output place ``(a, b)`` of that block: ``dram_ld = sy * X * sx``
  (``sy`` output rows per input row), ``dram_step = sx``.

Rows of consecutive leading indices are one block of rows where the input and output strides
agree (a resize of ``[N, C, H, W]``: all ``N*C*H`` rows); otherwise (a pixel shuffle's planes)
the leading index is a loop.

A concat of int8 tensors whose inputs each fill one run of the output (a concat of NCHW
tensors along C, batch 1) is the same copy without the element stride, one per input into
its slice (:func:`concat_forms`).

The patterns (``accel.upsample``): an int8 ``image.resize2d`` (NCHW, nearest, integer factors,
a coordinate mode and rounding that pick ``y // s``), and an int8 ``reshape -> permute_dims ->
reshape`` whose index map has that form (checked by running the three on the indices). At
schedule time the partition's own index map is read off its compiled TIR (run on the input's
indices, seven bits at a time) and checked again; whatever does not fit stays on the CPU with
the reason.

>>> import numpy as np
>>> index = np.arange(2 * 3 * 4).reshape(2, 3, 4).repeat(2, axis=1).repeat(2, axis=2)
>>> m = analyse(index.reshape(-1), (2, 3, 4), (2, 6, 8))
>>> (m.sy, m.sx, m.rows, m.groups)
(2, 2, 6, ((0, ((0, 0), (0, 1), (1, 0), (1, 1))),))
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import is_op, wildcard

import tirpat as tp
from accel.compiler.prelowered import calls_rule
from accel.hw.config import Config
from accel.hw.instructions import ACC, DWMAC, INP, LOAD, STORE, WGT, Mem, StoreMode
from tirpat.model.integerize.rules import conv_transpose_declines
from tirpat.model.shapes import static_shape

__all__ = ["patterns", "check", "Upsample", "analyse", "index_map", "lower", "schedule_partition", "rule",
           "resize_declines", "check_conv_transpose", "check_concat", "concat_forms", "moves_int8", "describe", "Declined",
           "PATTERN_NAME", "BUFFER_PREFIX"]

#: The partition pattern's name (``tp.explain`` and the report show it), and the rule's.
PATTERN_NAME = "accel.upsample"
#: The names of the scratchpad buffers :func:`lower` allocates start with it: :func:`rule` takes their calls.
BUFFER_PREFIX = "upsample_"
#: Coordinate modes and roundings of a nearest resize by an integer factor ``s`` that read
#: input ``y // s`` for output ``y``: ``floor(y / s)``, or ``round((y + 0.5) / s - 0.5)``,
#: whose fraction ``(a + 0.5) / s - 0.5`` lies strictly within (-0.5, 0.5) (no tie to break).
_EXACT = {("asymmetric", "floor")} | {(mode, rounding) for mode in ("half_pixel", "pytorch_half_pixel")
                                     for rounding in ("round", "round_prefer_floor", "round_prefer_ceil")}


# ----------------------------------------------------------------------------------------
# the index map and its form
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Upsample:
    """The form of an upsampling copy (module doc): output ``[P, Y, sy, X, sx]``; ``rows``
    input rows of ``X`` elements per iteration of ``loops`` (``loop_in``/``loop_out``
    apart in input and output elements; 1 and 0 when the rows cover every leading index),
    input rows ``gy`` apart; ``groups``: per distinct input block, its first element and the
    output places ``(a, b)`` it goes to; ``out_offset``: where its part of the output starts
    (a concat's input: its slice)."""

    sy: int
    sx: int
    x: int
    wo: int
    rows: int
    gy: int
    loops: int
    loop_in: int
    loop_out: int
    groups: tuple
    out_offset: int = 0

    @property
    def stores(self) -> int:
        """STOREs per block of rows (one per output place).

        >>> Upsample(2, 2, 4, 8, 6, 4, 1, 0, 0, ((0, ((0, 0), (0, 1), (1, 0), (1, 1))),)).stores
        4
        """
        return sum(len(places) for _, places in self.groups)


class Declined(ValueError):
    """An index map accel's DMA cannot write as an upsampling copy; the message says why."""


def analyse(index: np.ndarray, in_shape: tuple, out_shape: tuple) -> Upsample:
    """The :class:`Upsample` form of the flat index map ``index`` (output element -> the
    input element it reads) from ``in_shape`` to ``out_shape``; raises :class:`Declined`
    with the reason when it has none (see the module doc's example).

    >>> analyse(np.arange(6)[::-1], (1, 6), (1, 6))
    Traceback (most recent call last):
    ...
    accel.compiler.upsample.Declined: no upsampling (the last two dimensions keep their sizes): ...
    """
    if len(in_shape) < 2 or len(out_shape) < 2:
        raise Declined("a tensor of fewer than two dimensions")
    (hi, wi), (ho, wo) = in_shape[-2:], out_shape[-2:]
    if not (hi and wi and ho % hi == 0 and wo % wi == 0):
        raise Declined(f"output rows {ho} x {wo} are not whole multiples of the input's {hi} x {wi}")
    sy, sx = ho // hi, wo // wi
    if (sy, sx) == (1, 1):
        raise Declined("no upsampling (the last two dimensions keep their sizes): accel's DMA moves elements to "
                       "resize or pixel-shuffle an image")
    p = int(np.prod(out_shape[:-2], dtype=np.int64))
    g = np.asarray(index, np.int64).reshape(p, hi, sy, wi, sx)
    base = g[:, 0, :, 0, :]                                      # [P, sy, sx]
    gy = int(g[0, 1, 0, 0, 0] - g[0, 0, 0, 0, 0]) if hi > 1 else wi
    want = base[:, None, :, None, :] + (np.arange(hi) * gy)[None, :, None, None, None] + \
        np.arange(wi)[None, None, None, :, None]
    if not np.array_equal(g, want):
        raise Declined("an output row does not read consecutive input elements, or input rows a fixed distance "
                       "apart (not a nearest upsampling or a pixel shuffle)")
    if gy < wi and hi > 1:
        raise Declined(f"input rows {gy} apart overlap their {wi} elements")
    # the distinct input blocks of each leading index, in the same order for all of them
    first = base[0].reshape(-1)
    blocks = list(dict.fromkeys(first.tolist()))
    places = [tuple((int(a), int(b)) for a, b in zip(*np.nonzero(base[0] == start))) for start in blocks]
    steps = base - base[:1]                                      # [P, sy, sx]: affine in p?
    loop_in = int(steps[1, 0, 0]) if p > 1 else 0
    if not np.array_equal(steps, (np.arange(p) * loop_in)[:, None, None] * np.ones_like(base[:1])):
        raise Declined("the leading dimensions are not read a fixed distance apart")
    if loop_in == hi * gy:          # consecutive leading indices continue the rows: one run of rows
        return Upsample(sy, sx, wi, wo, p * hi, gy, 1, 0, 0, tuple(zip(blocks, places)))
    return Upsample(sy, sx, wi, wo, hi, gy, p, loop_in, ho * wo, tuple(zip(blocks, places)))


def index_map(func: tirx.PrimFunc) -> tuple[np.ndarray, np.ndarray, list, tuple]:
    """``(source, index, in_shapes, out_shape)`` of a PrimFunc that moves the elements of its
    int8 buffer parameters (the inputs) into its last one: for each output element, which input
    it reads and which element of it. Found by compiling it for the CPU and running it on each
    input's indices, seven bits per run (digits 0..126), the other inputs all 127 (so an output
    element reads input ``i`` iff its first run is not 127), then checked on random values.
    Raises :class:`Declined` for anything else.

    >>> from tvm.script import tirx as T
    >>> @T.prim_func(s_tir=True)
    ... def twice(x: T.Buffer((3,), "int8"), y: T.Buffer((6,), "int8")):
    ...     for i in range(6):
    ...         with T.sblock("y"):
    ...             v = T.axis.spatial(6, i)
    ...             y[v] = x[v // 2]
    >>> source, index, in_shapes, out_shape = index_map(twice)
    >>> index.tolist(), in_shapes, out_shape
    ([0, 0, 1, 1, 2, 2], [(3,)], (6,))
    """
    buffers = [p for p in func.params if tirx.is_buffer_var(p)]
    if len(buffers) < 2 or any(str(b.dtype) != "int8" for b in buffers):
        raise Declined("not a move of int8 tensors into one")
    shapes = [tuple(int(d) for d in b.shape) for b in buffers]
    in_shapes, out_shape = shapes[:-1], shapes[-1]
    sizes = [int(np.prod(sh, dtype=np.int64)) for sh in in_shapes]
    run = _compiled(func)
    out_size = int(np.prod(out_shape, dtype=np.int64))
    source, index = np.full(out_size, -1, np.int64), np.zeros(out_size, np.int64)
    for i, n in enumerate(sizes):
        digits = 1
        while 127 ** digits < n:
            digits += 1
        mine, total = None, np.zeros(out_size, np.int64)
        for d in range(digits):
            part = ((np.arange(n) // 127 ** d) % 127).astype(np.int8)
            got = run([part if j == i else np.full(m, 127, np.int8) for j, m in enumerate(sizes)]).astype(np.int64)
            mine = got != 127 if mine is None else mine
            total += got * 127 ** d
        if (source[mine] >= 0).any():
            raise Declined("an output element reads two inputs")
        source[mine], index[mine] = i, total[mine]
    if (source < 0).any():
        raise Declined("an output element reads no input")
    values = [np.random.default_rng(k).integers(-128, 128, n).astype(np.int8) for k, n in enumerate(sizes)]
    want = np.empty(out_size, np.int8)
    for i, v in enumerate(values):
        at = source == i
        if (index[at] >= sizes[i]).any():
            raise Declined("the partition does not move int8 values unchanged")
        want[at] = v[index[at]]
    if not np.array_equal(run(values), want):
        raise Declined("the partition does not move int8 values unchanged")
    return source, index, in_shapes, out_shape


def _compiled(func: tirx.PrimFunc):
    """``[inputs] -> func(*inputs)`` on the CPU (flat int8 arrays in, the flat output out)."""
    main = tvm.compile(ir.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")["main"]
    shapes = [[int(d) for d in p.shape] for p in func.params if tirx.is_buffer_var(p)]

    def run(inputs: list) -> np.ndarray:
        out = tvm.runtime.tensor(np.zeros(shapes[-1], np.int8))
        main(*[tvm.runtime.tensor(x.reshape(sh)) for x, sh in zip(inputs, shapes)], out)
        return out.numpy().reshape(-1)

    return run


def concat_forms(source: np.ndarray, index: np.ndarray, in_shapes: list) -> list:
    """One :class:`Upsample` per input of a concat: its elements, in order, one run of the
    output (its slice), copied as rows of its last dimension. Raises :class:`Declined` when an
    input's part of the output is not one run (a concat along an axis after others of size > 1).

    >>> source, index = np.repeat([0, 1], [6, 4]), np.r_[np.arange(6), np.arange(4)]
    >>> [(m.rows, m.x, m.out_offset) for m in concat_forms(source, index, [(1, 2, 3), (1, 2, 2)])]
    [(2, 3, 0), (2, 2, 6)]
    """
    forms = []
    for i, shape in enumerate(in_shapes):
        at = np.flatnonzero(source == i)
        n = int(np.prod(shape, dtype=np.int64))
        if at.size != n or (n and (at[-1] - at[0] + 1 != n or not np.array_equal(index[at], np.arange(n)))):
            raise Declined(f"input {i} of the concat is not one run of the output (a concat along an axis after "
                           "others of size > 1): accel copies each input as rows into its slice")
        x = shape[-1] if shape else 1
        forms.append(Upsample(1, 1, x, x, n // x, x, 1, 0, 0, ((0, ((0, 0),)),), int(at[0]) if n else 0))
    return forms


# ----------------------------------------------------------------------------------------
# the Relax patterns
# ----------------------------------------------------------------------------------------
def patterns() -> list:
    """``[(name, pattern, annotations, check)]``: an int8 nearest resize, an int8 reshape ->
    permute_dims -> reshape (a pixel shuffle), an int8 concat (:func:`check_concat`); and a
    ``conv2d_transpose``, declined with the reason (:func:`check_conv_transpose`).

    >>> [name for name, _, _, _ in patterns()]
    ['accel.upsample', 'accel.upsample', 'accel.upsample', 'accel.upsample']
    """
    return list(_patterns())


@functools.lru_cache(maxsize=None)
def _patterns() -> tuple:
    resize = is_op("relax.image.resize2d")(wildcard(), wildcard())
    shuffle = is_op("relax.reshape")(is_op("relax.permute_dims")(is_op("relax.reshape")(wildcard(), wildcard())),
                                     wildcard())
    transposed = is_op("relax.nn.conv2d_transpose")(wildcard(), wildcard())
    concat = is_op("relax.concat")(wildcard())
    return ((PATTERN_NAME, resize, {"core": resize}, check), (PATTERN_NAME, shuffle, {"core": shuffle}, check),
            (PATTERN_NAME, concat, {"core": concat}, check_concat),
            (PATTERN_NAME, transposed, {"core": transposed}, check_conv_transpose))


def check_concat(ctx) -> bool | str:
    """True when accel can copy each input of the matched int8 ``concat`` into its slice of the
    output (each one run of it: the axes before the concat's have size 1); else why not."""
    call = ctx.annotated_expr["core"]
    parts = call.args[0]
    fields = list(parts.fields) if isinstance(parts, relax.Tuple) else None
    if fields is None:
        return "a concat of a tuple computed elsewhere; accel takes one of tensors"
    if any(str(f.ty.dtype) != "int8" for f in fields):
        return f"a concat of {', '.join(sorted({str(f.ty.dtype) for f in fields}))}; accel moves int8 tensors"
    dims = [static_shape(f) for f in fields]
    if None in dims or static_shape(call) is None:
        return "dynamic shapes; accel needs static shapes"
    axis = int(call.attrs.axis) % len(dims[0])
    index = np.concatenate([np.arange(int(np.prod(d))).reshape(d) for d in dims], axis=axis)
    source = np.concatenate([np.full(d, i) for i, d in enumerate(dims)], axis=axis)
    try:
        concat_forms(source.reshape(-1), index.reshape(-1), dims)
    except Declined as why:
        return str(why)
    return False if has_leaking_intermediate_variables(ctx) else True


def check_conv_transpose(ctx) -> str:
    """Why accel does not take a ``conv2d_transpose`` left in the model (always a reason:
    integerize rewrites those accel runs).

    integerize writes a quantised ConvTranspose as a convolution over its stride's phases and a
    pixel shuffle, which accel runs; one left as it is was not made integer: a float model, or
    one integerize declined (the reason is then integerize's)."""
    call = ctx.annotated_expr["core"]
    why = conv_transpose_declines(call)
    dtype = str(call.args[0].ty.dtype)
    return (f"a {dtype} ConvTranspose: accel runs a quantised one as integerize writes it (a convolution, then a "
            "pixel shuffle by DMA)" + (f"; this is {why}, which has no integer form" if why else ""))


def resize_declines(call: relax.Call) -> str | None:
    """None when the ``image.resize2d`` ``call`` is accel's: int8, NCHW, nearest, integer
    factors, each output row and column reading input ``y // s``; else why not.

    >>> x = relax.Var("x", relax.TensorType((1, 2, 4, 4), "int8"))
    >>> def resize(size):
    ...     return relax.BlockBuilder().normalize(relax.op.image.resize2d(
    ...         x, size, method="nearest_neighbor", coordinate_transformation_mode="asymmetric", rounding_method="floor"))
    >>> resize_declines(resize((8, 12)))
    >>> resize_declines(resize((6, 8)))
    'a resize from 4 x 4 to 6 x 8: not whole multiples'
    """
    attrs = call.attrs
    x = call.args[0]
    if str(x.ty.dtype) != "int8":
        return f"a resize of {x.ty.dtype}; accel moves int8 tensors"
    if str(attrs.method) != "nearest_neighbor":
        return f"a {attrs.method} resize; accel copies, it does not interpolate"
    if str(attrs.layout) != "NCHW":
        return f"a resize in layout {attrs.layout}; accel takes NCHW"
    dims, out = static_shape(x), static_shape(call)
    if dims is None or out is None:
        return "dynamic shapes; accel needs static shapes"
    (h, w), (ho, wo) = dims[2:], out[2:]
    if ho % h or wo % w:
        return f"a resize from {h} x {w} to {ho} x {wo}: not whole multiples"
    mode, rounding = str(attrs.coordinate_transformation_mode), str(attrs.rounding_method) or "round"
    if (ho, wo) != (h, w) and (mode, rounding) not in _EXACT:
        return (f"a nearest resize with coordinates {mode} and rounding {rounding}: output y does not read "
                "input y // s")
    return None


def check(ctx) -> bool | str:
    """True when accel can move the matched tensor (its index map has the upsampling form);
    else the reason it cannot (an int8 transpose that is no upsampling: a
    :class:`~tirpat.DataMovement`)."""
    core = ctx.annotated_expr["core"]
    if has_leaking_intermediate_variables(ctx):
        return False
    resize = str(core.op.name) == "relax.image.resize2d"
    if resize:
        why = resize_declines(core)
        if why is not None:
            return why
        dims, out = static_shape(core.args[0]), static_shape(core)
        sy, sx = out[2] // dims[2], out[3] // dims[3]
        index = np.arange(int(np.prod(dims))).reshape(dims).repeat(sy, axis=2).repeat(sx, axis=3)
    else:
        bound = {var.__chandle__(): value for var, value in ctx.matched_bindings.items()}
        permute = bound.get(core.args[0].__chandle__(), core.args[0])
        inner = bound.get(permute.args[0].__chandle__(), permute.args[0])
        source = inner.args[0]
        dims, mid, out = static_shape(source), static_shape(inner), static_shape(core)
        if str(source.ty.dtype) != "int8":
            return f"a reshape and permute_dims of {source.ty.dtype}; accel moves int8 tensors"
        if None in (dims, mid, out):
            return "dynamic shapes; accel needs static shapes"
        axes = None if permute.attrs.axes is None else [int(a) for a in permute.attrs.axes]
        index = np.arange(int(np.prod(dims))).reshape(mid).transpose(axes).reshape(out)
    try:
        analyse(index.reshape(-1), dims, out)
    except Declined as why:
        # a resize says why accel cannot; a transpose that is no upsampling only moves data
        return str(why) if resize else tp.DataMovement(_moved(index, dims, out))
    return True


def _moved(index: np.ndarray, in_shape: tuple, out_shape: tuple) -> str:
    """Why a reshape -> permute_dims -> reshape whose index map ``index`` (output element ->
    input element) is no upsampling stays on the CPU: a channel shuffle (each output plane a
    whole input plane, as ShuffleNet's) or another transpose; data movement either way (no
    shapes in the text: the report lists the operators of one reason together).

    >>> shuffled = np.arange(8).reshape(2, 2, 2).transpose(1, 0, 2).reshape(1, 4, 1, 2)    # 4 channels, 2 groups
    >>> _moved(shuffled, (1, 4, 1, 2), (1, 4, 1, 2)).split(":")[0]
    'a channel shuffle (whole planes reordered)'
    """
    plane = int(np.prod(out_shape[-2:], dtype=np.int64))
    rows = index.reshape(-1, plane)
    dma = ("data movement accel does not run (its DMA resizes, pixel-shuffles and concatenates images): one pass on "
           "the CPU")
    if tuple(in_shape) == tuple(out_shape) and len(out_shape) == 4 and plane and \
            not (rows[:, 0] % plane).any() and np.array_equal(rows, rows[:, :1] + np.arange(plane)):
        return f"a channel shuffle (whole planes reordered): {dma}"
    return f"a transpose that is no upsampling: {dma}"


# ----------------------------------------------------------------------------------------
# the instructions
# ----------------------------------------------------------------------------------------
def _round(n: int, t: int) -> int:
    return -(-n // t) * t


def _block_rows(m: Upsample, config: Config, share: int = 1) -> int:
    """Input rows per block: the most (whole tiles, or all of them) for which every INP and ACC
    block :func:`lower` allocates fits at once in ``1 / share`` of the memories (a concat's
    inputs each get their share), each as the memory's ``footprint`` counts it (the planner's
    rule: doubled inside a loop); those of the last, shorter block too, which is live beside
    the others inside the loop over leading indices. A plan that fits here is one the planner
    places (a partition lowered to calls has no schedule to fall back on)."""
    t = config.tile
    xp = _round(m.x, t)
    options = {"tile": t}

    def fits(rows: int) -> bool:
        whole, rest = divmod(m.rows, rows)
        blocks = [(rows, whole > 1 or m.loops > 1)] + ([(rest, m.loops > 1)] if rest else [])
        for memory, capacity in ((INP, config.inp_elements // share), (ACC, config.acc_elements // share)):
            need = sum(len(m.groups) * memory.footprint(_round(r, t) * xp, repeated=looped, options=options)
                       for r, looped in blocks)
            if need > capacity:
                return False
        return True

    if fits(m.rows):
        return m.rows
    rows = (m.rows // t) * t
    while rows >= t and not fits(rows):
        rows -= t
    if rows < t:
        raise Declined(f"{len(m.groups)} block(s) of {t} rows of {m.x} elements do not fit ACC and INP")
    return rows


class _Emitter:
    """The instructions of one block of rows (module doc)."""

    def __init__(self, m: Upsample, src, out, ones, config: Config, tag: str = "") -> None:
        self.m, self.src, self.out, self.ones, self.t = m, src, out, ones, config.tile
        self.xp, self.tag = _round(m.x, config.tile), tag

    def block(self, loop, row0, rows: int, tag: str) -> list:
        """Allocations and calls for ``rows`` input rows from ``row0`` of loop iteration ``loop``."""
        m, t, xp = self.m, self.t, self.xp
        rp, tag = _round(rows, t), self.tag + tag
        allocs, calls = [], []
        for k, (start, places) in enumerate(m.groups):
            inp = tirx.decl_buffer((rp * xp,), "int8", f"{BUFFER_PREFIX}inp{k}{tag}", scope=INP.scope)
            acc = tirx.decl_buffer((rp * xp,), "int32", f"{BUFFER_PREFIX}acc{k}{tag}", scope=ACC.scope)
            allocs += [tirx.AllocBuffer(inp), tirx.AllocBuffer(acc)]
            calls.append(LOAD[Mem.INP].call(
                host=self.src, elem_offset=start + loop * m.loop_in + row0 * m.gy, sram_addr=inp, sram_ld=xp,
                rows=rows, cols=m.x, dram_ld=m.gy, pad_top=0, pad_bottom=rp - rows, pad_left=0,
                pad_right=xp - m.x, pad_value=0))
            # zeroed by a LOAD of padding alone (issue cycles only), then widened by a DWMAC by ones
            calls.append(LOAD[Mem.ACC].call(
                host=self.src, elem_offset=0, sram_addr=acc, sram_ld=xp, rows=0, cols=0, dram_ld=0, pad_top=rp,
                pad_bottom=0, pad_left=xp, pad_right=0, pad_value=0))
            calls.append(DWMAC.call(
                acc_addr=acc, inp_addr=inp, wgt_addr=self.ones, acc_ld=xp, inp_ld=xp, ext_out=rp // t,
                ext_in=xp // t, acc_stride_out=t * xp, acc_stride_in=t, inp_stride_out=t * xp, inp_stride_in=t,
                wgt_stride_out=0, wgt_stride_in=0))
            for a, b in places:
                calls.append(STORE[StoreMode.WRAP].call(
                    host=self.out, elem_offset=m.out_offset + loop * m.loop_out + (row0 * m.sy + a) * m.wo + b,
                    sram_addr=acc,
                    sram_ld=xp, rows=rows, cols=m.x, dram_ld=m.sy * m.wo, dram_step=m.sx))
        return allocs + calls


def lower(func: tirx.PrimFunc, forms: list, config: Config) -> tirx.PrimFunc:
    """``func`` (a move of its first buffer parameters into its last) with its body replaced by
    accel's instructions for ``forms``, one :class:`Upsample` per input; raises
    :class:`Declined` when a block of rows does not fit."""
    *sources, out = [p for p in func.params if tirx.is_buffer_var(p)]
    t = config.tile
    ones = tirx.decl_buffer((t,), "int8", f"{BUFFER_PREFIX}ones", scope=WGT.scope)
    stmts = [tirx.AllocBuffer(ones),
             LOAD[Mem.WGT].call(host=sources[0], elem_offset=0, sram_addr=ones, sram_ld=t, rows=0, cols=0,
                                dram_ld=0, pad_top=1, pad_bottom=0, pad_left=t, pad_right=0, pad_value=1)]
    for n, (src, m) in enumerate(zip(sources, forms)):
        if m.rows == 0:
            continue
        stmts += _copies(m, _Emitter(m, src, out, ones, config, f"_{n}" if len(forms) > 1 else ""),
                         _block_rows(m, config, len(forms)), n)
    # a block in a root block, as TVM's passes after scheduling expect of a PrimFunc's body
    copy = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "upsample", tirx.SeqStmt(stmts)))
    return func.with_body(s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", copy)))


def _copies(m: Upsample, emitter: _Emitter, rows: int, n: int) -> list:
    """The loops over leading indices and blocks of ``rows`` rows of one input's copy."""
    whole, rest = divmod(m.rows, rows)
    loop = tirx.Var(f"upsample_loop{n}", "int32") if m.loops > 1 else 0
    inner = []
    if whole > 1:
        v = tirx.Var(f"upsample_rows{n}", "int32")
        inner.append(tirx.For(v, tirx.IntImm("int32", 0), tirx.IntImm("int32", whole), tirx.ForKind.SERIAL,
                              tirx.SeqStmt(emitter.block(loop, v * rows, rows, ""))))
    elif whole:
        inner.append(tirx.SeqStmt(emitter.block(loop, 0, rows, "")))
    if rest:
        inner.append(tirx.SeqStmt(emitter.block(loop, whole * rows, rest, "_rest")))
    if m.loops > 1:
        return [tirx.For(loop, tirx.IntImm("int32", 0), tirx.IntImm("int32", m.loops), tirx.ForKind.SERIAL,
                         tirx.SeqStmt(inner) if len(inner) > 1 else inner[0])]
    return inner


def describe(m: Upsample, config: Config) -> str:
    """One line for the report.

    >>> describe(Upsample(2, 2, 40, 80, 3840, 40, 1, 0, 0, ((0, ((0, 0), (0, 1), (1, 0), (1, 1))),)), Config())
    'offloaded upsampling copy: 3840 row(s) of 40 int8 elements in blocks of 320, each to 4 place(s) (factors 2 x 2, STORE dram_step 2)'
    """
    rows = _block_rows(m, config)
    loops = f"{m.loops} x " if m.loops > 1 else ""
    return (f"offloaded upsampling copy: {loops}{m.rows} row(s) of {m.x} int8 elements in blocks of {rows}, each to "
            f"{m.stores // len(m.groups)} place(s) (factors {m.sy} x {m.sx}, STORE dram_step {m.sx})")


def schedule_partition(func: tirx.PrimFunc, config: Config) -> tirx.PrimFunc | None:
    """The upsampling partition ``func`` lowered to accel's instructions with its notes for the
    report, or None when ``func`` is no partition of :func:`patterns`; one accel cannot run
    is returned as it is, its notes saying why (it runs on the CPU)."""
    if not moves_int8(func):
        return None
    notes = {"host_macs": 0, "device_macs": 0, "host_steps": [], "epilogue": [], "details": []}
    try:
        source, index, in_shapes, out_shape = index_map(func)
        if len(in_shapes) == 1:
            forms = [analyse(index, in_shapes[0], out_shape)]
            notes["details"] = [describe(forms[0], config)]
        else:
            forms = concat_forms(source, index, in_shapes)
            notes["details"] = [f"offloaded concat: {len(forms)} int8 inputs each copied as rows into its slice of "
                                f"the output ({sum(m.rows for m in forms)} rows)"]
        lowered = lower(func, forms, config)
        return lowered.with_attr(tp.SCHEDULE_NOTES, json.dumps(notes))
    except Declined as why:
        notes["host_steps"] = [["upsample", f"is not offloaded: {why}"]]
    return func.with_attr(tp.SCHEDULE_NOTES, json.dumps(notes))


#: Dtypes that hold every int8 value exactly: a cast through them moves the value unchanged.
_HOLDS_INT8 = {"int8", "int16", "int32", "int64", "float16", "float32", "float64"}


def moves_int8(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` only moves elements: int8 buffer parameters, no reduction, and every
    value stored is a value loaded (through casts that hold int8 exactly: a resize's
    ``int8 -> float32 -> int8``; or one of several, a concat's ``if_then_else``). Such a
    PrimFunc comes from :func:`patterns` alone among accel's.

    >>> from tvm.script import tirx as T
    >>> @T.prim_func(s_tir=True)
    ... def twice(x: T.Buffer((4,), "int8"), y: T.Buffer((8,), "int8")):
    ...     for i in range(8):
    ...         with T.sblock("y"):
    ...             v = T.axis.spatial(8, i)
    ...             y[v] = x[v // 2]
    >>> moves_int8(twice)
    True
    """
    params = [p for p in func.params if tirx.is_buffer_var(p)]
    if len(params) < 2 or any(str(p.dtype) != "int8" for p in params):
        return False
    found = {"stores": 0, "other": False}

    def loaded(e) -> bool:
        while isinstance(e, tirx.Cast) and str(e.ty.dtype) in _HOLDS_INT8:
            e = e.value
        if isinstance(e, ir.Call) and getattr(e.op, "name", "") in ("prim.if_then_else", "tirx.if_then_else"):
            return loaded(e.args[1]) and loaded(e.args[2])      # a concat: one input or another
        return isinstance(e, ir.TensorLoad) and str(e.ty.dtype) == "int8"

    def on_block(b) -> None:
        if any(int(iv.iter_type) != 0 for iv in b.iter_vars):
            found["other"] = True

    def on_store(st) -> None:
        found["stores"] += 1
        if not loaded(st.value):
            found["other"] = True

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, on_block), (tirx.BufferStore, on_store)])
    return found["stores"] > 0 and not found["other"]


def rule() -> tp.Rewriter:
    """The rule ``accel.upsample``: the instruction calls :func:`lower` wrote at schedule time
    (on its ``upsample_*`` scratchpad buffers), taken as they are, so that the build report
    counts the partition as accel's.

    >>> rule().rules[0].name
    'accel.upsample'
    """
    return calls_rule(PATTERN_NAME, BUFFER_PREFIX)
