"""A model's intermediate tensors at the same addresses on every call: the storages of its
entry function, planned once per VM instead of once per call.

TVM's static memory planning gives a Relax function's intermediate tensors a few storages
(``R.memory.alloc_storage``, each shared by tensors whose lifetimes do not overlap), but
allocates them on every call, from the VM's pooled allocator: a free list per size, last
in first out, so the same storage comes back at another address on the next calls (a model
whose storages share a size sees them swap). A device runtime that keeps work bound to host
addresses (accel's replayed plans) binds it again whenever they move.

:func:`lift_storages` does for the CPU what TVM's ``RewriteCUDAGraph`` does for CUDA graphs
(whose builtin caching them per VM the CPU runtime lacks): it moves the entry's statically
sized storages into a function of their own, which returns them as a tuple, and the entry
takes that tuple as one more, last, parameter. Whoever runs the model allocates them once
per VM (:class:`~tirpat.model.compiled.CompiledModel` does, one VM per thread) and passes
them on every call; they cost no memory the pool would not have kept anyway. It runs after
the whole of TVM's default Relax pipeline for the CPU (one pass: nothing goes between its
memory planning and the lowering that follows), on the VM's ``R.vm.alloc_storage``. Left
where they are:

- a storage of symbolic size (a dynamic shape): it is allocated per call as before;
- a storage a tensor of the entry's result lives in (its output, or a view of a tensor that
  reaches it: ``R.reshape``), which the caller keeps: its next call must not write there;
- everything of a module that offloads nothing to a backend (the lifting serves the device
  runtimes; a CPU-only model keeps TVM's code as it is).

>>> model = tp.build(mod, "accel, llvm")      # doctest: +SKIP
>>> model._storages                           # doctest: +SKIP
'main_storages'
"""

from __future__ import annotations

import tvm
from tvm import ir, relax, tirx

from .partition import BACKEND_ATTR

__all__ = ["lift_storages"]

_ALLOC_STORAGE = ir.Op.get("relax.vm.alloc_storage")


def lift_storages(entry: str = "main", record=None) -> tvm.transform.Pass:
    """The pass that lifts ``entry``'s statically sized storages out of it (see the module
    docstring), for a module lowered by TVM's default Relax pipeline. The function that
    allocates them is ``<entry>_storages`` (``_`` appended while that name is taken); its
    name goes to ``record.storages`` (a build's :class:`~tirpat.model.pipeline.Record`),
    which stays None when nothing was lifted.

    >>> import numpy as np
    >>> bb = relax.BlockBuilder()
    >>> x = relax.Var("x", relax.TensorType((4,), "int32"))
    >>> with bb.function("main", [x]):
    ...     y = bb.emit(relax.op.add(x, x))
    ...     _ = bb.emit_func_output(relax.op.multiply(y, y))
    >>> lowered = relax.get_pipeline("default")(bb.get())
    >>> lift_storages()(lowered).same_as(lowered)          # nothing offloaded: nothing lifted
    True
    >>> add = lowered.get_global_var("add")
    >>> lowered[add] = lowered[add].with_attr(BACKEND_ATTR, "some_device")
    >>> lifted = lift_storages()(lowered)                  # y's storage; the result's stays
    >>> [p.name for p in lifted["main"].params], lifted["main_storages"].ret_ty
    (['x', 'storages'], T.Tuple(R.Any))
    >>> vm = relax.VirtualMachine(tvm.compile(lifted, "llvm", relax_pipeline=tvm.transform.Sequential([])),
    ...                           tvm.cpu())
    >>> storages = vm["main_storages"]()                   # once
    >>> vm["main"](tvm.runtime.tensor(np.arange(4, dtype="int32")), storages).numpy().tolist()
    [0, 4, 16, 36]
    """
    @tvm.transform.module_pass(opt_level=0, name="tirpat.LiftStorages")
    def lift(mod: ir.IRModule, ctx) -> ir.IRModule:
        names = {gv.name_hint for gv in mod.functions}
        func = mod[entry] if entry in names else None
        if not isinstance(func, relax.Function) or not _offloads(mod):
            return mod
        escaping = _escaping(func)
        lifted = [b for block in func.body.blocks for b in block.bindings
                  if b.var.__chandle__() not in escaping and _static_storage(b.value)]
        if not lifted:
            return mod
        name = f"{entry}_storages"
        while name in names:
            name += "_"
        own = [relax.Var(b.var.name, b.var.ty) for b in lifted]
        kinds = relax.TupleType([v.ty for v in own])
        alloc = relax.Function([], relax.SeqExpr([relax.BindingBlock([relax.VarBinding(v, b.value)
                                                                      for v, b in zip(own, lifted)])],
                                                 relax.Tuple(own)), kinds)
        storages = relax.Var("storages", kinds)
        taken = {b.var.__chandle__(): relax.VarBinding(b.var, relax.TupleGetItem(storages, n))
                 for n, b in enumerate(lifted)}
        blocks = [relax.BindingBlock([taken.get(b.var.__chandle__(), b) for b in block.bindings])
                  for block in func.body.blocks]
        mod = mod.clone()
        mod[entry] = relax.Function([*func.params, storages], relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                                    is_pure=func.is_pure, attrs=func.attrs)
        # allocating is impure: the function is forced pure, as the lowered entry is
        mod[name] = alloc.with_attr("relax.force_pure", True).with_attr("global_symbol", name)
        if record is not None:
            record.storages = name
        return mod

    return lift


def _offloads(mod: ir.IRModule) -> bool:
    """Whether a PrimFunc of ``mod`` is a partition tagged for a backend."""
    return any(isinstance(f, tirx.PrimFunc) and f.attrs is not None and BACKEND_ATTR in f.attrs
               for f in mod.functions.values())


def _static_storage(value) -> bool:
    """Whether ``value`` allocates a storage of a constant size."""
    if not (isinstance(value, relax.Call) and value.op.same_as(_ALLOC_STORAGE)):
        return False
    size = value.args[0]        # a dynamic size is a shape the VM computes (a variable)
    return isinstance(size, relax.ShapeExpr) and all(isinstance(d, tirx.IntImm) for d in size.values) \
        and not relax.analysis.free_vars(value)


def _escaping(func: relax.Function) -> set:
    """The variables of ``func`` (handles) whose values may reach its result: those it
    returns and, backwards, every variable the binding of one of them uses (a returned
    tensor's storage, a returned view's tensor), whatever the binding computes."""
    escaping = {v.__chandle__() for v in relax.analysis.free_vars(func.body.body)}
    for block in reversed(func.body.blocks):
        for binding in reversed(block.bindings):
            if binding.var.__chandle__() in escaping:
                escaping.update(v.__chandle__() for v in relax.analysis.free_vars(binding.value))
    return escaping
