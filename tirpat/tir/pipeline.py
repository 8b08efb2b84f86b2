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
    if name in _BUILTIN and name not in _OURS:
        raise ValueError(f"register_pipeline: {name!r} is one of TVM's own pipelines; pick another name")
    if isinstance(after, tvm.transform.Pass):
        after = [after]
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
            mod = front(mod)
            if not _hands_out_allocations(mod):
                return inner(mod)
            # StorageRewrite cannot see a buffer passed to a packed call: it would let two
            # such allocations share memory. Keep them apart.
            config = dict(ctx.config)
            config["tirx.disable_storage_rewrite"] = True
            with tvm.transform.PassContext(opt_level=ctx.opt_level, config=config,
                                           required_pass=list(ctx.required_pass),
                                           disabled_pass=list(ctx.disabled_pass)):
                return inner(mod)

        return pipeline, finalize_host, finalize_device

    tvm.tirx.compilation_pipeline.register_tir_pipeline(name, factory)
    _OURS.add(name)


_BUILTIN = frozenset(tvm.tirx.compilation_pipeline.PIPELINE_MAP)
_OURS: set = set()


def _hands_out_allocations(mod) -> bool:
    """True when a packed call receives (a pointer into) a buffer the function allocates."""
    import tvm_ffi
    from tvm import ir, tirx

    for func in mod.functions.values():
        if not isinstance(func, tirx.PrimFunc):
            continue
        allocated = set()
        tvm_ffi.structural_walk(func.body, (tirx.AllocBuffer, lambda a: allocated.add(a.buffer.__chandle__())))
        if not allocated:
            continue
        found = []

        def in_call(c):
            if c.op.name == "tirx.tvm_call_packed":
                def on_var(v):
                    if v.__chandle__() in allocated:
                        found.append(v)
                tvm_ffi.structural_walk(c, (ir.Var, on_var))

        tvm_ffi.structural_walk(func.body, (ir.Call, in_call))
        if found:
            return True
    return False
