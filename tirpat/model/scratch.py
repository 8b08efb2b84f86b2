"""A partition's own scratch buffers planned by Relax, as outputs of its call, so that they
stay at the same addresses from call to call.

A scheduled partition allocates buffers of its own in host memory: a layout copy of an
input, a padded or im2col input, its output before the layout is copied back (a schedule's
``cache_read``/``cache_write`` in scope ``global``). TVM lowers such an allocation to
``TVMBackendAllocWorkspace``, a per-thread pool that hands pages of equal size out in
rotating order: the same buffer comes back at another address on later calls, and a device
runtime that keeps work bound to host addresses (accel's replayed plans) binds it again.

:func:`scratch_params` makes them parameters of the scheduled PrimFunc, after its outputs;
:func:`scratch_outputs` makes each ``call_tir`` of such a function allocate them as more
outputs (the call returns a tuple; the call's users take the real outputs from it). Relax's
memory planning then gives them storages, shared with other tensors where lifetimes allow
(a scratch buffer is dead once its call returns), and
:func:`~tirpat.model.storages.lift_storages` allocates those once per VM: the same
addresses on every call, one set per thread. Left as allocations: a buffer of symbolic
size, one allocated below the function's root block (inside a loop, which may run in
parallel), one in another scope (a device's memory), one nothing reads (dead stores, which
TVM's lowering drops), the output of a weight layout stage (:mod:`tirpat.model.prepack`
makes that a parameter itself), and every buffer of a function with a parameter that is not
a buffer.

>>> model = tp.build(mod, "accel, llvm")       # doctest: +SKIP
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, relax, s_tir, tirx

from .prepack import layout_stages

__all__ = ["scratch_params", "scratch_outputs"]

_CALL_TIR = ir.Op.get("relax.call_tir")


def scratch_params(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a scheduled PrimFunc, in block form) with the host buffers of constant size
    that its root block allocates (in its ``alloc_buffers`` or by a statement of its body's
    top level) as parameters after its own (see the module docstring); ``func`` itself when
    it has none, or has a parameter that is not a buffer.

    >>> from tvm import te
    >>> a = te.placeholder((4,), "int32", name="a")
    >>> t = te.compute((4,), lambda i: a[i] + a[i], name="t")
    >>> func = te.create_prim_func([a, te.compute((4,), lambda i: t[i] * 2, name="b")])
    >>> [p.name for p in scratch_params(func).params]
    ['a', 'b', 't']
    """
    realize = func.body
    if not isinstance(realize, s_tir.SBlockRealize) or not all(tirx.is_buffer_var(p) for p in func.params):
        return func
    root = realize.block
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    staged = {w.source.__chandle__() for stage in layout_stages(root.body) for w in stage.writes}
    read: set = set()
    tvm_ffi.structural_walk(root.body, (ir.TensorLoad, lambda load: read.add(load.source.__chandle__())))

    def scratch(buf) -> bool:
        # a buffer nothing reads stays: its stores are dead, and TVM's lowering drops them
        # (as an output, the work that feeds it would be kept)
        return buf.scope() in ("", "global") and all(isinstance(d, tirx.IntImm) for d in buf.shape) \
            and buf.__chandle__() not in staged and buf.__chandle__() in read

    moved = [b for b in root.alloc_buffers if scratch(b)]
    moved += [s.buffer for s in stmts if isinstance(s, tirx.AllocBuffer) and scratch(s.buffer)]
    if not moved:
        return func
    gone = {b.__chandle__() for b in moved}
    kept = [s for s in stmts if not (isinstance(s, tirx.AllocBuffer) and s.buffer.__chandle__() in gone)]
    block = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                         kept[0] if len(kept) == 1 else tirx.SeqStmt(kept), root.init,
                         [b for b in root.alloc_buffers if b.__chandle__() not in gone], root.match_buffers,
                         root.annotations)
    return tirx.PrimFunc([*func.params, *moved], s_tir.SBlockRealize(realize.iter_values, realize.predicate, block),
                         func.ret_type, func.attrs)


def scratch_outputs(mod: ir.IRModule, functions) -> ir.IRModule:
    """``mod`` with each ``call_tir`` of the PrimFuncs named in ``functions`` passing the
    parameters :func:`scratch_params` added (those after the call's inputs and outputs) as
    more outputs: the call returns a tuple, from which its binding takes what it returned
    before. Each of those PrimFuncs gets a new GlobalVar of the same name, typed with its
    parameters (a GlobalVar's type is its function's when it was added).

    >>> from tvm import te
    >>> a = te.placeholder((4,), "int32", name="a")
    >>> t = te.compute((4,), lambda i: a[i] + a[i], name="t")
    >>> func = te.create_prim_func([a, te.compute((4,), lambda i: t[i] * 2, name="b")])
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((4,), "int32"))
    >>> with bb.function("main", [x]):
    ...     y = bb.emit(relax.call_tir(bb.add_func(func, "double"), [x], relax.TensorType((4,), "int32")))
    ...     _ = bb.emit_func_output(y)
    >>> mod = bb.get()
    >>> mod["double"] = scratch_params(func)
    >>> print(scratch_outputs(mod, ["double"])["main"].script())   # doctest: +ELLIPSIS
    # from tvm.script import relax as R
    ...
        gv = R.call_tir(double, (x,), out_ty=[R.Tensor((4,), dtype="int32"), R.Tensor((4,), dtype="int32")])
        gv_1: R.Tensor((4,), dtype="int32") = gv[0]
        return gv_1
    """
    names = list(dict.fromkeys(functions))       # in their order, so that builds are alike
    if not names:
        return mod
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    mod = mod.clone()
    widened = {}
    for name in names:
        gv = mod.get_global_var(name)
        widened[name] = mod[gv]
        del mod[gv]
    builder = relax.BlockBuilder(mod)
    fresh = {name: builder.add_func(func, name) for name, func in widened.items()}
    mod = builder.get()

    def with_scratch(call, _):
        gv = call.args[0]
        # rewrite_call runs to a fixed point: a call already repointed is left alone
        if not call.op.same_as(_CALL_TIR) or gv.name_hint not in fresh or gv.same_as(fresh[gv.name_hint]):
            return call
        (out,) = call.ty_args
        outs = list(out.fields) if isinstance(out, relax.TupleType) else [out]
        extra = widened[gv.name_hint].params[len(call.args[1].fields) + len(outs):]
        scratch = [relax.TensorType([int(d) for d in b.shape], str(b.dtype)) for b in extra]
        both = relax.Call(call.op, [fresh[gv.name_hint], *call.args[1:]], call.attrs,
                          [relax.TupleType(outs + scratch)])
        if isinstance(out, relax.TupleType):
            return relax.Tuple([relax.TupleGetItem(both, n) for n in range(len(outs))])
        return relax.TupleGetItem(both, 0)

    pattern = is_op("relax.call_tir")(wildcard(), wildcard())
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = rewrite_call(pattern, with_scratch, func)
    return mod
