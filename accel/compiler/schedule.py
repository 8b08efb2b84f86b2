"""Scheduling unscheduled workloads for accel with ``s_tir.Schedule``.

For each int8 x int8 -> int32 GEMM block (dense, matmul, batch_matmul as TE/topi write
them; a conv2d is first rewritten into a batched GEMM by :mod:`accel.compiler.conv`; a
depthwise conv2d is laid out by :mod:`accel.compiler.depthwise` and tiled for DWMAC, one
16 x 16 tile of output pixels x channels per instruction, by ``_schedule_depthwise``, in blocks
of the pixels' tiles of the fewest estimated cycles, :func:`dwmac_cycles`) the scheduler:

1. transposes an operand on the CPU when its layout is not the one the DMA can read
   (the GEMM computes ``inp x wgt^T``: A must be ``[M, K]`` and the weight ``[N, K]``);
2. pads M, N and K to multiples of the tile (``pad_einsum``); the padding is folded into
   the copies into the scratchpads, which become padded LOADs;
3. inlines the elementwise epilogue chain (bias, ReLU/clip, requantise, cast) into one
   block and keeps the accumulator in ACC; an epilogue that reads the accumulator twice (a
   small DAG: integerize's precise requantise) keeps one block of each fork as a temporary,
   a second ACC region computed before the epilogue reads it; an epilogue the ALU cannot do
   stays on the CPU;
4. tiles to (16*bm) x (16*bn) x (16*bk) blocks of tiles (``bm``: of the M blocks that keep
   one row of tiles' N and K blocks, the fewest estimated cycles, the largest of equals:
   a block's reset, bias LOAD, epilogue chains and STORE are one instruction each, so a
   larger block runs fewer; :func:`least_cycles`), stages A and the weight through INP and
   WGT at the K loop (a weight that fits in half of WGT is loaded once and stays resident)
   and the accumulator through ACC at the N loop, and moves the zero-init out of the
   reduction (GEMM reset).

Everything that is not offloaded stays as it is and is compiled for the CPU; each decision
is recorded in :class:`Notes` for the build report.

The choices (block sizes, weight residency, the convolution's gather) are heuristics; a
GEMM block annotated with :class:`Knobs` (``sch.annotate(block, "accel.bn", 4)``, what the
tuner's design space does) takes the annotated ones instead.

>>> mod, notes = schedule(te.create_prim_func([A, W, C]), accel.Config())   # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import tvm
import tvm_ffi
from tvm import ir, s_tir, tirx
from tvm.s_tir.schedule import ScheduleError as TVMScheduleError

import tirpat as tp
from accel.compiler.blocks import (DATA_PAR, REDUCE, GemmAnalysis, ScheduleError, mark_layout_stage, pointwise_dag,
                                    read_index)
from accel.hw.config import Config
from accel.compiler import depthwise, elementwise
from accel.compiler.conv import DEPTHWISE
from accel.compiler.conv import analyse as analyse_conv
from accel.compiler.conv import normalise as normalise_conv
from accel.compiler.rules import (ACC, INP, PREFIX_DONE, PREFIX_IN_PLACE, WGT, clipped_to_int8, epilogue_chain,
                                   table_lookup, table_step)
from accel.compiler import wrapping
from accel.hw.instructions import CHAIN_IMMEDIATES, CHAIN_STEPS, LUT_ENTRIES, MEMORIES, SCOPES, AluOp, capacity_option


#: Where the weight of a GEMM lives: reloaded into WGT for every block of K, or loaded once.
WEIGHTS = ("streamed", "resident")
#: How a convolution's im2col operand reaches INP (see :mod:`accel.compiler.conv`).
GATHERS = ("direct", "im2col")
#: What a convolution's M dimension runs over: the pixels of one output row, or of an image.
PIXELS = ("row", "image")
#: The most tiles per block along M, N and K the heuristic considers (M: the block of the
#: fewest estimated cycles, :func:`least_cycles`).
BM_LIMIT, BN_LIMIT, BK_LIMIT = 32, 8, 32
#: How the steps the branches of a forking epilogue share (a bias and clip before a precise
#: requantise reads the accumulator twice) run: on each branch (``"each"``: the temporary
#: copies the accumulator and applies them too), or once, in place on the accumulator, before
#: the temporary copies it (``"once"``, the heuristic's: the same operations on the same
#: values, fewer ALU instructions; ``"each"`` stays a knob to compare with).
FORKS = ("each", "once")


@dataclass(frozen=True)
class Knobs:
    """The scheduler's choices for one GEMM block; a field left None is the heuristic's.

    - ``bm``, ``bn``, ``bk``: tiles per block along M, N and K (at most the whole
      dimension; a block is shrunk while it would overflow a scratchpad). An accumulator
      block is ``bm x bn`` tiles (its epilogue's steps run as ALU chains over it), an
      INP block ``bm x bk``; a GEMM instruction covers two of the three block loops;
    - ``weights``: ``"streamed"`` (a block of weights is loaded into WGT for every block of
      K) or ``"resident"`` (the whole weight is loaded once, if it fits in WGT);
    - ``gather`` (convolutions): ``"direct"`` (strided LOADs from the input) or
      ``"im2col"`` (the CPU builds the im2col matrix);
    - ``pixels`` (convolutions, with ``im2col``): M runs over the pixels of one output
      ``"row"`` (rows are batched) or over a whole ``"image"`` (rows fused: a narrow output
      needs less padding to whole tiles);
    - ``fork`` (an epilogue that reads the accumulator twice): the steps its branches share
      run on ``"each"`` branch or ``"once"`` (:data:`FORKS`; None: ``"once"``).

    Knobs travel as annotations on the GEMM block (``accel.bn`` = 4, ``accel.weights`` =
    index into :data:`WEIGHTS`, ...), so that a meta_schedule design space can set them
    from sampled values and a tuning record replays them.

    >>> Knobs(bn=4, weights="resident").annotations()
    {'accel.bn': 4, 'accel.weights': 1}
    >>> Knobs.from_annotations({'accel.bk': 2, 'accel.gather': 1})
    Knobs(bm=None, bn=None, bk=2, weights=None, gather='im2col', pixels=None, fork=None)
    """

    bm: int | None = None
    bn: int | None = None
    bk: int | None = None
    weights: str | None = None
    gather: str | None = None
    pixels: str | None = None
    fork: str | None = None

    _CHOICES = {"weights": WEIGHTS, "gather": GATHERS, "pixels": PIXELS, "fork": FORKS}

    def __post_init__(self) -> None:
        for name in ("bm", "bn", "bk"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"Knobs.{name} must be a positive int or None, got {value!r}")
        for name, choices in self._CHOICES.items():
            value = getattr(self, name)
            if value is not None and value not in choices:
                raise ValueError(f"Knobs.{name} must be one of {choices} or None, got {value!r}")

    def annotations(self) -> dict:
        """The block annotations that carry these knobs (set fields only)."""
        out = {}
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[ANNOTATION + name] = self._CHOICES[name].index(value) if name in self._CHOICES else value
        return out

    @classmethod
    def from_annotations(cls, annotations) -> "Knobs":
        """The knobs a GEMM block's annotations set (others None)."""
        fields = {}
        for name in _FIELDS:
            value = annotations.get(ANNOTATION + name)
            if value is None:
                continue
            value = int(value)
            if name in cls._CHOICES:
                choices = cls._CHOICES[name]
                if not 0 <= value < len(choices):
                    raise ScheduleError(f"annotation {ANNOTATION + name} = {value} is not an index into {choices}")
                value = choices[value]
            fields[name] = value
        return cls(**fields)

    def annotate(self, sch: s_tir.Schedule, block_rv) -> None:
        """Annotate ``block_rv`` of ``sch`` with these knobs."""
        for key, value in self.annotations().items():
            sch.annotate(block_rv, key, value)


#: Prefix of the knob annotations on a GEMM block.
ANNOTATION = "accel."
_FIELDS = ("bm", "bn", "bk", "weights", "gather", "pixels", "fork")


@dataclass
class GemmPlan:
    """One offloaded GEMM block: its name, sizes and what was done to it."""

    block: str
    m: int
    n: int
    k: int
    batch: int
    epilogue: list = field(default_factory=list)    # what the ALU epilogue does, in words
    gather: str = ""        # how a convolution's im2col operand reaches INP
    device_macs: int = 0    # the MACs the GEMM unit executes: M, N and K padded to whole tiles
    knobs: Knobs = field(default_factory=Knobs)     # the choices made, every field set
    cycles: int = 0         # an estimate of its device cycles (:func:`estimate_cycles`)
    shared: int = 0         # the steps the branches of its epilogue share (0: it does not fork)
    # its compute-queue cycles (:func:`block_cycles`; a GEMM's with its pipeline's fill and
    # drain, :func:`fill_and_drain`; a depthwise convolution's :func:`dwmac_cycles`) were its
    # blocks ``(bm, bn, bk)`` instead, the same gather and pixels (None where the scheduler
    # would refuse them): what a tuner's candidates are ranked by (:func:`accel.compiler.tuning.ranked`)
    estimate: Callable[[int, int, int], int | None] | None = field(default=None, repr=False, compare=False)

    @property
    def macs(self) -> int:
        return self.batch * self.m * self.n * self.k

    def describe(self) -> str:
        """One line for the report: the block, its sizes, its epilogue and gather.

        >>> GemmPlan("dense", 64, 32, 16, 1, ["bias", "ReLU"]).describe()
        'offloaded dense: 1x64x32x16 + epilogue bias, ReLU'
        """
        epi = f" + epilogue {', '.join(self.epilogue)}" if self.epilogue else ""
        gather = f"; {self.gather}" if self.gather else ""
        return f"offloaded {self.block}: {self.batch}x{self.m}x{self.n}x{self.k}{epi}{gather}"


@dataclass
class Notes:
    """What the scheduler offloaded, and what stayed on the CPU and why."""

    offloaded: list = field(default_factory=list)      # GemmPlan
    on_cpu: list = field(default_factory=list)         # (block name, reason)
    total_macs: int = 0

    @property
    def offloaded_macs(self) -> int:
        return sum(g.macs for g in self.offloaded)

    @property
    def device_macs(self) -> int:
        """The MACs the device executes, padding to whole tiles included."""
        return sum(g.device_macs for g in self.offloaded)

    def to_json(self) -> str:
        """The notes in the form ``tp.SCHEDULE_NOTES`` takes (JSON text)."""
        # the report reads "<function> + <epilogue>": one GEMM's; a workload of several (a CNN
        # written in TE) has no one epilogue, and each GEMM's is in its details line
        epilogue = list(self.offloaded[0].epilogue) if len(self.offloaded) == 1 else []
        return json.dumps({"host_macs": self.total_macs - self.offloaded_macs, "device_macs": self.device_macs,
                           "host_steps": [list(s) for s in self.on_cpu], "epilogue": epilogue,
                           "details": [g.describe() for g in self.offloaded]})


def _const(e) -> int:
    if not isinstance(e, tirx.IntImm):
        raise ScheduleError(f"dynamic shape: {e} is not a constant; accel.build needs static shapes")
    return int(e.value)


_C = tp.is_buffer("C", dtype="int32")
_X = tp.is_buffer("X", dtype="int8")
_Y = tp.is_buffer("Y", dtype="int8")
_C_LOAD = tp.is_load(_C, None)
_X_LOAD, _Y_LOAD = tp.is_load(_X, None), tp.is_load(_Y, None)
_GEMM_BODY = tp.is_store(_C, None, _C_LOAD + _X_LOAD.astype("int32") * _Y_LOAD.astype("int32"))


def _plain_vars(indices, by_key):
    """The block iter vars of ``indices``, or None if an index is not a plain iter var."""
    out = []
    for e in indices:
        if not isinstance(e, tirx.Var) or e.__chandle__() not in by_key:
            return None
        out.append(e.__chandle__())
    return out


_NOT_PLAIN = "its indices are not plain loop variables"


def _analyse_gemm(block, m) -> tuple[GemmAnalysis | None, str | None]:
    """``(the GEMM, None)`` when the matched multiply-accumulate ``block`` is a batched
    matrix product of plain loop variables, else ``(None, why not)``."""
    iters = {iv.var.__chandle__(): iv for iv in block.iter_vars}
    store, a_load, b_load = m[_GEMM_BODY], m[_X_LOAD], m[_Y_LOAD]
    c_idx = _plain_vars(store.indices, iters)
    a_idx, b_idx = _plain_vars(a_load.indices, iters), _plain_vars(b_load.indices, iters)
    if c_idx is None or a_idx is None or b_idx is None:
        return None, _NOT_PLAIN
    reduce = [k for k, iv in iters.items() if int(iv.iter_type) == REDUCE]
    if len(reduce) != 1 or len(c_idx) < 2:
        return None, "it is not a single-reduction matrix product"
    k = reduce[0]
    i, j = c_idx[-2], c_idx[-1]
    batch = c_idx[:-2]
    if set(a_idx) == {*batch, j, k} and set(b_idx) == {*batch, i, k}:
        a_load, b_load, a_idx, b_idx = b_load, a_load, b_idx, a_idx
    if set(a_idx) != {*batch, i, k} or set(b_idx) != {*batch, j, k} or len(a_idx) != len(batch) + 2 \
            or len(b_idx) != len(batch) + 2 or a_idx[:len(batch)] != batch or b_idx[:len(batch)] != batch:
        return None, "its operands are not [batch.., M, K] and [batch.., N, K] matrices in some order"
    return GemmAnalysis(out=store.buffer, inp=a_load.source, weight=b_load.source, m=i, n=j, k=k,
                        extents={key: _const(iv.dom.extent) for key, iv in iters.items()},
                        order=tuple(iv.var.__chandle__() for iv in block.iter_vars), batch=tuple(batch),
                        inp_index=tuple(a_idx), weight_index=tuple(b_idx)), None


def estimate_cycles(macs: int, rate: int, outputs: int, steps, temporaries, config: Config) -> int:
    """An estimate of a GEMM's or depthwise convolution's device cycles, to rank workloads
    by (a tuner's budget): its ``macs`` (padding included) at ``rate`` a cycle, then its
    epilogue's ALU ``steps`` (and a copy and step per temporary) over the ``outputs``
    elements of the padded result, ``alu_lanes`` a cycle (the two share the compute queue).

    >>> estimate_cycles(16 * 16 * 16, 256, 16 * 16, [1, 2], [], Config())
    48
    """
    alu = (len(steps) if steps else 0) + 2 * len(temporaries or ())
    return -(-macs // rate) + -(-outputs * alu // config.alu_lanes)


def block_cycles(e: Extents, bm: int, bn: int, bk: int, alu_runs: Sequence[int], config: Config,
                 staged: tuple = ()) -> int:
    """The compute queue's cycles for a GEMM of extents ``e`` in blocks of ``bm x bn x bk``
    tiles (as the scheduler fitted them), issue overhead included: per block of output tiles,
    ``bm`` GEMMs per block of K (each folds K and N; one where a loop is a single tile), a reset
    of the block, and the epilogue's ALU steps over the whole block, ``alu_runs`` the
    lengths of the ALU chains they make on one block (:func:`_alu_runs`: what
    :mod:`accel.compiler.chains` merges them into; a pass over the block per chain, and a
    cycle per step more for the pipeline). The LOADs and STOREs run beside it, on queues of
    their own, but for the LOADs into ACC of the epilogue's operands (``staged``: per operand,
    whether it is narrow, a bias, or as large as the block, a residual). (A depthwise
    convolution's: :func:`dwmac_cycles`.)

    The padding of N to whole blocks costs every ALU pass (an ALU instruction runs whole
    rows of a tile's lanes), that of M too unless a block holds all of M's ``e.m_rows`` (then a
    GEMM's passes run over those rows alone), and the issue overhead every instruction: what a
    tuner weighs when it picks its likeliest blocks.

    >>> e = Extents(6, 13, 2, outer=2)     # 2 rows of 96 pixels, 200 channels, K 32; a 6-step epilogue
    >>> block_cycles(e, 1, 2, 2, (6,), Config()), block_cycles(e, 6, 1, 2, (6,), Config())
    (8777, 7801)
    >>> block_cycles(Extents(2, 3, 1, m_rows=20), 2, 1, 1, (3, 3, 5), Config(), staged=(True,))     # 20 rows, a bias
    327
    """
    t, ov = config.tile, config.issue_overhead
    m_blocks = -(-e.m_tiles // bm)
    blocks = e.outer * m_blocks * -(-e.n_tiles // bn)
    tiles = bm * bn
    # a GEMM instruction folds two of the block's loops: per block of K, bm instructions of
    # bk x bn tile steps, or one where a loop is a single tile (bn 1: it folds M and K)
    gemms = bm if min(bm, bn, bk) > 1 else 1
    macs = e.k_outer * -(-e.k_tiles // bk) * (bm * bk * bn * config.tile_cycles + gemms * ov)
    # one reset zeroes the block (its tile loops fold into the instruction)
    resets = tiles * t + ov
    # a block of all of M runs its passes over M's rows alone, not over its padding to whole
    # tiles (blocks that split M are padded to split it evenly: every block whole)
    rows = bm * t if e.m_rows is None or m_blocks > 1 else e.m_rows
    passes = [rows * bn * -(-t // config.alu_lanes) + ov + n - 1 for n in alu_runs]     # one per chain
    alu = sum(passes)
    # the epilogue's operands are LOADs into ACC, which the compute queue issues: a bias one
    # row of the block's channels, a residual the whole block
    row = bn * t * _MEMORY[ACC].itemsize
    loads = sum(-(-row * (1 if narrow else bm * t) // config.dma_bytes_per_cycle) + ov for narrow in staged)
    # the GEMM array and the ALU run at once (accel/ISA.md, section 6): the next block's GEMMs
    # (in the other half of the double-buffered ACC) go once the block's last ALU instruction
    # is dispatched, so beside the last ``unit_queue + 1`` of them (one running, the rest waiting)
    tail = sum(passes[-(config.unit_queue + 1):])
    return blocks * (macs + resets + alu + loads) - (blocks - 1) * min(macs + resets, tail)


@dataclass(frozen=True)
class DwmacBlocks:
    """What :func:`dwmac_cycles` needs of a depthwise convolution's blocks besides their tiles:
    ``blocks`` of them in all; per block, ``rows`` the pixels its ALU passes run over and
    ``stores`` its STOREs' DMA cycles; ``tile_loads`` the DMA cycles of one tile's INP LOADs
    (its bands); ``fill`` the LOADs before the first (the weights); ``extra_alu`` the ALU
    cycles a block spends beyond its passes over ``rows`` (a block of whole image rows stored a
    row at a time: an instruction per row and step); issue overhead included in each."""

    blocks: int
    rows: int
    stores: int
    tile_loads: int
    fill: int
    extra_alu: int = 0


def dwmac_cycles(d: DwmacBlocks, bm: int, bn: int, alu_runs: Sequence[int], config: Config, mac_cycles: int,
                 staged: tuple = ()) -> int:
    """The cycles of a depthwise convolution in blocks of ``bm x bn`` tiles (pixels x
    channels; :class:`DwmacBlocks`), ``mac_cycles`` one tile's DWMAC (its taps), ``alu_runs``
    and ``staged`` the epilogue's chains and ACC operands (as for :func:`block_cycles`). Per
    block, the GEMM array runs a reset of the block and a DWMAC per tile, the ALU the
    epilogue's passes over the block, the DMA engine the tiles' input bands, the operands and
    the STOREs; a block takes the longest of three bounds (accel/ISA.md, section 6):

    - the compute queue's order: the next block's DWMACs go once the block's last ALU
      instruction is dispatched, beside the last ``unit_queue + 1`` (:func:`block_cycles`);
    - the INP buffers' tokens: a tile's INP LOAD waits for the DWMAC that read its buffer
      last (``copies`` tiles back) to retire, which is in program order, after the previous
      block's epilogue; so the next block's tile ``copies + 1`` waits for the block's ALU
      passes, then its STOREs (earlier on the DMA engine) and its own LOADs, and its other
      tiles follow;
    - the DMA engine, which LOADs and STOREs share;

    and the first tile's LOADs fill the pipeline (the first reset beside them), the last
    block's epilogue and STOREs drain it. Within a few % of the simulated cycles on the
    PaddleOCR models' depthwise layers (one tile a block: the serial sum of block_cycles was
    up to 3% high, blocks of many tiles 10% low).

    >>> d = DwmacBlocks(blocks=36, rows=32, stores=8, tile_loads=21, fill=15)     # 3 x 3, 12 rows of 96 pixels
    >>> dwmac_cycles(d, 2, 1, (3, 3, 7), Config(), 9 * 16), dwmac_cycles(replace(d, blocks=72, rows=16, stores=6),
    ...                                                                    1, 1, (3, 3, 7), Config(), 9 * 16)
    (12078, 12188)

    (simulated: 12,082 and 12,192 cycles, ppocr_v2_cls's first depthwise layer, 8 channels, a bias).
    """
    t, ov = config.tile, config.issue_overhead
    tiles = bm * bn
    dwmac = mac_cycles + ov
    reset = tiles * t + ov
    gemm = tiles * dwmac + reset
    passes = [d.rows * bn * -(-t // config.alu_lanes) + ov + n - 1 for n in alu_runs]
    alu = sum(passes) + d.extra_alu
    tail = sum(passes[-(config.unit_queue + 1):])
    row = bn * t * _MEMORY[ACC].itemsize
    operands = sum(-(-row * (1 if narrow else bm * t) // config.dma_bytes_per_cycle) + ov for narrow in staged)
    period = alu - tail + max(gemm, tail)
    copies = _MEMORY[INP].copies(repeated=True)
    if tiles > copies:
        period = max(period, alu + d.stores + d.tile_loads + (tiles - copies) * dwmac)
    period = max(period, tiles * d.tile_loads + operands + d.stores)
    first = d.fill + d.tile_loads
    return first + gemm - min(first, reset) + (d.blocks - 1) * period + alu + d.stores


def _epilogue_work(sch, plan, knobs: Knobs, final, steps, out_buffer, temporaries) -> tuple[int, tuple, tuple]:
    """What a GEMM's or depthwise block's epilogue ``final`` costs per block under ``knobs``:
    ``(prefix, ALU runs, staged operands)``, ``prefix`` the shared steps of a fork run
    once (:data:`FORKS`; also set as ``plan.shared``, what the fork knob is offered for)."""
    plan.shared = _shared_prefix(sch, final, steps, out_buffer, temporaries)
    prefix = 0 if knobs.fork == "each" else plan.shared
    return prefix, _alu_runs(sch, final, steps, out_buffer, temporaries, prefix), \
        _staged(sch, final, steps, out_buffer, temporaries)


def _staged(sch, final, steps, out_buffer, temporaries) -> tuple:
    """Per operand of the epilogue ``final`` that a LOAD stages in ACC (not a temporary,
    which the ALU computes there), whether it is narrow (:func:`_operands`)."""
    if steps is None:
        return ()
    computed = {sch.get(b).writes[0].source.__chandle__() for b in temporaries}
    return tuple(narrow for key, narrow in _epilogue_operands(sch, final, out_buffer, temporaries).items()
                 if key not in computed)


def _alu_runs(sch, final, steps, out_buffer, temporaries, prefix: int, by_rows: bool = False) -> tuple:
    """The lengths of the ALU chains an epilogue ``final`` runs per block, in order: the
    ``prefix`` steps a fork shares (run once on the accumulator), per temporary its zeroing
    (x * 0), copy of the accumulator and chain (but the prefix), then the accumulator's own
    steps (:func:`_own_steps`), a LUT step a pass of its own. Each run on one destination is
    cut where a step reads another vector operand than the chain's earlier ones, as
    :mod:`accel.compiler.chains` cuts it (a chain reads one: a temporary's copy of the
    accumulator and a bias after it are two chains, which a bias shared before the fork
    saves). ``by_rows``: the block is stored an image row at a time, its own steps run row
    by row, each step over a row before the next (no chain: each its own pass)."""
    if steps is None:
        return ()
    source = lambda step: None if step.operand is None else step.operand.source  # noqa: E731
    runs: list = []         # per run on one destination, its steps' vector operands (None: an immediate)
    if temporaries:
        runs.append([source(s) for s in steps[:prefix]])
        runs += [[None, out_buffer] + [source(s) for s in (_temporary_steps(sch.get(b), out_buffer) or [])[prefix:]]
                 for b in temporaries]
    own = _own_steps(sch, final, steps, temporaries, prefix)
    run: list = []
    for step in own:
        if step.op is None or by_rows:      # a LUT: its own instruction
            runs += [run, 1]
            run = []
        else:
            run.append(source(step))
    runs.append(run)
    return tuple(n for r in runs for n in ((r,) if isinstance(r, int) else _chains(r)) if n > 0)


def _own_steps(sch, final, steps, temporaries, prefix: int) -> list:
    """The steps the epilogue ``final`` applies to the accumulator after a fork's shared
    ``prefix`` (all of them without a temporary), but a clip to int8 before the narrowing
    cast, which the STORE does by saturating."""
    block = sch.get(final)
    value = wrapping.strip(block.body.value)
    saturates = _table(block) is None and isinstance(value, tirx.Cast) and \
        str(block.body.buffer.dtype) == "int8" and clipped_to_int8(value.value) is not None
    own = list(steps)[:len(steps) - 2 * saturates]
    return own[prefix:] if temporaries else own


def _chains(sources: list) -> list:
    """The lengths of the ALU chains a run of steps on one destination makes, ``sources`` its
    steps' vector operands in order (None: an immediate): a chain holds up to
    :data:`~accel.hw.instructions.CHAIN_STEPS` steps, :data:`~accel.hw.instructions.CHAIN_IMMEDIATES`
    of them with an immediate, and is cut where a step reads another operand than its
    earlier steps.

    >>> _chains([None, "acc", None, "bias", None]), _chains([None] * 7 + ["t"])
    ([3, 2], [6, 2])
    """
    out, n, imms, read = [], 0, 0, None
    for src in sources:
        full = n == CHAIN_STEPS or (src is None and imms == CHAIN_IMMEDIATES)
        if full or (src is not None and read is not None and not _same_buffer(src, read)):
            out.append(n)
            n, imms, read = 0, 0, None
        n += 1
        imms += src is None
        read = read if src is None else src
    return out + [n] if n else out


def _same_buffer(a, b) -> bool:
    return a is b or (hasattr(a, "same_as") and a.same_as(b))


def _pick_block(tiles: int, limit: int) -> int:
    """Tiles per block along a dimension: the whole dimension when it is at most ``limit``
    tiles (no padding, and the fewest, longest instructions: K of 3 tiles in one block, not
    3 of one), else the largest power of two up to ``limit`` whose extra padding stays
    within an eighth of the work (bigger blocks mean fewer, longer instructions); where that
    pads, the largest divisor of the dimension up to ``limit`` if it is at least half as
    large: the padding costs every block of the padded row its MACs and every epilogue pass
    its lanes, on the six real models more than the extra blocks' instructions and INP
    reloads (ppocrv5_rec's 480 channels, 30 tiles, in 5 blocks of 6, not 4 of 8 padded to
    32: 2.1% fewer cycles on the model; its 18385 output columns in blocks of 5 tiles, not
    8 padded from 1150 to 1152, 0.03% more on that layer).

    >>> _pick_block(3, 32), _pick_block(12, 8), _pick_block(13, 8), _pick_block(30, 8), _pick_block(60, 32)
    (3, 4, 1, 6, 30)
    """
    if tiles <= limit:
        return tiles
    power = next(b for b in (32, 16, 8, 4, 2, 1) if b <= limit and (-(-tiles // b) * b - tiles) * 8 <= tiles)
    if tiles % power == 0:
        return power
    divisor = max(b for b in range(1, limit + 1) if tiles % b == 0)
    return divisor if 2 * divisor >= power else power


def schedule(func: tirx.PrimFunc, config: Config) -> tuple[ir.IRModule, Notes]:
    """Schedule every offloadable GEMM block of ``func``; see the module docstring."""
    sch = tp.Schedule(ir.IRModule({"main": func}))
    notes = schedule_in(sch, config)
    return sch.mod, notes


def schedule_in(sch: s_tir.Schedule, config: Config) -> Notes:
    """:func:`schedule` on the ``main`` function of an existing ``sch`` (a tuner's design
    space), recording the primitives in its trace; returns the :class:`Notes`."""
    for p in sch.mod["main"].params:
        if tirx.is_buffer_var(p):
            for d in p.shape:
                _const(d)
    notes = Notes()
    gemms = []
    for name, gemm, conv, block_rv in _find_gemms(sch, notes):
        knobs = Knobs.from_annotations(sch.get(block_rv).annotations)
        for key in knobs.annotations():
            sch.unannotate(block_rv, key)
        gemms.append((name, gemm, conv, knobs))
    reserved: dict = {}     # scratchpad elements the GEMMs scheduled so far keep for the whole function
    for name, gemm, conv, knobs in gemms:
        cpu_steps = len(notes.on_cpu)
        kept = dict(reserved)
        try:
            if isinstance(conv, depthwise.Depthwise):
                _schedule_depthwise(sch, name, conv, config, notes, reserved, knobs)
                continue
            if conv is not None:
                gemm = normalise_conv(sch, conv, config, notes, gather=knobs.gather,
                                      fuse_rows=None if knobs.pixels is None else knobs.pixels == "image")
            _schedule_gemm(sch, name, gemm, config, notes, knobs, reserved)
        except DoesNotFit as why:
            # the steps taken so far (layouts, the epilogue inlined) are valid code for the CPU
            del notes.on_cpu[cpu_steps:]
            notes.on_cpu.append((name, f"is not offloaded: {why}"))
            reserved.clear()
            reserved.update(kept)       # what it reserved (a LUT's table, say) is not kept
    return notes


def _find_gemms(sch: s_tir.Schedule, notes: Notes) -> list:
    """``(name, gemm, conv, block_rv)`` for each offloadable GEMM block of ``main`` (a
    :class:`GemmAnalysis`, or for a convolution ``conv`` set and ``gemm`` None); the MACs of every reduction and why
    each other one stays on the CPU go to ``notes``."""
    found = []
    for block_rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(block_rv)
        reduces = [iv for iv in block.iter_vars if int(iv.iter_type) == REDUCE]
        if not reduces:
            continue
        macs = 1
        for iv in block.iter_vars:
            macs *= _const(iv.dom.extent)
        notes.total_macs += macs
        if _inline_operand_producers(sch, block_rv):
            # a widening cast or a transpose of an operand in a block of its own (how
            # TVM's ONNX importer and Relax's nn.Linear write them) is read in place
            block = sch.get(block_rv)
        m = _GEMM_BODY.match(block.body)
        gemm, conv = None, None
        why = f"it is not an int8 x int8 -> int32 multiply-accumulate (found {_dtypes_found(block)})"
        if m is not None:
            gemm, why = _analyse_gemm(block, m)
            if why == _NOT_PLAIN:
                conv, why = analyse_conv(block, m[_GEMM_BODY], (m[_X_LOAD], m[_Y_LOAD]))
            if why == DEPTHWISE:
                conv, why = depthwise.analyse(block, m[_GEMM_BODY], (m[_X_LOAD], m[_Y_LOAD]))
        if gemm is None and conv is None:
            notes.on_cpu.append((block.name_hint, why))
        else:
            found.append((block.name_hint, gemm, conv, block_rv))
    return found


def gemm_blocks(sch: s_tir.Schedule, with_depthwise: bool = False) -> list[tuple[str, object]]:
    """``(block name, Conv or None)`` for each GEMM block of ``main`` that :func:`schedule_in`
    would offload, in program order (what a tuner annotates; a convolution comes with its
    :class:`accel.compiler.conv.Conv`); ``sch`` is left as it is. ``with_depthwise``: the
    depthwise convolutions too (an :class:`accel.compiler.depthwise.Depthwise`), whose only
    knobs are their blocks of tiles (``bm``, ``bn``: :func:`depthwise_blocks`)."""
    return [(name, conv) for name, _, conv, _ in _find_gemms(sch.copy(), Notes())
            if with_depthwise or not isinstance(conv, depthwise.Depthwise)]


#: The most tiles a depthwise block of output tiles holds (its epilogue's ALU steps run over
#: the whole block: a larger block spends less on each instruction's issue).
DW_BLOCK_LIMIT = 16


def depthwise_blocks(tiles: int, limit: int = DW_BLOCK_LIMIT, step: int = 1) -> tuple:
    """Tiles per depthwise block along a dimension of ``tiles`` tiles: its divisors up to
    ``limit`` (a block that does not divide the tiles would leave a partial one, which
    DWMAC's tile loops cannot run) that are multiples of ``step`` (a block of whole virtual
    rows over the image's pixels: :class:`accel.compiler.depthwise.Flat`).

    >>> depthwise_blocks(12), depthwise_blocks(13), depthwise_blocks(12, step=3)
    ((1, 2, 3, 4, 6, 12), (1, 13), (3, 6, 12))
    """
    return tuple(b for b in range(step, min(tiles, limit) + 1, step) if tiles % b == 0)


def _dtypes_found(block) -> str:
    """The dtypes a reduction multiplies and accumulates into: ``float32 x float32 -> float32``."""
    out = block.body.buffer if isinstance(block.body, tirx.BufferStore) else None
    loads = []
    if out is not None:
        tvm_ffi.structural_walk(block.body.value, (ir.TensorLoad, lambda l: loads.append(l)
                                                   if not l.source.same_as(out) else None))
    ins = " x ".join(str(l.source.dtype) for l in loads) or "no operands"
    return f"{ins} -> {out.dtype if out is not None else '?'}"


def _inline_operand_producers(sch, block_rv) -> bool:
    """Inline the producers of a reduction's operands that only cast or move one tensor
    (``astype``, ``permute_dims``); True if one was inlined."""
    inlined = False
    for producer in sch.get_producers(block_rv):
        blk = sch.get(producer)
        body = blk.body
        if not isinstance(body, tirx.BufferStore) or any(int(iv.iter_type) != DATA_PAR for iv in blk.iter_vars):
            continue
        value = body.value.value if isinstance(body.value, tirx.Cast) else body.value
        if not isinstance(value, ir.TensorLoad) or not _permutes(value.indices, blk):
            continue
        try:
            sch.compute_inline(producer)
        except TVMScheduleError:
            continue
        inlined = True
    return inlined


def _permutes(indices, block) -> bool:
    """Whether ``indices`` are the block's iter vars in some order (a copy or a transpose)."""
    keys = sorted(iv.var.__chandle__() for iv in block.iter_vars)
    return all(isinstance(e, tirx.Var) for e in indices) and sorted(e.__chandle__() for e in indices) == keys


class DoesNotFit(ScheduleError):
    """Even a GEMM's smallest blocks overflow a scratchpad of the Config: it stays on the CPU."""


@dataclass(frozen=True)
class Extents:
    """What a GEMM's scratchpad footprint depends on besides its blocks: tiles along M, N
    and K, the iterations of the loops around a block of output tiles (``outer``: the
    batch) and around a block of K (``k_outer``: a convolution's kernel taps), the weight's
    elements per element of its N x K matrix (``weight_copies``: a batch of weights, the
    taps), and per operand the epilogue reads from ACC whether it is narrow (a bias: along
    one dimension at most) or as large as the accumulator (a residual); ``m_rows``: M's rows
    when the epilogue's ALU runs over them alone (a GEMM's; None: over whole tiles)."""

    m_tiles: int
    n_tiles: int
    k_tiles: int
    outer: int = 1
    k_outer: int = 1
    weight_copies: int = 1
    operands: tuple = ()
    m_rows: int | None = None


def footprint(e: Extents, t: int, bm: int, bn: int, bk: int, resident: bool) -> dict:
    """The elements of each scratchpad (by scope) a GEMM's blocks occupy at most, as the
    planner lays them out: what each scratchpad's :meth:`~tirpat.device.Memory.footprint`
    says for its buffers (a buffer allocated inside a loop that runs more than once is
    double-buffered; a resident weight is allocated once, outside the loops).

    >>> footprint(Extents(4, 4, 4), 16, 1, 2, 2, False) == {INP: 1024, WGT: 2048, ACC: 1024}
    True
    """
    acc_repeated, k_repeated = _repeated(e, bm, bn, bk)
    blocks_n, blocks_k = -(-e.n_tiles // bn), -(-e.k_tiles // bk)
    options = {"tile": t}
    inp, wgt, acc = (_MEMORY[scope] for scope in (INP, WGT, ACC))
    weight = (wgt.footprint(e.weight_copies * blocks_n * bn * blocks_k * bk * t * t, repeated=False, options=options)
              if resident else wgt.footprint(t * t * bn * bk, repeated=k_repeated, options=options))
    operands = [t * max(bm, bn) if narrow else t * t * bm * bn for narrow in e.operands]
    return {INP: inp.footprint(t * t * bm * bk, repeated=k_repeated, options=options), WGT: weight,
            ACC: sum(acc.footprint(n, repeated=acc_repeated, options=options) for n in (t * t * bm * bn, *operands))}


def _repeated(e: Extents, bm: int, bn: int, bk: int) -> tuple[bool, bool]:
    """Whether the loops around a block of output tiles (ACC's buffers) and around a block
    of K (INP's, a streamed weight's) run more than once."""
    acc_iters = e.outer * -(-e.m_tiles // bm) * -(-e.n_tiles // bn)
    k_iters = acc_iters * e.k_outer * -(-e.k_tiles // bk)
    return acc_iters > 1, k_iters > 1


def _copies(e: Extents, bm: int, bn: int, bk: int) -> tuple[int, int]:
    """Copies of the buffers allocated per block of output tiles (ACC) and per block of K
    (INP, a streamed weight), as their scratchpads keep them."""
    acc_repeated, k_repeated = _repeated(e, bm, bn, bk)
    return _MEMORY[ACC].copies(repeated=acc_repeated), _MEMORY[INP].copies(repeated=k_repeated)


#: Each scratchpad's declaration by scope.
_MEMORY = {m.scope: m for m in MEMORIES.values()}


def _blocks(e: Extents, knobs: Knobs, config: Config, reserved: dict | None = None,
            whole_m: bool = False) -> tuple[int, int, int, bool]:
    """``(bm, bn, bk, resident)``: tiles per block along M, N and K and the weight's residency.

    The knobs' choices (blocks at most the whole dimension), else: one row of tiles (the
    heuristic's M block, :func:`least_cycles`, is chosen by ``_schedule_gemm`` among the
    blocks that keep the N and K blocks this gives one row); along N and K
    :func:`_pick_block`'s (the whole dimension up to the limit, else a power of two or a
    divisor), halved while a double-buffered block would take more than half of its
    scratchpad (N first in ACC, then K, then M); the weight resident when it takes at most
    half of WGT and more than one row of tiles reuses it. Then, whatever was chosen, blocks are halved until
    every scratchpad holds its :func:`footprint` (ACC: N, then M; INP: K, then M; WGT: K,
    then N), the other residency tried when one cannot fit. ``reserved``: elements of each
    scratchpad already taken for the whole function (an earlier GEMM's resident weight);
    ``whole_m``: M is one block (whole image rows). Raises :class:`DoesNotFit` when even
    the smallest blocks overflow a scratchpad.

    >>> _blocks(Extents(1, 8, 4), Knobs(), Config())
    (1, 8, 4, False)
    >>> _blocks(Extents(1, 8, 4), Knobs(), Config(wgt_bytes=2048))
    (1, 4, 1, False)
    """
    t = config.tile
    reserved = reserved or {}
    bm = e.m_tiles if whole_m else (min(knobs.bm, e.m_tiles) if knobs.bm is not None else 1)
    bn = min(knobs.bn, e.n_tiles) if knobs.bn is not None else _pick_block(e.n_tiles, BN_LIMIT)
    bk = min(knobs.bk, e.k_tiles) if knobs.bk is not None else _pick_block(e.k_tiles, BK_LIMIT)
    half = {"acc": config.acc_elements // 2, "inp": config.inp_elements // 2, "wgt": config.wgt_elements // 2}
    while bm * bn > 1 and 2 * t * t * bm * bn > half["acc"] and not (whole_m and bn == 1):
        if bn > 1:
            bn //= 2
        else:
            bm //= 2
    while bk > 1 and (2 * t * t * bk * bm > half["inp"] or 2 * t * t * bk * bn > half["wgt"]):
        bk //= 2
    while bm > 1 and not whole_m and 2 * t * t * bk * bm > half["inp"]:
        bm //= 2
    if knobs.weights is None:
        weight = footprint(e, t, bm, bn, bk, True)[WGT]
        resident = weight <= config.wgt_elements // 2 and e.m_tiles * e.outer > 1
    else:
        resident = knobs.weights == "resident"
    first = None
    for residency in (resident, not resident):
        fitted, why = _shrink(e, config, reserved, whole_m, bm, bn, bk, residency)
        if fitted is not None:
            return fitted
        first = first or why
    raise DoesNotFit(first)


def _shrink(e: Extents, config: Config, reserved: dict, whole_m: bool, bm: int, bn: int, bk: int,
            resident: bool):
    """``((bm, bn, bk, resident), None)`` with blocks halved until they fit, or ``(None, why)``."""
    t = config.tile
    halve = {ACC: ("bn", "bm"), INP: ("bk", "bm"), WGT: ("bk", "bn")}
    sizes = {"bm": bm, "bn": bn, "bk": bk}
    while True:
        need = footprint(e, t, sizes["bm"], sizes["bn"], sizes["bk"], resident)
        over = [scope for scope in (ACC, INP, WGT) if need[scope] > _free(config, reserved, scope)]
        if not over:
            return (sizes["bm"], sizes["bn"], sizes["bk"], resident), None
        scope = over[0]
        knob = next((k for k in halve[scope] if sizes[k] > 1 and not (k == "bm" and whole_m)), None)
        if knob is None or (scope == WGT and resident):
            return None, _overflow(e, config, reserved, scope, need[scope], resident)
        sizes[knob] //= 2


def _free(config: Config, reserved: dict, scope: str) -> int:
    return _MEMORY[scope].capacity_of(config.__dict__) - reserved.get(scope, 0)


def _overflow(e: Extents, config: Config, reserved: dict, scope: str, need: int, resident: bool) -> str:
    """Why a GEMM's smallest blocks do not fit ``scope``, in the terms of the Config."""
    memory = _MEMORY[scope]
    option, item, label = capacity_option(memory), memory.itemsize, memory.name
    t = config.tile
    added = sorted({"a bias" if narrow else "a residual" for narrow in e.operands})
    what = {INP: f"one {t}x{t} int8 input tile",
            WGT: "the whole weight, loaded once" if resident else f"one {t}x{t} int8 weight tile",
            ACC: f"one {t}x{t} int32 accumulator tile" + (f" and what its epilogue adds ({', '.join(added)})"
                                                          if added else "")}[scope]
    acc_copies, k_copies = _copies(e, 1, 1, 1)
    if (acc_copies if scope == ACC else 1 if scope == WGT and resident else k_copies) == 2:
        what += ", twice (double-buffered: the next block loads while this one computes)"
    kept = reserved.get(scope, 0) * item
    taken = f" and {kept} bytes hold what the GEMMs before it keep there" if kept else ""
    return (f"even its smallest blocks do not fit accel's {label} scratchpad: {what} take {need * item} bytes"
            f"{taken}, the target's Config has {getattr(config, option)} ({option}; "
            f"{need * item + kept} would do)")


def _whole_rows(width: int, rows: int, pixels: int) -> bool:
    """Whether blocks of ``rows`` pixels of an image ``width`` pixels wide (``pixels`` in
    all) start at the start of an image row and hold whole rows, or lie within one row, or
    are the whole image: then a block's pixel ``r`` is at row ``r // width``, column
    ``r % width``, affine in ``r`` once the block's rows are split by the width."""
    return rows % width == 0 or width % rows == 0 or rows >= pixels


def _schedule_gemm(sch: s_tir.Schedule, name: str, g: GemmAnalysis, config: Config, notes: Notes, knobs: Knobs,
                   reserved: dict) -> None:
    """Schedule the GEMM block ``name`` for accel (the module docstring's four steps) and
    add its :class:`GemmPlan` to ``notes``; ``reserved``: what earlier GEMMs keep of each
    scratchpad, to which this one's adds."""
    t = config.tile
    m_, n_, k_all, batch = g.sizes
    plan = GemmPlan(name, m_, n_, k_all, batch, gather=g.gather)
    _dma_layouts(sch, name, g, notes)
    final, steps, out_buffer, temporaries = _epilogue(sch, sch.get_sblock(name), g.stop)
    _reserve_table(reserved, steps, t)
    operands = {} if steps is None else _wide_operands(sch, final, out_buffer, temporaries)
    k_ = g.extents[g.k]
    shape = Extents(-(-m_ // t), -(-n_ // t), -(-k_ // t), batch, k_all // k_, _elements(g.weight) // (n_ * k_),
                    tuple(operands.values()), m_rows=m_)
    kept = dict(reserved)
    if knobs.bm is None:
        # the heuristic's M block: of those that keep one row of tiles' blocks of N and K and
        # the weight's residency, the fewest cycles by the estimate (read off the epilogue
        # before padding M to whole blocks, which only adds the copy out that every block
        # size pays alike). The estimate is the compute queue's (and the first LOAD's and last
        # STORE's, :func:`fill_and_drain`): such blocks move the same
        # bytes through the DMA (each block of N reads its INP block once), in fewer, longer
        # instructions; a block that made N's smaller would reload INP per block of N, which
        # it does not see (+10% cycles on ppocrv5_det's 40 x 40 1x1 convolution, estimated -2%)
        cost = _gemm_estimate(sch, plan, knobs, name, g, shape, config, kept, (final, steps, out_buffer, temporaries))
        try:
            row = _fitting_blocks(name, g, shape, replace(knobs, bm=1), config, kept)[1:]
        except ScheduleError:
            row = None      # no block fits: the error below says why
        if row is not None:
            bm = least_cycles(shape.m_tiles, BM_LIMIT, lambda bm_: cost(replace(knobs, bm=bm_), keep=row))
            knobs = replace(knobs, bm=bm)
    bm, bn, bk, resident = _fitting_blocks(name, g, shape, knobs, config, reserved)
    plan.device_macs, padded = _pad_to_blocks(sch, name, g, (t * bm, t * bn, t * bk))
    if padded:      # the copy out of the padded result joins the epilogue
        final, steps, out_buffer, temporaries = _epilogue(sch, sch.get_sblock(name), g.stop)
    if final is not None and steps is None:
        notes.on_cpu.append((sch.get(final).name_hint, "the epilogue is not a chain of ALU operations "
                             "(add, max, min, multiply, shift by a constant, int32 operands)"))
        final = None
    plan.epilogue = describe_epilogue(steps, str(sch.get(final).writes[0].source.dtype),
                                      [sch.get(b).writes[0].source for b in temporaries]) if steps else []
    cost = _gemm_estimate(sch, plan, knobs, name, g, shape, config, kept, (final, steps, out_buffer, temporaries))
    prefix = 0 if knobs.fork == "each" else plan.shared
    plan.estimate = lambda bm_, bn_, bk_: cost(Knobs(bm_, bn_, bk_, WEIGHTS[resident]))
    _reserve(reserved, shape, t, bm, bn, bk, resident)
    outputs = batch * -(-m_ // (t * bm)) * t * bm * -(-n_ // (t * bn)) * t * bn
    plan.cycles = estimate_cycles(plan.device_macs, config.gemm_macs_per_cycle, outputs, steps, temporaries, config)
    _tile_and_stage(sch, name, g, final, out_buffer, t, (bm, bn, bk), resident, temporaries, prefix)
    plan.knobs = Knobs(bm, bn, bk, WEIGHTS[resident], g.method, g.pixels, FORKS[bool(prefix)])
    notes.offloaded.append(plan)


def _gemm_estimate(sch, plan, knobs: Knobs, name: str, g: GemmAnalysis, shape: Extents, config: Config,
                   reserved: dict, epilogue: tuple) -> Callable[[Knobs], int | None]:
    """The compute queue's cycles (:func:`block_cycles`) and the pipeline's fill and drain
    (:func:`fill_and_drain`) of the GEMM block ``name`` were it scheduled with knobs ``k``
    (a function of them; None where they do not fit, or where ``keep`` is given and the
    fitted ``(bn, bk, resident)`` are not it), its epilogue ``(final, steps, out_buffer,
    temporaries)`` run as ``knobs.fork`` says (``plan.shared`` set); ``reserved``: what
    earlier GEMMs keep of each scratchpad."""
    final, steps, out_buffer, temporaries = epilogue
    t = config.tile
    prefix, alu_runs, staged = _epilogue_work(sch, plan, knobs, final, steps, out_buffer, temporaries)
    row_runs = _alu_runs(sch, final, steps, out_buffer, temporaries, prefix, by_rows=True)
    own = len(_own_steps(sch, final, steps, temporaries, prefix)) if steps is not None else 0
    # the bytes of an element of the result the STOREs write: the epilogue's, else the accumulator's
    stored = tvm.DataType(str(sch.get(final).writes[0].source.dtype if final is not None else "int32")).bits // 8

    def estimate(k: Knobs, keep: tuple | None = None) -> int | None:
        try:
            fitted = _fitting_blocks(name, g, shape, k, config, reserved)
        except ScheduleError:
            return None
        if keep is not None and fitted[1:] != keep:
            return None
        # a block of whole image rows stores (and so runs its own epilogue steps) one row at a
        # time: each step a pass of its own, an instruction per row; but with one tile of
        # channels, whose ALU instructions run over the rows and their pixels at once
        # (accel.compiler.rules), chained as any block's
        ends = fill_and_drain(shape, *fitted[:3], config, stored)
        if g.row_width is None or g.row_width >= t * fitted[0] or fitted[1] == 1:
            return block_cycles(shape, *fitted[:3], alu_runs, config, staged=staged) + ends
        blocks = shape.outer * -(-shape.m_tiles // fitted[0]) * -(-shape.n_tiles // fitted[1])
        rows = -(-t * fitted[0] // g.row_width)
        return block_cycles(shape, *fitted[:3], row_runs, config, staged=staged) + ends + \
            blocks * (rows - 1) * own * config.issue_overhead

    return estimate


def fill_and_drain(e: Extents, bm: int, bn: int, bk: int, config: Config, itemsize: int) -> int:
    """The cycles a GEMM in blocks of ``bm x bn x bk`` tiles spends beyond its compute
    queue's (:func:`block_cycles`): the first block's INP LOAD before its first GEMM and the
    last block's STORE (``itemsize`` bytes an element) after its last ALU instruction; every
    other LOAD and STORE runs beside the compute queue. A larger block fills and drains
    longer (a 1x1 convolution of a 40 x 40 image in blocks of 4 tiles of M: 60 cycles more
    than in blocks of 1, the issue overhead it saves counted).

    >>> fill_and_drain(Extents(6, 1, 2), 1, 1, 2, Config(), 1), fill_and_drain(Extents(6, 1, 2), 6, 1, 2, Config(), 1)
    (20, 80)
    """
    t, ov = config.tile, config.issue_overhead
    rows = bm * t if e.m_rows is None or e.m_tiles > bm else e.m_rows
    return -(-rows * bk * t // config.dma_bytes_per_cycle) + ov + \
        -(-rows * bn * t * itemsize // config.dma_bytes_per_cycle) + ov


def least_cycles(tiles: int, limit: int, cost: Callable[[int], int | None]) -> int:
    """Of the blocks of a dimension of ``tiles`` tiles (:func:`block_sizes`), the one of the
    fewest cycles by ``cost`` (None: the block does not fit), the largest of equals: the
    estimate counts whole cycles, and of two blocks it finds equally cheap the larger runs
    fewer instructions (a block's reset, bias LOAD, epilogue chains and STORE are one
    instruction each, not one per tile: fewer for the simulator to record and replay).
    1 when none fits.

    >>> least_cycles(6, 32, lambda bm: {1: 90, 2: 80, 3: 70, 4: 95, 6: 70}[bm])
    6
    """
    costs = {b: cost(b) for b in block_sizes(tiles, limit)}
    fits = [b for b, c in costs.items() if c is not None]
    return min(fits, key=lambda b: (costs[b], -b)) if fits else 1


def block_sizes(tiles: int, limit: int) -> tuple:
    """Tiles per block along a dimension of ``tiles`` tiles, up to ``limit``: its divisors
    (no padding to whole blocks), the powers of two, and the whole dimension.

    >>> block_sizes(6, 32), block_sizes(40, 16)
    ((1, 2, 3, 4, 6), (1, 2, 4, 5, 8, 10, 16))
    """
    top = min(tiles, limit)
    return tuple(b for b in range(1, top + 1) if tiles % b == 0 or b & (b - 1) == 0)


def _schedule_depthwise(sch: s_tir.Schedule, name: str, dw: depthwise.Depthwise, config: Config, notes: Notes,
                        reserved: dict, knobs: Knobs = Knobs()) -> None:
    """Schedule the depthwise convolution block ``name`` for DWMAC and add its plan to ``notes``:
    lay it out (:func:`accel.compiler.depthwise.normalise`), pad the output pixels and
    channels ``f`` to whole tiles, tile to one 16 x 16 output tile per DWMAC (its loop levels
    the kernel's taps), stage each tile's input through INP (one strided LOAD per kernel row,
    a band of the pixels its taps read: :func:`accel.compiler.depthwise.band`;
    double-buffered), the whole weight once through WGT, and the accumulator with the
    epilogue (and its operands) through ACC, as a GEMM's, for a block of ``knobs.bm`` x
    ``knobs.bn`` tiles of pixels x channels at once (each of the epilogue's ALU steps is one
    instruction over the block). A block that does not divide the tiles, or does not fit
    ACC, is refused (:class:`ScheduleError`).

    The pixels (``knobs.pixels``) run along each output ``"row"`` (each padded to whole tiles:
    a 20-pixel row computes 32) or over the ``"image"``
    (:func:`accel.compiler.depthwise.flatten`: rows of a virtual width a little wider than
    the padded input, a block of whole rows, stored a row at a time; a 20-pixel row of a 3 x 3
    kernel computes 24). The heuristic takes the block of pixels (one tile of channels wide)
    of the fewest estimated cycles (:func:`dwmac_cycles`; the larger of equals: fewer
    instructions) along the rows and over the image (its layout of the fewest tiles), and the
    cheaper of the two. A block's tiles share one reset, bias LOAD, STORE and instruction per
    epilogue step."""
    t = config.tile
    e = dw.ext
    pix = depthwise.pixels(dw)
    if pix is None:
        raise DoesNotFit("its output is one pixel: no tile of pixels x channels to gather")
    other = "y" if pix == "x" else "x"
    taps = e["ry"] * e["rx"]
    x_pad, f_pad = -(-e[pix] // t) * t, -(-e["f"] // t) * t
    layouts = depthwise.flat_layouts(dw, t, DW_BLOCK_LIMIT)
    if knobs.pixels == "image" and not layouts:
        raise ScheduleError(f"{name}: its output is one pixel wide or one row high: its pixels run over the image "
                            "already (pixels='row')")
    row_tiles = (x_pad // t, f_pad // t)
    options = {"tile": t}
    free = _free(config, reserved, ACC)

    def acc_need(regions: int, block: tuple, count: int) -> int:
        """ACC's elements for ``regions`` regions of a block of tiles (double-buffered when
        there are several blocks, of ``count`` in all)."""
        size = block[0] * block[1]
        return _MEMORY[ACC].footprint(regions * t * t * size, repeated=count > size, options=options)

    def fitting(regions: int, block: tuple, tiles: tuple, count: int, least: int = 1) -> tuple:
        """``block`` made smaller (the larger side to its next divisor of the tiles, the
        pixels' no smaller than ``least``) until ``regions`` regions of it fit ACC."""
        while acc_need(regions, block, count) > free:
            sides = [s for s in (0, 1) if block[s] > (least if s == 0 else 1)]
            if not sides:
                break
            side = max(sides, key=lambda s: block[s])
            smaller = max(d for d in depthwise_blocks(tiles[side], block[side] - 1, least if side == 0 else 1))
            block = (smaller, block[1]) if side == 0 else (block[0], smaller)
        return block

    # the epilogue's ALU work per block, the same whichever way the pixels run: read off the
    # epilogue inlined before the padding (which adds the copy out of the padded result to it)
    view = depthwise.normalise(sch, dw, notes)
    final, steps, out_buffer, temporaries = _epilogue(sch, sch.get_sblock(name), view.stop)
    probe = GemmPlan(name, 0, 0, 0, 0)
    _, alu_runs, staged = _epilogue_work(sch, probe, knobs, final, steps, out_buffer, temporaries)
    prefix_ = 0 if knobs.fork == "each" else probe.shared
    row_runs = _alu_runs(sch, final, steps, out_buffer, temporaries, prefix_, by_rows=True)
    own = len(_own_steps(sch, final, steps, temporaries, prefix_)) if steps is not None else 0
    regions = 2
    if steps is not None:
        # the accumulator tile, and one tile per wide operand (a residual) or temporary
        wide = sum(1 for narrow in _wide_operands(sch, final, out_buffer, temporaries).values() if not narrow)
        regions = max(2, 1 + wide)
    # a block of several tiles: a region more for the narrow operands (a bias row per block)
    block_regions = regions + 1

    # what the DMA engine moves: a tile's input bands (of its channels, on average), the
    # weights before the first, and the result's rows (of the element the STOREs write)
    loads, band = depthwise.input_loads(dw, t)
    channels = -(-e["f"] // row_tiles[1])
    dma = config.dma_bytes_per_cycle

    def band_loads(pixels: int) -> int:
        """The DMA cycles of a tile's input LOADs of ``pixels`` pixels each."""
        return loads * (-(-pixels * channels // dma) + config.issue_overhead)

    # along a row, the input pixels a tile's bands read, on average (those past the input's
    # end are the LOADs' padding, not DMA); over the image every band's pixels are the input's
    reach = [min(band, max(0, depthwise.input_extent(dw, pix) - n * t * dw.taps[pix][0])) for n in range(row_tiles[0])]
    row_loads = -(-sum(band_loads(r) for r in reach) // row_tiles[0])
    fill = e["ry"] * (-(-e["rx"] * e["f"] // dma) + config.issue_overhead)
    stored = tvm.DataType(str(sch.get(final).writes[0].source.dtype if final is not None else "int32")).bits // 8

    def store(pixels: int, bn_: int) -> int:
        """The DMA cycles of a STORE of ``pixels`` pixels of a block ``bn_`` tiles of channels wide."""
        return -(-pixels * min(bn_ * t, e["f"]) * stored // dma) + config.issue_overhead

    def row_estimate(bm_: int, bn_: int, _bk: int) -> int | None:
        if row_tiles[0] % bm_ or row_tiles[1] % bn_:
            return None
        count = e["n"] * e[other] * row_tiles[0] * row_tiles[1]
        bm_, bn_ = fitting(block_regions, (bm_, bn_), row_tiles, count) if (bm_, bn_) != (1, 1) else (1, 1)
        # the ALU passes and STOREs run over the valid pixels (of a row's blocks, on average)
        pixels = -(-e[pix] * bm_ // row_tiles[0])
        blocks = DwmacBlocks(count // (bm_ * bn_), pixels, store(pixels, bn_), row_loads, fill)
        return dwmac_cycles(blocks, bm_, bn_, alu_runs, config, taps * config.dwmac_cycles, staged)

    def layout_estimate(flat: depthwise.Flat, bm_: int, bn_: int) -> int | None:
        tiles = (flat.tiles(t), f_pad // t)
        least = flat.tiles_per_block(t)
        if tiles[0] % bm_ or tiles[1] % bn_ or bm_ % least:
            return None
        count = e["n"] * tiles[0] * tiles[1]
        bm_, bn_ = fitting(block_regions, (bm_, bn_), tiles, count, least)
        if acc_need(block_regions, (bm_, bn_), count) > free:
            return None
        # the block's whole rows, each stored by a STORE of its valid pixels, which its ALU passes run over
        rows = bm_ * t // flat.width
        blocks = DwmacBlocks(count // (bm_ * bn_), rows * e["x"], rows * store(e["x"], bn_), band_loads(band), fill)
        if bn_ == 1:
            # one tile of channels: an ALU instruction's two loops run over the block's rows
            # and their pixels (accel.compiler.rules), its steps chained as a row's block's
            return dwmac_cycles(blocks, bm_, bn_, alu_runs, config, taps * config.dwmac_cycles, staged)
        # more: a block of whole rows runs its own epilogue steps a row at a time, each step a
        # pass of its own, an instruction per row
        blocks = replace(blocks, extra_alu=(rows - 1) * own * config.issue_overhead)
        return dwmac_cycles(blocks, bm_, bn_, row_runs, config, taps * config.dwmac_cycles, staged)

    def layout(bm_: int | None, bn_: int) -> tuple:
        """``(cycles, layout)`` of the layout over the image with the fewest tiles (then the
        cheapest) whose blocks ``bm_`` tiles (None: each layout's fewest whole rows) can be;
        ``(None, None)`` if none. Fewest tiles first: the estimate, exact on the DWMACs, is
        not on a large block's (more rows, fewer blocks) DMA and ALU beside them (choosing by
        it alone, blocks of up to 32 tiles, took 1.6% more cycles on ppocrv5_det than by the
        tiles, blocks of up to 16)."""
        costs = [(f.tiles(t), layout_estimate(f, bm_ or f.tiles_per_block(t), bn_), n) for n, f in enumerate(layouts)]
        costs = [c for c in costs if c[1] is not None]
        return (min(costs)[1], layouts[min(costs)[2]]) if costs else (None, None)

    def flat_estimate(bm_: int, bn_: int, _bk: int) -> int | None:
        return layout(bm_, bn_)[0]

    image = knobs.pixels == "image"
    bn = knobs.bn or 1
    flat_cost, flat = layout(knobs.bm, bn)
    # the heuristic's blocks of pixels: the fewest estimated cycles, along the rows and over the image
    flat_bm = knobs.bm or (flat and least_cycles(flat.tiles(t), DW_BLOCK_LIMIT, lambda b: layout_estimate(flat, b, bn)))
    row_bm = knobs.bm or least_cycles(row_tiles[0], DW_BLOCK_LIMIT, lambda b: row_estimate(b, bn, 1))
    if knobs.pixels is None and flat is not None:
        # over the image where it runs fewer DWMACs and the estimate finds it cheaper (or the
        # rows cannot take the blocks asked for)
        flat_cost, row_cost = layout_estimate(flat, flat_bm, bn), row_estimate(row_bm, bn, 1)
        image = row_cost is None or (flat.tiles(t) < e[other] * row_tiles[0] and flat_cost < row_cost)
    if image and flat is None:      # no layout takes these blocks (or fits ACC): the first's error below
        flat = layouts[0]
    if image:
        tiles = (flat.tiles(t), f_pad // t)
        bm = flat_bm or flat.tiles_per_block(t)
        if tiles[0] % bm or tiles[1] % bn or bm % flat.tiles_per_block(t):
            raise ScheduleError(f"{name}: a block of {bm} x {bn} tiles is not whole rows of {flat.width} pixels "
                                f"dividing the {tiles[0]} x {tiles[1]} tiles of the image's pixels x channels")
        count = e["n"] * tiles[0] * tiles[1]
    else:
        tiles = row_tiles
        bm = row_bm
        if tiles[0] % bm or tiles[1] % bn:
            raise ScheduleError(f"{name}: a block of {bm} x {bn} tiles does not divide the {tiles[0]} x {tiles[1]} "
                                f"tiles of pixels x channels")
        count = e["n"] * e[other] * tiles[0] * tiles[1]
    least = flat.tiles_per_block(t) if image else 1
    # the fewest ACC regions the least block takes (a block of several tiles a region more for
    # the narrow operands' rows)
    least_regions = regions if least == 1 else block_regions
    # what the tiles occupy, as the planner lays them out (the layout and epilogue steps so far
    # are valid code for the CPU, should it not fit)
    need = {INP: _MEMORY[INP].footprint(depthwise.inp_elements(dw, t), repeated=count > 1, options=options),
            WGT: _MEMORY[WGT].footprint(taps * f_pad, repeated=False, options=options),
            ACC: acc_need(least_regions, (least, 1), count)}
    for scope, n in need.items():
        if n > _free(config, reserved, scope):
            what = "one depthwise tile's" if scope != ACC or least == 1 else f"a depthwise block of {least} tiles'"
            raise DoesNotFit(f"{what} {_MEMORY[scope].name} buffers take {n * _MEMORY[scope].itemsize} bytes, "
                             f"the target's Config has {getattr(config, capacity_option(_MEMORY[scope]))} "
                             f"({capacity_option(_MEMORY[scope])})")
    if image:
        view = depthwise.flatten(sch, name, dw, view, flat, f_pad, notes)
        plan = GemmPlan(name, e["y"] * e["x"], e["f"], taps, e["n"],
                        gather=f"per-channel DWMAC over the image's pixels, rows {flat.width} wide; each kernel "
                               f"row's input band by a strided LOAD from {view.source}")
        plan.device_macs = e["n"] * flat.height * flat.width * f_pad * taps
        # the block's iters: the pixels fused into one (where x was), y gone
        roles = [r for r in sorted(dw.pos, key=dw.pos.get) if r != "y"]
        pos = {r: n for n, r in enumerate(roles)}
    else:
        plan = GemmPlan(name, e[pix], e["f"], taps, e["n"] * e[other],
                        gather=f"per-channel DWMAC; each kernel row's input band by a strided, padded LOAD from "
                               f"{view.source}")
        blk = sch.get_sblock(name)
        keys = [iv.var.__chandle__() for iv in sch.get(blk).iter_vars]
        padded = [x_pad if k == keys[dw.pos[pix]] else f_pad if k == keys[dw.pos["f"]] else
                  int(iv.dom.extent.value) for k, iv in zip(keys, sch.get(blk).iter_vars)]
        plan.device_macs = e["n"] * e[other] * x_pad * f_pad * taps
        if padded != [int(iv.dom.extent.value) for iv in sch.get(blk).iter_vars]:
            sch.pad_einsum(blk, padded)
        pos = dict(dw.pos)
    view = depthwise.band(sch, name, dw, view, t)
    blk = sch.get_sblock(name)
    final, steps, out_buffer, temporaries = _epilogue(sch, blk, view.stop)
    if (bm, bn) != (least, 1):
        bm, bn = fitting(block_regions, (bm, bn), tiles, count, least)
    prefix, _, _ = _epilogue_work(sch, plan, knobs, final, steps, out_buffer, temporaries)
    plan.estimate = flat_estimate if image else row_estimate
    _reserve_table(reserved, steps, t)
    if final is not None and steps is None:
        notes.on_cpu.append((sch.get(final).name_hint, "the epilogue is not a chain of ALU operations "
                             "(add, max, min, multiply, shift by a constant, int32 operands)"))
        final = None
    plan.epilogue = describe_epilogue(steps, str(sch.get(final).writes[0].source.dtype),
                                      [sch.get(b).writes[0].source for b in temporaries]) if steps else []
    loops = sch.get_loops(blk)
    at = {r: loops[pos[r]] for r in pos}
    x_o, x_b, x_i = sch.split(at[pix], [None, bm, t])
    f_o, f_b, f_i = sch.split(at["f"], [None, bn, t])
    reduction = [at[r] for r in ("c", "ry", "rx") if r in at]
    sch.reorder(at["n"], *([] if image else [at[other]]), x_o, f_o, x_b, f_b, *reduction, x_i, f_i)
    block = sch.get(blk)
    weight_read = next(n for n, r in enumerate(block.reads) if len(r.source.shape) == 4 and
                       r.source.name.startswith(view.weight.name))
    a_stage = sch.cache_read(blk, 1 - weight_read, INP)
    b_stage = sch.cache_read(blk, weight_read, WGT)     # the whole weight, loaded once
    sch.compute_at(a_stage, f_b)        # each tile's taps: one tile's INP at a time
    for stage in (a_stage, b_stage):
        _inline_into_load(sch, stage, view.inline)
    if final is None:
        # (over the image, the copy of the padded accumulator's valid pixels out is always an epilogue)
        sch.reverse_compute_at(sch.cache_write(blk, 0, ACC), f_o)
    else:
        sch.set_scope(blk, 0, ACC)
        _place_temporaries(sch, temporaries, f_o, t)
        sch.reverse_compute_at(final, f_o)
        _stage_epilogue_operands(sch, blk, final, out_buffer, f_o, t, view.operand_layout, temporaries)
        _annotate_prefix(sch, blk, temporaries, final, prefix)
    if image:       # once the epilogue sits in the block's loops (its region is read off 2-D indices)
        depthwise.flatten_accumulator(sch, name, dw, flat.width)
    # one reset zeroes the block's tiles (its tile loops fold into the instruction), not one a tile
    sch.decompose_reduction(blk, x_b)
    reserved[WGT] = reserved.get(WGT, 0) + need[WGT]
    plan.knobs = Knobs(bm, bn, 1, "resident", "direct", "image" if image else "row", FORKS[bool(prefix)])
    plan.cycles = estimate_cycles(plan.device_macs, config.dwmac_macs_per_cycle, plan.device_macs // taps, steps,
                                  temporaries, config)
    notes.offloaded.append(plan)


def _dma_layouts(sch: s_tir.Schedule, name: str, g: GemmAnalysis, notes: Notes) -> None:
    """Step 1: transpose on the CPU an operand the DMA cannot read (it reads rows: the input
    must be ``[.., M, K]``, the weight ``[.., N, K]``)."""
    nb = len(g.batch)
    for buffer, want, index in ((g.inp, g.m, g.inp_index), (g.weight, g.n, g.weight_index)):
        if index is None or list(index[nb:]) == [want, g.k]:
            continue
        gemm = sch.get_sblock(name)
        stage = sch.cache_read(gemm, read_index(sch, gemm, buffer), "global")
        sch.transform_layout(stage, ("write", 0), lambda *ax: (*ax[:nb], ax[nb + 1], ax[nb]))
        mark_layout_stage(sch, stage)
        notes.on_cpu.append((sch.get(stage).name_hint, f"transposes {buffer.name} on the CPU: "
                             "the DMA reads rows, so this operand must be [.., rows, K]"))


def _fitting_blocks(name: str, g: GemmAnalysis, shape: Extents, knobs: Knobs, config: Config,
                    reserved: dict) -> tuple[int, int, int, bool]:
    """Step 3: ``(bm, bn, bk, resident)`` that fit the scratchpads (:func:`_blocks`); a block
    of an image's pixels holds whole image rows, else is the whole image."""
    t = config.tile
    bm, bn, bk, resident = _blocks(shape, knobs, config, reserved)
    width, pixels = g.row_width, g.extents[g.m]
    if width is None or _whole_rows(width, t * bm, pixels):
        return bm, bn, bk, resident
    try:
        return _blocks(shape, knobs, config, reserved, whole_m=True)
    except DoesNotFit as why:
        raise ScheduleError(f"{name}: a block of {t * bm} pixels cannot hold whole rows of {width} pixels, "
                            f"and the image's {pixels} pixels in one block do not fit: {why}; use pixels='row'") \
            from None


def _pad_to_blocks(sch: s_tir.Schedule, name: str, g: GemmAnalysis, block: tuple[int, int, int]) -> tuple[int, bool]:
    """Pad M, N and K to whole blocks of ``block`` elements (``pad_einsum``); returns the MACs
    the device then executes and whether anything was padded."""
    target = dict(zip((g.m, g.n, g.k), block))
    padded = [-(-g.extents[v] // target[v]) * target[v] if v in target else g.extents[v] for v in g.order]
    device_macs = 1
    for p in padded:
        device_macs *= p
    if all(p == g.extents[v] for p, v in zip(padded, g.order)):
        return device_macs, False
    sch.pad_einsum(sch.get_sblock(name), padded)
    return device_macs, True


def _reserve(reserved: dict, shape: Extents, t: int, bm: int, bn: int, bk: int, resident: bool) -> None:
    """Add to ``reserved`` what stays allocated for the rest of the function, where the next
    GEMM cannot use it: a resident weight, and buffers no loop of their own holds."""
    acc_copies, k_copies = _copies(shape, bm, bn, bk)
    need = footprint(shape, t, bm, bn, bk, resident)
    for scope, kept in ((ACC, acc_copies == 1), (INP, k_copies == 1), (WGT, resident or k_copies == 1)):
        if kept:
            reserved[scope] = reserved.get(scope, 0) + need[scope]


def _tile_and_stage(sch: s_tir.Schedule, name: str, g: GemmAnalysis, final, out_buffer, t: int,
                    blocks: tuple[int, int, int], resident: bool, temporaries=(), prefix: int = 0) -> None:
    """Step 4: tile to blocks of tiles, stage the operands through INP and WGT at the K loop
    and the accumulator (with the epilogue's operands) through ACC at the N loop, and move
    the zero-init out of the reduction; ``prefix``: the leading steps of a forking epilogue
    that run once (:func:`_annotate_prefix`)."""
    bm, bn, bk = blocks
    gemm = sch.get_sblock(name)
    loops = sch.get_loops(gemm)
    pos = {v: n for n, v in enumerate(g.order)}
    i_o, i_b, i_i = sch.split(loops[pos[g.m]], [None, bm, t])
    j_o, j_b, j_i = sch.split(loops[pos[g.n]], [None, bn, t])
    k_o, k_b, k_i = sch.split(loops[pos[g.k]], [None, bk, t])
    batch_loops = [loops[pos[b]] for b in g.batch]
    k_outer = [loops[pos[r]] for r in g.k_outer]
    # a GEMM instruction folds the two innermost block loops (the third, if any, loops over it)
    sch.reorder(*batch_loops, i_o, j_o, *k_outer, k_o, i_b, k_b, j_b, i_i, j_i, k_i)
    a_stage = sch.cache_read(gemm, 0, INP)
    b_stage = sch.cache_read(gemm, 1, WGT)
    sch.compute_at(a_stage, k_o)
    if not resident:
        sch.compute_at(b_stage, k_o)
    # else the whole weight stays resident in WGT: one LOAD, reused by every row of tiles
    for stage in (a_stage, b_stage):
        _inline_into_load(sch, stage, g.inline)
    if final is None:
        writeback = sch.cache_write(gemm, 0, ACC)
        sch.reverse_compute_at(writeback, j_o)
    else:
        sch.set_scope(gemm, 0, ACC)
        _place_temporaries(sch, temporaries, j_o, t)
        sch.reverse_compute_at(final, j_o)
        if g.row_width is not None and g.row_width < t * bm:
            # rows of the block are pixels of whole image rows: stored one image row at a time
            sch.split(sch.get_loops(final)[-2], [None, g.row_width])
        _stage_epilogue_operands(sch, gemm, final, out_buffer, j_o, t, g.operand_layout, temporaries)
        _annotate_prefix(sch, gemm, temporaries, final, prefix)
    sch.decompose_reduction(gemm, k_outer[0] if k_outer else k_o)


def _shared_prefix(sch, final, steps, out_buffer, temporaries) -> int:
    """How many leading steps the epilogue ``final`` (its ALU ``steps``) and its temporary
    apply alike (the same operation, immediate and operand buffer): the steps before its
    fork, which :data:`FORKS` ``"once"`` runs once. 0 without a temporary, and with two (a
    three-way fork): where the second is computed, before or after the first, is the
    scheduler's, and the first must run the shared steps before any other reads them."""
    if len(temporaries) != 1 or steps is None:
        return 0
    chains = [steps] + [_temporary_steps(sch.get(b), out_buffer) or [] for b in temporaries]

    def same(a, b) -> bool:
        if (a.op, a.imm, a.table is None, a.operand is None) != (b.op, b.imm, b.table is None, b.operand is None):
            return False
        return a.operand is None or a.operand.source.same_as(b.operand.source)

    n = 0
    # the epilogue keeps a step of its own at least (it reads the temporaries after the fork)
    while n < len(steps) - 1 and all(n < len(c) and same(c[n], steps[n]) for c in chains[1:]):
        n += 1
    return n


def _annotate_prefix(sch: s_tir.Schedule, producer, temporaries, final, prefix: int) -> None:
    """Mark the nests of a forking epilogue whose first ``prefix`` steps run once: every loop
    of the first temporary's nest (:data:`~accel.compiler.rules.PREFIX_IN_PLACE`: it runs them
    in place on the accumulator, then copies it) and of the other nests
    (:data:`~accel.compiler.rules.PREFIX_DONE`: they leave them out), the loops the
    accumulator's ``producer`` (the GEMM or DWMAC block) is not inside; every one, since
    lowering drops a loop of one iteration."""
    if not prefix:
        return
    outer = {sch.get_sref(loop).__chandle__() for loop in sch.get_loops(producer)}
    for n, block in enumerate(list(temporaries) + [final]):
        for loop in sch.get_loops(block):
            if sch.get_sref(loop).__chandle__() not in outer:
                sch.annotate(loop, PREFIX_IN_PLACE if n == 0 else PREFIX_DONE, prefix)


def _place_temporaries(sch: s_tir.Schedule, temporaries, at, t: int) -> None:
    """Compute each temporary of an epilogue in a second ACC region beside the accumulator,
    as large as it, at the loop ``at`` (before the epilogue that reads it): its rows start
    on whole ALU vectors, as the accumulator's do (laid out as the accumulator already: a
    convolution's are made channels-last with it, :func:`accel.compiler.conv.output_channels_last`)."""
    for temp in temporaries:
        sch.set_scope(temp, 0, ACC)
        sch.reverse_compute_at(temp, at)     # after the accumulator, before the epilogue
        ndim = len(sch.get(temp).writes[0].source.shape)
        if ndim >= 2:
            sch.storage_align(temp, 0, ndim - 2, t, 0)


def _inline_into_load(sch: s_tir.Schedule, stage, inline: tuple) -> None:
    """The padding (and a convolution's gather, the producers named in ``inline``) of a
    scratchpad copy ``stage`` becomes part of its LOAD."""
    inlined = True
    while inlined:
        inlined = False
        for producer in sch.get_producers(stage):
            name = sch.get(producer).name_hint
            if name.endswith("_pad") or name in inline:
                sch.compute_inline(producer)
                inlined = True
                break


def _stage_epilogue_operands(sch: s_tir.Schedule, gemm, final, out_buffer, j_o, t: int, operand_layout,
                             temporaries=()) -> None:
    """Stage each operand the epilogue ``final`` reads besides the accumulator (a bias, a
    residual) through ACC at the N loop ``j_o``; a temporary is computed there, in ACC."""
    fblock = sch.get(final)
    acc = sch.get(gemm).writes[0].source
    table = _table(fblock)
    kept = {sch.get(b).writes[0].source.__chandle__(): b for b in temporaries}
    kinds = _epilogue_operands(sch, final, acc, temporaries)
    # the last block's operands, then those a temporary alone reads (it is their first reader)
    sources = [(final, r.source) for r in fblock.reads]
    sources += [(b, r.source) for b in temporaries for r in sch.get(b).reads
                if not any(x.source.same_as(r.source) for x in fblock.reads)]
    staged: set = set()
    for reader, source in sources:
        key = source.__chandle__()
        if source.same_as(acc) or key in kept or key in staged:
            continue        # the accumulator; a temporary, computed in ACC already (:func:`_place_temporaries`)
        staged.add(key)
        if table is not None and source.same_as(table):
            # a LUT's table: loaded into WGT once, before the loops, like a resident weight
            sch.cache_read(final, read_index(sch, final, source), WGT)
            continue
        readers = [b for b in [final, *temporaries] if any(x.source.same_as(source) for x in sch.get(b).reads)]
        stage = sch.cache_read(reader, read_index(sch, reader, source), ACC, consumer_blocks=readers)
        if operand_layout is not None and len(source.shape) == len(out_buffer.shape):
            # an operand in the layout of an NCHW result (a residual, a [1, F, 1, 1]
            # bias) is staged channels-last, like the accumulator it is applied to
            sch.transform_layout(stage, ("write", 0), operand_layout)
        sch.compute_at(stage, j_o)
        ndim = len(sch.get(stage).writes[0].source.shape)
        if not kinds[key] and ndim >= 2:
            # ALU operands are tile-lane vectors: rows of the staged copy start aligned
            # (a bias, along the channels alone, is one row: it stays contiguous)
            sch.storage_align(stage, 0, ndim - 2, t, 0)


def _epilogue(sch, gemm, stop):
    """``(final, steps, out, temporaries)``: the last block ``final`` of the GEMM's pointwise
    consumers (up to the block named ``stop``; None when there is none), the ALU steps the
    epilogue takes, inlined into ``final`` (None when the ALU cannot run it: the blocks are
    then left as they are), the buffer the GEMM writes, and the blocks kept as temporaries.

    The consumers are a chain, or a small DAG that reads the accumulator more than once
    (integerize's precise requantise: ``(acc*H + ((acc*L + c) >> k) + c') >> s``). Then one
    block of each fork is kept as a temporary, computed by ALU steps on a copy of the
    accumulator in a second ACC region: the rest is a chain that reads it as an operand."""
    out = sch.get(gemm).writes[0].source
    chain = pointwise_dag(sch, gemm, stop)
    if not chain:
        return None, None, out, []
    # Tried on a copy first: an epilogue the ALU cannot run stays on the CPU as the separate
    # blocks Relax made. Inlined into one loop, LLVM would see the whole chain and, its int32
    # arithmetic being "no signed wrap", drop a max after a product it takes as non-negative.
    for temporaries in _temporary_choices(sch, gemm, chain):
        if _inline_epilogue(sch.copy(), chain, out, temporaries) is not None:
            return chain[-1], _inline_epilogue(sch, chain, out, temporaries), out, temporaries
    return chain[-1], None, out, []


def _temporary_choices(sch, gemm, chain):
    """The sets of blocks of an epilogue to try as temporaries: none, then (where the
    epilogue forks: reads the accumulator twice) each block that one other block reads."""
    yield []
    if all(len(sch.get_consumers(b)) <= 1 for b in [gemm] + chain[:-1]):
        return
    single = [b for b in chain[:-1] if len(sch.get_consumers(b)) == 1]
    # one temporary per fork in integerize's forms: the precise one forks in two, the
    # round-half-to-even one in three (its parity is the floor plus -2 times the half)
    yield from ([b] for b in single)
    yield from ([a, b] for n, a in enumerate(single) for b in single[n + 1:])


def _inline_epilogue(sch, chain, out, temporaries=()):
    """Inline ``chain`` into its last block, but for the ``temporaries``, into which their
    producers are inlined; the ALU steps of the last block, or None when the ALU cannot run
    it or a temporary (a chain on the accumulator alone, read by one block)."""
    kept = {sch.get(b).name_hint for b in temporaries}
    for blk in chain[:-1]:
        if sch.get(blk).name_hint not in kept:
            sch.compute_inline(blk)
    final = chain[-1]
    _inline_pointwise_producers(sch, final, out, kept)
    wrapping.keep_in_block(sch, final)
    block = sch.get(final)
    if None in _operands(block, out).values():
        return None
    # a temporary's operands (a bias before the fork, an earlier temporary) are staged with
    # the last block's or computed in ACC before it
    read = {r.source.__chandle__() for r in block.reads} | \
        {sch.get(b).writes[0].source.__chandle__() for b in temporaries}
    for temp in temporaries:
        wrapping.keep_in_block(sch, temp)
        # what else it reads is an operand of its own (a per-channel multiplier), staged for
        # it: a buffer no block of the partition computes
        computed = {sch.get(p).writes[0].source.__chandle__() for p in sch.get_producers(temp)}
        if not _temporary_steps(sch.get(temp), out) or None in _operands(sch.get(temp), out).values() or \
                any(r.source.__chandle__() in computed - read for r in sch.get(temp).reads):
            return None
    return _epilogue_steps(block, out)


def _temporary_steps(block, acc_buffer) -> list | None:
    """The ALU steps a temporary ``block`` applies to its copy of the accumulator (a chain on
    the accumulator with int32 operands), or None."""
    if str(block.body.buffer.dtype) != "int32":
        return None
    is_spine = lambda load: load.source.same_as(acc_buffer)  # noqa: E731
    is_operand = lambda load: str(load.source.dtype) == "int32" and not load.source.same_as(acc_buffer)  # noqa: E731
    chain = epilogue_chain(wrapping.strip(block.body.value), is_spine, is_operand)
    return None if chain is None else chain[1]


def _operands(block, acc_buffer) -> dict:
    """For each buffer an epilogue ``block`` reads besides the accumulator: True if it
    varies along the output's last dimension alone (a bias: one ALU vector per block of
    channels, whatever the row), False if along rows too (a residual: staged like the
    accumulator), None if along rows but not along that dimension (the ALU's lanes run
    along it: it cannot combine such an operand)."""
    store = block.body
    last = store.indices[-1]
    one_lane = _const(store.buffer.shape[-1]) == 1      # an output one element wide: any operand is a column
    kinds: dict = {}
    table = _table(block)

    def on_load(load):
        if load.source.same_as(acc_buffer) or (table is not None and load.source.same_as(table)):
            return      # the accumulator, or a LUT's table (staged in WGT, not an ALU operand)
        wide = [e for e, d in zip(load.indices, load.source.shape) if _const(d) > 1]
        along_last = [isinstance(e, tirx.Var) and isinstance(last, tirx.Var) and e.same_as(last) for e in wide]
        kind = all(along_last) if not wide or one_lane or along_last[-1] else None
        key = load.source.__chandle__()
        kinds[key] = None if kinds.get(key, kind) is None or kind is None else kinds.get(key, kind) and kind

    tvm_ffi.structural_walk(store.value, (ir.TensorLoad, on_load))
    return kinds


def _wide_operands(sch, final, acc_buffer, temporaries) -> dict:
    """:func:`_operands` of the epilogue ``final``, and each temporary it does not read (one
    read by another temporary) as a wide one: what ACC holds besides the accumulator."""
    kinds = _epilogue_operands(sch, final, acc_buffer, temporaries)
    for temp in temporaries:
        kinds[sch.get(temp).writes[0].source.__chandle__()] = False
    return kinds


def _epilogue_operands(sch, final, acc_buffer, temporaries) -> dict:
    """:func:`_operands` of the epilogue ``final`` and of its temporaries: a per-channel
    requantise's second multiplier is read by its temporary alone."""
    kinds = _operands(sch.get(final), acc_buffer)
    for temp in temporaries:
        for key, kind in _operands(sch.get(temp), acc_buffer).items():
            kinds.setdefault(key, kind)
    return kinds


def _elements(buffer) -> int:
    size = 1
    for d in buffer.shape:
        size *= _const(d)
    return size


def _inline_pointwise_producers(sch, block_rv, keep, temporaries=frozenset()) -> None:
    """Inline the pointwise producers of an epilogue (a copy or cast of a bias, say) other
    than the GEMM's own output and the epilogue's ``temporaries`` (block names), so that it
    reads their inputs and can be staged in ACC."""
    changed = True
    while changed:
        changed = False
        for producer in sch.get_producers(block_rv):
            blk = sch.get(producer)
            if blk.writes[0].source.same_as(keep) or blk.name_hint in temporaries or \
                    any(int(iv.iter_type) != DATA_PAR for iv in blk.iter_vars):
                continue
            try:
                sch.compute_inline(producer)
            except TVMScheduleError:  # e.g. a producer with other consumers: leave it
                continue
            changed = True
            break


def _epilogue_steps(block, acc_buffer):
    """The ALU steps of an inlined epilogue on the accumulator with int32 operands (an empty
    list for a plain write-back or cast), or None when the ALU cannot do it."""
    value = wrapping.strip(block.body.value)
    out = block.body.buffer
    lookup = table_lookup(value) if str(out.dtype) == "int8" else None
    if lookup is not None:
        value = lookup[1]       # clipped to int8: the ALU clips, then the LUT looks up
    elif str(out.dtype) == "int8":
        if not isinstance(value, tirx.Cast):
            return None
        value = value.value
    elif str(out.dtype) != "int32":
        return None
    is_spine = lambda load: load.source.same_as(acc_buffer)  # noqa: E731
    is_operand = lambda load: str(load.source.dtype) == "int32" and not load.source.same_as(acc_buffer)  # noqa: E731
    chain = epilogue_chain(value, is_spine, is_operand)
    if chain is None:
        return None
    return chain[1] + ([table_step(lookup[0].source)] if lookup is not None else [])


def _table(block):
    """The table buffer an inlined epilogue ``block`` looks its result up in, or None."""
    store = block.body
    if str(store.buffer.dtype) != "int8":
        return None
    lookup = table_lookup(wrapping.strip(store.value))
    return None if lookup is None else lookup[0].source


def _reserve_table(reserved: dict, steps, t: int) -> None:
    """Count the table of an epilogue's LUT step in what WGT keeps for the whole function
    (staged once, before the GEMM's loops)."""
    if steps and any(s.op is None for s in steps):
        reserved[WGT] = reserved.get(WGT, 0) + _MEMORY[WGT].footprint(LUT_ENTRIES, repeated=False,
                                                                     options={"tile": t})


def schedule_partition(func: tirx.PrimFunc, config: Config) -> tirx.PrimFunc:
    """The accel Backend's ``schedule`` hook: one partition's legalized PrimFunc, scheduled,
    with the scheduler's notes for the model report (``tp.SCHEDULE_NOTES``). A function that
    already uses accel's scratchpads is its author's schedule: it is left as it is."""
    if already_scheduled(func):
        return func
    chain = elementwise.schedule_partition(func, config)
    if chain is not None:       # an element-wise chain of int8 tensors (no reduction)
        return chain
    mod, notes = schedule(func, config)
    return mod["main"].with_attr(tp.SCHEDULE_NOTES, notes.to_json())


def already_scheduled(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` allocates any of accel's scratchpads (their declared scopes)."""
    found = []

    def on_var(v):
        if tirx.is_buffer_var(v) and v.scope() in SCOPES:
            found.append(v)

    tvm_ffi.structural_walk(func, (ir.Var, on_var))
    return bool(found)


def describe_epilogue(steps, out_dtype: str, temporaries=()) -> list:
    """What an epilogue's ALU steps do, in words: ``bias``, ``ReLU``, ``clip``, ``requantise``,
    ``saturate to int8``, ``cast to int8`` (the narrowing STORE) or ``table`` (a LUT);
    ``temporaries``: the buffers of the epilogue's temporaries (a step adding one is part of
    a requantise that reads the accumulator twice).

    >>> describe_epilogue([_Step(AluOp.ADD, operand=b), _Step(AluOp.MAX, 0)], "int32")   # doctest: +SKIP
    ['bias', 'ReLU']
    """
    words: list = []

    def say(word):
        if word not in words:
            words.append(word)

    shifts = any(s.op is AluOp.SHR for s in steps)
    narrow = out_dtype == "int8"
    for s in steps:
        if s.op is None:
            say("table")
        elif s.op is AluOp.ADD and s.operand is not None and any(s.operand.source.same_as(b) for b in temporaries):
            say("requantise")
        elif s.op is AluOp.ADD and s.operand is not None:
            # a bias varies along one dimension (the channels); a residual along several
            wide = sum(1 for e in s.operand.source.shape if int(e) > 1)
            say("bias" if wide <= 1 else "residual add")
        elif s.op in (AluOp.MUL, AluOp.SHR) or (s.op is AluOp.ADD and shifts):
            say("requantise")
        elif s.op is AluOp.ADD:
            say("bias")         # a constant one (a bias of one channel, folded into the code)
        elif s.op is AluOp.MAX and s.imm == 0:
            say("ReLU")
        elif narrow and s.op in (AluOp.MIN, AluOp.MAX) and s.imm in (127, -128):
            say("requantise" if shifts else "saturate to int8")
        else:
            say("clip")
    if narrow and not any(w in words for w in ("requantise", "saturate to int8")):
        say("cast to int8")
    return words
