"""Running rewriters inside ``tvm.compile``: TVM's TIR pipeline with a rewrite stage.

TVM's default TIR pipeline (``tvm.s_tir.pipeline.default_s_tir_pipeline``) first lowers
schedulable TIR (``T.sblock``) to loop nests over multi-dimensional buffers, then flattens
the buffers and runs the target passes. tirpat's rewrite stage belongs between the two:
after ``LowerOpaqueBlock``, before ``FlattenBuffer``, where loop nests and buffer shapes are
still visible. :func:`tir_pipeline` builds that pipeline with each of TVM's passes run once,
in TVM's order (and with TVM's configuration switches), and the stage at that point;
:func:`register_pipeline` registers one that runs rewriters there. ``tvm.compile`` takes a
TIR pipeline by name only: :func:`registered` gives one compile a pipeline of its own (one
that fills that compile's report, say).

An *early* stage can run rules before block lowering ends: after ``LowerMatchBuffer`` and
``StmtSimplify``, before ``InjectPermutedLayout``, ``InjectSoftwarePipeline``,
``TransformMmaBufferLayout`` and ``LowerOpaqueBlock``. That is where ``Schedule.tensorize``'s
output meets those passes, and the only place for rules on buffers that TVM lowers only once
an intrinsic owns them: ``TransformMmaBufferLayout`` refuses an ``m16n8k8.matrixA/B/C``
buffer accessed by plain loads and stores, and the permuted-layout and software-pipeline
passes rewrite plain accesses (XOR-swizzled indices, versioned buffers) where they leave
an intrinsic's pointer arguments to be rewritten. Early rules see opaque blocks (matched
through, see :mod:`tirpat.tir.canonical`) and thread-bound loops instead of launches; nests
whose buffers were already compacted by ``CompactBufferAllocation`` are matched as they
are then.

>>> tp.register_pipeline("my_npu", rw)                          # doctest: +SKIP
>>> ex = tvm.compile(mod, target="llvm", tir_pipeline="my_npu")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Callable, Iterator, Sequence

import tvm
from tvm import s_tir, tirx

from .lowering import lower_blocks
from .rewrite import Rewriter

#: What :func:`tir_pipeline` returns: the factory ``register_tir_pipeline`` takes.
PipelineFactory = Callable[[], tuple]


def _after_lowering(config, storage_rewrite: bool) -> list:
    """TVM 0.27's default s_tir pipeline from ``FlattenBuffer`` on, as ``config`` selects it
    (``default_s_tir_pipeline`` builds the same list inside a closure, so it cannot be split).
    ``storage_rewrite=False`` leaves ``StorageRewrite`` out, as ``tirx.disable_storage_rewrite`` does."""
    flag = lambda k: bool(config.get(k, False))  # noqa: E731
    passes = [
        tirx.transform.FlattenBuffer(), tirx.transform.BF16ComputeLegalize(), tirx.transform.NarrowDataType(32),
        s_tir.transform.LoopPartition(), tirx.transform.VectorizeLoop(not flag("tirx.disable_vectorize")),
        s_tir.transform.InjectVirtualThread(), s_tir.transform.InjectDoubleBuffer(),
    ]
    if storage_rewrite and not flag("tirx.disable_storage_rewrite"):
        passes.append(tirx.transform.StorageRewrite())
    if flag("tirx.use_async_copy"):
        passes.append(s_tir.transform.LowerAsyncDMA())
    passes += [s_tir.transform.HoistIfThenElse(), tirx.transform.UnrollLoop(),
               s_tir.transform.RenormalizeSplitPattern(), tirx.transform.StmtSimplify(),
               tirx.transform.RemoveNoOp(), s_tir.transform.RewriteUnsafeSelect()]
    if flag("tirx.instrument_bound_checkers"):
        passes.append(s_tir.transform.InstrumentBoundCheckers())
    if flag("tirx.s_tir.ldg32"):
        passes.append(s_tir.transform.InjectPTXLDG32(True))
    if not flag("tirx.disable_cse_tir"):
        passes.append(tirx.transform.CommonSubexprElim())
    if flag("tirx.instrument_lwp"):
        passes.append(s_tir.transform.InstrumentProfileIntrinsics())
    passes += [tirx.transform.FP8ComputeLegalize(), s_tir.transform.VerifyVTCMLimit(),
               s_tir.transform.LowerVtcmAlloc(), tirx.transform.VerifyMemory(), tirx.transform.AnnotateEntryFunc(),
               s_tir.transform.ThreadSync("shared"), s_tir.transform.ThreadSync("shared.dyn"),
               s_tir.transform.ThreadSync("warp"), s_tir.transform.InferFragment(),
               s_tir.transform.LowerThreadAllreduce()]
    if flag("tirx.use_async_copy"):
        passes.append(s_tir.transform.InjectPTXAsyncCopy())
    if flag("tirx.s_tir.ldg32"):
        passes.append(s_tir.transform.InjectPTXLDG32())
    passes += [s_tir.transform.MergeSharedMemoryAllocations(), tirx.transform.SplitHostDevice(),
               tirx.transform.MakePackedAPI(), tirx.transform.FP8StorageLegalize(),
               tirx.transform.BF16StorageLegalize()]
    return passes


def tir_pipeline(stage: tvm.transform.Pass, name: str = "tirpat", *,
                 early: tvm.transform.Pass | None = None) -> PipelineFactory:
    """The factory ``tvm.tirx.compilation_pipeline.register_tir_pipeline`` takes: TVM's default
    TIR pipeline with ``stage`` (a module pass) run once after block lowering, before
    ``FlattenBuffer``. Every other pass is TVM's, run once, in TVM's order, with TVM's
    configuration switches (``tirx.disable_vectorize``, ``tirx.use_async_copy``, ...) and
    TVM's host and device finalisation. ``early`` (a module pass, optional) runs at the early
    point (see the module docstring): before ``InjectPermutedLayout``.

    When the stage hands a buffer the function allocates to a packed call (a scratchpad
    filled by a DMA call, say), ``StorageRewrite`` is left out: it cannot see what the call
    does with the buffer and would let two such allocations share memory.

    >>> import tvm
    >>> factory = tp.tir_pipeline(tvm.tirx.transform.RemoveNoOp())
    >>> tvm.tirx.compilation_pipeline.register_tir_pipeline("doc.noop", factory)
    >>> from tvm.script import tirx as T
    >>> @T.prim_func
    ... def double(A: T.Buffer((4,), "float32")):
    ...     for i in range(4):
    ...         A[i] = A[i] * T.float32(2)
    >>> ex = tvm.compile(tvm.IRModule({"main": double}), target="llvm", tir_pipeline="doc.noop")
    >>> a = tvm.runtime.tensor(np.arange(4, dtype="float32")); ex["main"](a); a.numpy()
    array([0., 2., 4., 6.], dtype=float32)
    """
    if not isinstance(stage, tvm.transform.Pass):
        raise TypeError(f"tir_pipeline: stage must be a tvm.transform.Pass, got {type(stage).__name__}")
    if early is not None and not isinstance(early, tvm.transform.Pass):
        raise TypeError(f"tir_pipeline: early must be a tvm.transform.Pass, got {type(early).__name__}")

    def factory():
        @tvm.transform.module_pass(opt_level=0, name=f"{name}.pipeline")
        def pipeline(mod, ctx):
            if early is None:
                mod = _lower_or_explain(mod)
            else:
                mod = lower_blocks("early")(mod)
                mod = early(mod)
                mod = lower_blocks("late")(mod)
            mod = stage(mod)
            return tvm.transform.Sequential(_after_lowering(ctx.config, not _hands_out_allocations(mod)))(mod)

        return pipeline, s_tir.pipeline.finalize_host_passes, s_tir.pipeline.finalize_device_passes

    return factory


def _lower_or_explain(mod):
    """TVM's block lowering; when it fails, the error also says where rules could run instead."""
    try:
        return lower_blocks()(mod)
    except Exception as err:  # noqa: BLE001 - re-raised, with a note
        note = ("tirpat: TVM's block lowering failed before the rewrite stage, so no rule ran. Rules that make "
                "a function lowerable (intrinsics on buffers in scopes TVM lowers only when an intrinsic "
                "accesses them, such as m16n8k8.matrixA/B/C) belong in the early stage: "
                "tp.register_pipeline(name, rules, early=[...]).")
        try:
            again = type(err)(f"{str(err).strip()}\n{note}")
        except Exception:  # noqa: BLE001 - an error type that takes other arguments
            again = RuntimeError(f"{str(err).strip()}\n{note}")
        raise again from err


def register_pipeline(name: str, rewriters, *, after: Sequence[tvm.transform.Pass] = (), early=()) -> None:
    """Register a TIR pipeline ``name`` that runs ``rewriters`` after block lowering.

    ``rewriters`` is a Rewriter (or a list of them, applied in order); ``after`` are extra
    passes run right after them, still before flattening (a vendor's planning passes).
    ``early`` are Rewriters run at the early point, before TVM's layout and software-pipeline
    passes (for intrinsics on ``m16n8k8.matrix*`` buffers, say). The rest is TVM's default
    pipeline (see :func:`tir_pipeline`).

    >>> tp.register_pipeline("my_npu", rw)                          # doctest: +SKIP
    >>> tvm.compile(mod, target="llvm", tir_pipeline="my_npu")     # doctest: +SKIP
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_pipeline: name must be a non-empty string, got {name!r}")
    if name in _BUILTIN and name not in _OURS:
        raise ValueError(f"register_pipeline: {name!r} is one of TVM's own pipelines; pick another name")
    if isinstance(after, tvm.transform.Pass):
        after = [after]
    rws = [rewriters] if isinstance(rewriters, Rewriter) else list(rewriters)
    early_rws = [early] if isinstance(early, Rewriter) else list(early)
    for rw in rws + early_rws:
        if not isinstance(rw, Rewriter):
            raise TypeError(f"register_pipeline: expected Rewriter objects, got {type(rw).__name__}")
    for p in after:
        if not isinstance(p, tvm.transform.Pass):
            raise TypeError(f"register_pipeline: 'after' takes tvm.transform.Pass objects, got {p!r}")
    stage = tvm.transform.Sequential([rw.as_pass(f"tirpat.{name}.{n}") for n, rw in enumerate(rws)] + list(after),
                                     name=f"tirpat.{name}")
    early_stage = None
    if early_rws:
        early_stage = tvm.transform.Sequential([rw.as_pass(f"tirpat.{name}.early{n}") for n, rw in enumerate(early_rws)],
                                               name=f"tirpat.{name}.early")
    tvm.tirx.compilation_pipeline.register_tir_pipeline(name, tir_pipeline(stage, f"tirpat.{name}", early=early_stage))
    _OURS.add(name)


@contextlib.contextmanager
def registered(factory: PipelineFactory, name: str = "tirpat.scoped") -> Iterator[str]:
    """While inside, ``factory`` (from :func:`tir_pipeline`) is a registered TIR pipeline under
    a fresh name (``name`` and a unique suffix), which it yields; on exit it is unregistered.
    How a compile's own context reaches its passes (a report to fill, a build's record):
    ``tvm.compile`` takes a TIR pipeline by name only, so a pass cannot be handed it otherwise.

    >>> A = tvm.te.placeholder((8,), "int8", name="A")
    >>> func = tvm.te.create_prim_func([A, tvm.te.compute((8,), lambda i: A[i], name="B")])
    >>> rw = tp.Rewriter.from_pattern(tp.is_copy(), lambda m: tvm.tirx.Evaluate(0), name="copy")   # drops copies
    >>> mine = tp.Report()
    >>> with tp.registered(tp.tir_pipeline(rw.as_pass(report=mine))) as pipeline:
    ...     ex = tvm.compile(tvm.IRModule({"main": func}), target="llvm", tir_pipeline=pipeline)
    >>> mine.counts, pipeline in tvm.tirx.compilation_pipeline.PIPELINE_MAP
    ({'copy': 1}, False)
    """
    unique = f"{name}.{uuid.uuid4().hex}"
    tvm.tirx.compilation_pipeline.register_tir_pipeline(unique, factory)
    try:
        yield unique
    finally:
        # TVM has no unregister: its registry is this dict
        tvm.tirx.compilation_pipeline.PIPELINE_MAP.pop(unique, None)


_BUILTIN = frozenset(tvm.tirx.compilation_pipeline.PIPELINE_MAP)
_OURS: set = set()


def _hands_out_allocations(mod) -> bool:
    """True when a packed call receives (a pointer into) a buffer the function allocates."""
    import tvm_ffi
    from tvm import ir

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
