"""Host PrimFuncs with their elementwise steps inlined: one loop nest per fused group, not one per operator.

TVM's default Relax pipeline for a CPU (``relax.get_default_pipeline``) fuses an operator
with the elementwise steps around it (``FuseOps``, ``FuseTIR``) but leaves every step its own
loop nest writing a full intermediate tensor. An integerised model's requantise chains are 20
to 30 such steps (dequantise, multiply, round, clip, shift, cast, ...), and LLVM's optimiser
is superlinear in a function's size: on the PaddleOCR v5 recogniser the host functions took
54 s of LLVM as fused and 6 s with all their steps inlined, and TVM's own
``tvm.compile(mod, "llvm")``, which does not fuse, took 21 s; with the integer steps that
may wrap kept apart (below), ``tp.build`` of it takes 13 s and ``tvm.compile`` 10 s. Inlined
steps also compute without the intermediate tensors.

Inlining moves expressions, never changes them: each step still rounds to its own dtype
(a float product is not contracted with a following add, see
``tests/model/test_host_inline.py``). A step whose signed integer sum, difference, product
or left shift may overflow stays a loop nest of its own, and no step is inlined after it:
llvm's code marks those operations "no signed wrap", and an optimiser that sees the next
operation in the same expression may use that (drop a ``max`` after a product that wraps),
where a step per loop nest, as TVM leaves it, computes in wrapping int32 arithmetic. So the
results equal those of the code left as it was, overflow included
(``tests/model/test_differential_corpus.py``). Small loops that LLVM unrolls can still show it a
chain across loop nests: :mod:`tirpat.tir.wrapping` makes the stored int32 arithmetic wrap there too.

Inlining can also show TVM's simplifier a narrowing cast of a value it proves constant:
``int8(min(max(x, 472153), -139616))`` is ``int8(-139616)``, and TVM 0.27 folds the cast by
making an int8 literal of -139616, which it rejects (``Literal value -139616 exceeds range
of int8``) where llvm truncates to -96. Such casts are folded here first, by truncation.

>>> mod = inline_elementwise()(mod)          # doctest: +SKIP
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import ir, s_tir, sym, tirx

from .partition import BACKEND_ATTR

__all__ = ["inline_elementwise", "inline_function"]


def inline_function(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a PrimFunc in block form) with each elementwise block that writes an
    intermediate buffer inlined into its consumers, and each elementwise block that only
    reads another block's result inlined into that producer where TVM's schedule allows it
    (``compute_inline``, then ``reverse_compute_inline``); a block that cannot be inlined
    stays as it was. A function without blocks is returned as it is.

    >>> from tvm.script import tirx as T
    >>> @T.prim_func(s_tir=True)
    ... def f(a: T.Buffer((8,), "float32"), c: T.Buffer((8,), "float32")):
    ...     b = T.sblock_alloc_buffer((8,), "float32")
    ...     for i in range(8):
    ...         with T.sblock("b"):
    ...             v = T.axis.spatial(8, i)
    ...             b[v] = a[v] * T.float32(2)
    ...     for i in range(8):
    ...         with T.sblock("c"):
    ...             v = T.axis.spatial(8, i)
    ...             c[v] = b[v] + T.float32(1)
    >>> len(inline_function(f).script().split("T.sblock(")) - 1     # one block left (and the root)
    2
    """
    if not isinstance(func, tirx.PrimFunc):
        raise TypeError(f"inline_function takes a PrimFunc, got {type(func).__name__}")
    try:
        sch = s_tir.Schedule(ir.IRModule({"main": func}))
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - no root block: already lowered, nothing to inline
        return func
    # a block that writes a parameter (an output) or reads no other block's result cannot be
    # inlined either way (TVM refuses it), and a refusal costs an error message printing the
    # function: one per output of a split with 25
    outputs = {param.__chandle__() for param in func.params}
    left = []
    for block in blocks:        # producers into their consumers
        if not _elementwise(sch, block) or _may_wrap(sch, block) or _writes(sch, block, outputs):
            left.append(block)
            continue
        try:
            sch.compute_inline(block)
        except Exception:  # noqa: BLE001 - TVM says why not in the exception; the block stays
            left.append(block)
    for block in reversed(left):    # an epilogue into its producer (e.g. the last cast of a chain)
        producers = sch.get_producers(block)
        if not producers or not _elementwise(sch, block) or any(_may_wrap(sch, p) for p in producers):
            continue
        try:
            sch.reverse_compute_inline(block)
        except Exception:  # noqa: BLE001 - as above
            pass
    return _fold_narrowing_casts(sch.mod["main"])


def _fold_narrowing_casts(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each cast to a narrower integer type whose value simplifies to a constant
    outside that type's range replaced by the truncated constant (what llvm's ``trunc``
    computes): TVM's own fold of it fails (see the module docstring)."""
    analyzer = sym.Analyzer()

    def block(node, m):
        for iv in node.iter_vars:      # the simplifier that folds knows the loops' ranges
            analyzer.bind(iv.var, iv.dom)
        return m.default_mutate(node)

    def cast(node, m):
        node = m.default_mutate(node)
        dtype, source = node.ty.dtype, node.value.ty.dtype
        if dtype.lanes != 1 or dtype.bits >= 64 or source.lanes != 1:
            return node
        target, whole = _int_range(dtype), _int_range(source)
        if target is None or whole is None or (target[0] <= whole[0] and whole[1] <= target[1]):
            return node          # a float or a wider type: no constant of it is out of range
        value = analyzer.simplify(node.value)
        if not isinstance(value, tirx.IntImm) or target[0] <= int(value.value) <= target[1]:
            return node          # not a constant, or one TVM folds right
        low, size = target[0], target[1] - target[0] + 1
        return tirx.IntImm(str(dtype), (int(value.value) - low) % size + low)

    body = tvm_ffi.structural_mutate(func.body, [(s_tir.SBlock, block), (tirx.Cast, cast)])
    return func if body.same_as(func.body) else func.with_body(body)


def _int_range(dtype) -> tuple[int, int] | None:
    """The least and greatest value of an integer ``dtype``; None for other types."""
    if dtype.type_code == tvm.DataTypeCode.INT:
        return -(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1
    if dtype.type_code == tvm.DataTypeCode.UINT:
        return 0, (1 << dtype.bits) - 1
    return None


#: the signed integer operations that may overflow (a max, min or right shift cannot)
_WRAPPING = (tirx.Add, tirx.Sub, tirx.Mul, tirx.LShift)


def _may_wrap(sch: s_tir.Schedule, block) -> bool:
    """Whether ``block`` stores the result of a signed integer operation that may overflow
    (indices aside)."""
    found = []

    def look(node):
        if isinstance(node, ir.TensorLoad):
            return tvm_ffi.WalkResult.SKIP         # its indices are addresses
        if isinstance(node, _WRAPPING) and str(node.ty.dtype).startswith("int"):
            found.append(node)
            return tvm_ffi.VisitInterrupt(node)
        return None

    def on_store(store):
        tvm_ffi.structural_walk(store.value, look, order="pre")
        return tvm_ffi.VisitInterrupt(store) if found else None

    tvm_ffi.structural_walk(sch.get(block).body, (tirx.BufferStore, on_store))
    return bool(found)


def _writes(sch: s_tir.Schedule, block, buffers: set) -> bool:
    """Whether ``block`` writes one of ``buffers`` (their handles)."""
    return any(region.source.__chandle__() in buffers for region in sch.get(block).writes)


def _elementwise(sch: s_tir.Schedule, block) -> bool:
    """Whether ``block`` has only spatial iterators and no init (not a reduction)."""
    stmt = sch.get(block)
    return stmt.init is None and all(int(iv.iter_type) == tirx.IterVar.DataPar for iv in stmt.iter_vars)


def inline_elementwise() -> tvm.transform.Pass:
    """A module pass: :func:`inline_function` on every PrimFunc that no backend took (those
    tagged with :data:`~tirpat.model.partition.BACKEND_ATTR` are their backend's) and that no
    schedule has scheduled already (``tirx.is_scheduled``).

    >>> mod = inline_elementwise()(mod)          # doctest: +SKIP
    """
    @tvm.transform.module_pass(opt_level=0, name="tirpat.InlineElementwise")
    def run(mod: ir.IRModule, ctx) -> ir.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            attrs = func.attrs if func.attrs is not None else {}
            if BACKEND_ATTR in attrs or bool(attrs.get("tirx.is_scheduled", False)):
                continue
            done = inline_function(func)
            if not done.same_as(func):
                updates[gv] = done
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    return run
