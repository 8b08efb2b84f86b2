"""Block queries shared by the scheduler and the convolution normaliser.

>>> [sch.get(b).name_hint for b in pointwise_chain(sch, sch.get_sblock("conv"))]   # doctest: +SKIP
['bias', 'relu', 'requant']
"""

from __future__ import annotations

from tvm import s_tir, tirx

DATA_PAR, REDUCE = 0, 2     # tirx.IterVar kinds


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
