"""Running rewriters inside ``tvm.compile``: a registered TIR pipeline.

The rewriters run on lowered TIR, after block lowering and before ``FlattenBuffer``, where
loop nests and multi-dimensional buffers are still visible.

>>> tp.register_pipeline("my_npu", rw)                          # doctest: +SKIP
>>> ex = tvm.compile(mod, target="llvm", tir_pipeline="my_npu")  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Sequence

import tvm
from tvm import s_tir

# TVM's s_tir pipeline up to (not including) FlattenBuffer; rerunning it later is harmless.
_LOWER_PASSES = (
    "CanonicalizeLoop", "LowerCrossThreadReduction", "LowerInitBlock",
    "PlanAndUpdateBufferAllocationLocation", "ConvertBlocksToOpaque", "LiftThreadBinding",
    "ManifestSharedMemoryLocalStage", "CompactBufferAllocation", "LowerAutoCopy",
    "UnifyThreadBinding", "LowerMatchBuffer", "StmtSimplify", "InjectPermutedLayout",
    "AnnotateIrregularLoop", "InjectSoftwarePipeline", "TransformMmaBufferLayout",
    "LowerOpaqueBlock",
)


def lower_blocks() -> tvm.transform.Pass:
    """The passes that turn s_tir (``T.sblock``) into lowered, not yet flattened TIR.

    >>> lowered = tp.lower_blocks()(tvm.IRModule({"main": te.create_prim_func([A, B])}))  # doctest: +SKIP
    """
    return tvm.transform.Sequential([getattr(s_tir.transform, name)() for name in _LOWER_PASSES],
                                    name="tirpat.LowerBlocks")


def lower(obj):
    """Lower a PrimFunc or IRModule to the form rewriters see; a PrimFunc in gives a PrimFunc."""
    from tvm import ir, tirx

    if isinstance(obj, tirx.PrimFunc):
        mod = lower_blocks()(ir.IRModule({"main": obj}))
        return mod["main"]
    if isinstance(obj, ir.IRModule):
        return lower_blocks()(obj)
    raise TypeError(f"lower expects a PrimFunc or an IRModule, got {type(obj).__name__}")


def register_pipeline(name: str, rewriters, *, after: Sequence[tvm.transform.Pass] = ()) -> None:
    """Register a TIR pipeline ``name`` that runs ``rewriters`` after block lowering.

    ``rewriters`` is a Rewriter (or a list of them, applied in order); ``after`` are extra
    passes run right after them, still before flattening (a vendor's planning passes).

    >>> tp.register_pipeline("my_npu", rw)
    >>> tvm.compile(mod, target="llvm", tir_pipeline="my_npu")     # doctest: +SKIP
    """
    from .rewrite import Rewriter

    if not isinstance(name, str) or not name:
        raise TypeError(f"register_pipeline: name must be a non-empty string, got {name!r}")
    rws = [rewriters] if isinstance(rewriters, Rewriter) else list(rewriters)
    for rw in rws:
        if not isinstance(rw, Rewriter):
            raise TypeError(f"register_pipeline: expected Rewriter objects, got {type(rw).__name__}")
    for p in after:
        if not isinstance(p, tvm.transform.Pass):
            raise TypeError(f"register_pipeline: 'after' takes tvm.transform.Pass objects, got {p!r}")

    def factory():
        inner, finalize_host, finalize_device = s_tir.pipeline.default_s_tir_pipeline()
        passes = [lower_blocks()] + [rw.as_pass(f"tirpat.{name}.{n}") for n, rw in enumerate(rws)] + list(after)
        front = tvm.transform.Sequential(passes, name=f"tirpat.{name}")

        @tvm.transform.module_pass(opt_level=0, name=f"tirpat.{name}.pipeline")
        def pipeline(mod, ctx):
            return inner(front(mod))

        return pipeline, finalize_host, finalize_device

    tvm.tirx.compilation_pipeline.register_tir_pipeline(name, factory)
