"""Block queries shared by the scheduler and the convolution normaliser.

>>> [sch.get(b).name_hint for b in pointwise_chain(sch, sch.get_sblock("conv"))]   # doctest: +SKIP
['bias', 'relu', 'requant']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from tvm import s_tir, tirx

DATA_PAR, REDUCE = 0, 2     # tirx.IterVar kinds


class ScheduleError(ValueError):
    """The workload cannot be compiled for accel (e.g. dynamic shapes)."""


def read_index(sch: s_tir.Schedule, block_rv, buffer) -> int:
    """The position of ``buffer`` among the reads of the block ``block_rv``.

    >>> read_index(sch, sch.get_sblock("conv2d_nchw"), weight)     # doctest: +SKIP
    1
    """
    block = sch.get(block_rv)
    for n, r in enumerate(block.reads):
        if r.source.same_as(buffer):
            return n
    raise ScheduleError(f"block {block.name_hint} does not read {buffer.name}")


@dataclass(frozen=True)
class GemmAnalysis:
    """A block read as a batched GEMM, ``out[batch.., m, n] += inp[batch.., m, k] * weight[batch.., n, k]``:
    what the scheduler needs to tile it and stage it through the scratchpads.

    Iteration variables are named by key (the handle of the block's iter var, as
    ``iv.var.__chandle__()`` gives it): ``m``, ``n`` and ``k`` the GEMM's dimensions,
    ``batch`` the loops around it, ``k_outer`` further reductions around K (a direct
    convolution's kernel taps), ``extents`` each key's extent and ``order`` the block's
    iter vars in order. ``inp_index`` and ``weight_index`` are the keys that index the
    operands as the block reads them (None: already ``[.., rows, K]``, as a normalised
    convolution reads them); the scheduler transposes an operand whose keys are out of order.

    A normalised convolution (:func:`accel.compiler.conv.normalise`) also sets: ``inline``,
    the producers folded into the INP copy; ``stop``, the block its epilogue ends before;
    ``gather``, how its im2col operand reaches INP (in words, for the report); ``method``
    and ``pixels``, the knob values it used; ``row_width``, the image's width when M runs
    over whole images' pixels; ``operand_layout``, the index map staging an epilogue operand
    in the layout of an NCHW result channels-last.

    >>> g = GemmAnalysis(out=None, inp=None, weight=None, m=1, n=2, k=3, extents={1: 8, 2: 32, 3: 64, 4: 3},
    ...                  order=(4, 1, 2, 3), batch=(4,))
    >>> g.sizes
    (8, 32, 64, 3)
    """

    out: tirx.Buffer
    inp: tirx.Buffer
    weight: tirx.Buffer
    m: int
    n: int
    k: int
    extents: Mapping[int, int]
    order: tuple
    batch: tuple = ()
    k_outer: tuple = ()
    inp_index: tuple | None = None
    weight_index: tuple | None = None
    inline: tuple = ()
    stop: str | None = None
    gather: str = ""
    method: str | None = None
    pixels: str | None = None
    row_width: int | None = None
    operand_layout: Callable | None = field(default=None, compare=False)

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        """``(M, N, K, batch)``: K counts every reduction (the kernel taps too), batch every
        loop around the GEMM."""
        k_all, batch = self.extents[self.k], 1
        for key in self.k_outer:
            k_all *= self.extents[key]
        for key in self.batch:
            batch *= self.extents[key]
        return self.extents[self.m], self.extents[self.n], k_all, batch


def pointwise(block, buffer) -> bool:
    """Whether ``block`` is elementwise (data-parallel iters, one store) and reads ``buffer``
    only at plain iter vars, i.e. one element per output element (a reshape is not).

    >>> pointwise(sch.get(sch.get_sblock("T_relu")), conv_out)     # doctest: +SKIP
    True
    """
    if not isinstance(block.body, tirx.BufferStore) or \
            any(int(iv.iter_type) != DATA_PAR for iv in block.iter_vars):
        return False
    iters = {iv.var.__chandle__() for iv in block.iter_vars}
    for r in block.reads:
        if r.source.same_as(buffer) and not all(
                isinstance(d.min, tirx.Var) and d.min.__chandle__() in iters for d in r.region):
            return False
    return True


def pointwise_chain(sch: s_tir.Schedule, block_rv, stop: str | None = None) -> list:
    """The chain of single pointwise consumers after ``block_rv`` (an epilogue: bias, ReLU,
    requantise, ...), ending before the block named ``stop``.

    >>> pointwise_chain(sch, gemm_rv)       # doctest: +SKIP
    [SBlockRV(bias), SBlockRV(relu)]
    """
    chain, last = [], block_rv
    while True:
        consumers = sch.get_consumers(last)
        if len(consumers) != 1:
            return chain
        block = sch.get(consumers[0])
        if block.name_hint == stop or not pointwise(block, sch.get(last).writes[0].source):
            return chain
        chain.append(consumers[0])
        last = consumers[0]


def pointwise_dag(sch: s_tir.Schedule, block_rv, stop: str | None = None, limit: int = 16) -> list:
    """Like :func:`pointwise_chain`, but where the chain forks (a value read by two pointwise
    blocks, as by the two products of integerize's precise requantise) it goes on through the
    blocks up to the one where every branch joins again, and on after it: the epilogue as a
    small DAG of pointwise blocks, in an order where each block follows its producers. A
    fork that does not join (a branch that leaves the epilogue), or one of more than ``limit``
    blocks, ends it before the fork.

    >>> pointwise_dag(sch, gemm_rv)       # doctest: +SKIP
    [SBlockRV(clamp), SBlockRV(mul_lo), SBlockRV(add_lo), SBlockRV(shr_lo), SBlockRV(mul_hi), ...]
    """
    chain = pointwise_chain(sch, block_rv, stop)
    while True:
        last = chain[-1] if chain else block_rv
        joined = _join(sch, last, stop, limit)
        if joined is None:
            return chain
        chain += joined
        chain += pointwise_chain(sch, joined[-1], stop)


def _join(sch: s_tir.Schedule, fork, stop: str | None, limit: int) -> list | None:
    """The pointwise blocks after ``fork`` (which has several consumers) up to and including
    the first one all of its branches lead to, producers first; None if there is none."""
    g = _Graph(sch)
    name = g.name
    if len(g.consumers(fork)) < 2:
        return None
    inside = {name(fork): fork}
    order: list = []
    frontier = list(g.consumers(fork))
    while frontier and len(order) < limit:
        ready = [rv for rv in frontier if all(name(p) in inside for p in g.producers(rv)
                                              if _in_epilogue(g, p, inside))]
        if not ready:
            return None
        rv = ready[0]
        frontier = [f for f in frontier if name(f) != name(rv)]
        block = g.block(rv)
        if block.name_hint == stop or not all(pointwise(block, g.block(p).writes[0].source)
                                              for p in g.producers(rv) if name(p) in inside):
            return None
        inside[name(rv)] = rv
        order.append(rv)
        # joined: every block inside (the fork too) has all its consumers inside
        if len(frontier) == 0 and all(all(name(c) in inside for c in g.consumers(b))
                                      for b in list(inside.values()) if name(b) != name(rv)):
            return order
        for c in g.consumers(rv):
            if name(c) not in inside and all(name(c) != name(f) for f in frontier):
                frontier.append(c)
    return None


class _Graph:
    """The blocks of ``sch`` (by name), their producers and consumers, each asked of TVM once:
    :func:`_join`'s search asks them of the same blocks again and again (every producer of a
    candidate, back to the GEMM's inputs), and the schedule does not change while it searches."""

    def __init__(self, sch: s_tir.Schedule) -> None:
        self.sch = sch
        # RV handle -> (the RV, kept alive so that its handle is not reused; its block; the name)
        self._rvs: dict = {}
        self._producers: dict = {}      # by block name, as the search tells blocks apart
        self._consumers: dict = {}

    def _of(self, rv) -> tuple:
        found = self._rvs.get(rv.__chandle__())
        if found is None:
            block = self.sch.get(rv)
            found = self._rvs[rv.__chandle__()] = (rv, block, block.name_hint)
        return found

    def name(self, rv) -> str:
        return self._of(rv)[2]

    def block(self, rv):
        return self._of(rv)[1]

    def producers(self, rv) -> list:
        key = self.name(rv)
        if key not in self._producers:
            self._producers[key] = list(self.sch.get_producers(rv))
        return self._producers[key]

    def consumers(self, rv) -> list:
        key = self.name(rv)
        if key not in self._consumers:
            self._consumers[key] = list(self.sch.get_consumers(rv))
        return self._consumers[key]


def _in_epilogue(g: _Graph, producer, inside: dict) -> bool:
    """Whether ``producer`` computes a value of the epilogue (not a bias or a constant
    operand, which comes from outside): it is inside already, or reads a block that is."""
    if g.name(producer) in inside:
        return True
    return any(_in_epilogue(g, p, inside) for p in g.producers(producer))


#: The block annotation of meta_schedule's layout rewriting: Relax's ``SplitLayoutRewritePreproc``
#: moves such a block into a function of its own, which ``FoldConstant`` runs at compile time
#: on a constant weight.
LAYOUT_STAGE = "meta_schedule.layout_rewrite_preproc"


def mark_layout_stage(sch: s_tir.Schedule, stage) -> None:
    """Mark ``stage`` (a root-level block re-laying out a function parameter, made by
    ``cache_read`` + ``transform_layout``) as a layout stage, so that a Relax build
    re-lays out a constant weight once, at compile time, instead of on every call.

    >>> mark_layout_stage(sch, sch.cache_read(gemm, 1, "global"))   # doctest: +SKIP
    """
    block = sch.get(stage)
    params = [p for p in sch.mod["main"].params if tirx.is_buffer_var(p)]
    if len(block.reads) == 1 and any(block.reads[0].source.same_as(p) for p in params):
        sch.annotate(stage, LAYOUT_STAGE, 1)
