"""Lowering s_tir (``T.sblock``) functions to the TIR that patterns match: loops and
multi-dimensional buffers, not yet flattened.

>>> A = tvm.te.placeholder((4,), "float32", name="A")
>>> f = tp.lower(tvm.te.create_prim_func([A, tvm.te.compute((4,), lambda i: A[i] + 1.0, name="B")]))
>>> type(f.body).__name__, "T.sblock" in f.script()
('For', False)
"""

from __future__ import annotations

import tvm
from tvm import ir, s_tir, tirx

# TVM 0.27's default s_tir pipeline up to, not including, FlattenBuffer: block lowering.
_LOWER_PASSES = (
    "CanonicalizeLoop", "LowerCrossThreadReduction", "LowerInitBlock",
    "PlanAndUpdateBufferAllocationLocation", "ConvertBlocksToOpaque", "LiftThreadBinding",
    "ManifestSharedMemoryLocalStage", "CompactBufferAllocation", "LowerAutoCopy",
    "UnifyThreadBinding", "LowerMatchBuffer", "StmtSimplify", "InjectPermutedLayout",
    "AnnotateIrregularLoop", "InjectSoftwarePipeline", "TransformMmaBufferLayout",
    "LowerOpaqueBlock",
)


#: The first pass of block lowering after the early rewrite stage (see :mod:`tirpat.tir.pipeline`):
#: from here on TVM rewrites layouts and software pipelines, then removes the blocks.
LATE_LOWERING = "InjectPermutedLayout"


def lower_blocks(part: str = "all") -> tvm.transform.Pass:
    """The passes that turn s_tir (``T.sblock``) into lowered, not yet flattened TIR: TVM's
    default pipeline up to ``FlattenBuffer``. ``part="early"`` gives the passes before
    :data:`LATE_LOWERING`, ``part="late"`` the rest.

    >>> A = tvm.te.placeholder((4,), "float32", name="A")
    >>> mod = tvm.IRModule({"main": tvm.te.create_prim_func([A, tvm.te.compute((4,), lambda i: A[i], name="B")])})
    >>> "sblock" in tp.lower_blocks()(mod).script()
    False
    """
    split = _LOWER_PASSES.index(LATE_LOWERING)
    names = {"all": _LOWER_PASSES, "early": _LOWER_PASSES[:split], "late": _LOWER_PASSES[split:]}.get(part)
    if names is None:
        raise ValueError(f"lower_blocks: part must be 'all', 'early' or 'late', got {part!r}")
    label = "tirpat.LowerBlocks" if part == "all" else f"tirpat.LowerBlocks.{part}"
    return tvm.transform.Sequential([getattr(s_tir.transform, name)() for name in names], name=label)


def lower(obj):
    """Lower a PrimFunc or IRModule to the form rewriters see; a PrimFunc in gives a PrimFunc."""
    if isinstance(obj, tirx.PrimFunc):
        mod = lower_blocks()(ir.IRModule({"main": obj}))
        return mod["main"]
    if isinstance(obj, ir.IRModule):
        return lower_blocks()(obj)
    raise TypeError(f"lower expects a PrimFunc or an IRModule, got {type(obj).__name__}")
