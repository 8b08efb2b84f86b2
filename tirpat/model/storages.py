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
sized storages into a function of their own, with the tensors the entry makes on them at
constant places (one per place), which returns those tensors (and any storage the entry
still uses otherwise) as a tuple; the entry takes them as its last parameters, one each.
Whoever runs the model allocates them once per VM (:class:`~tirpat.model.compiled.CompiledModel`
does, one VM per thread) and passes them on every call; they cost no memory the pool would
not have kept anyway. What the entry did per tensor goes with it: a VM instruction to make
it (a tensor object allocated), one to kill it after its last use, the tuples of a
partition's outputs that only name them (ppocr_v2_cls: 574 VM instructions a call, 94
after; its host share of a steady call ~9% less). It runs after
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
import tvm_ffi
from tvm import ir, relax, tirx

from .partition import BACKEND_ATTR

__all__ = ["lift_storages"]

_ALLOC_STORAGE = ir.Op.get("relax.vm.alloc_storage")
_ALLOC_TENSOR = ir.Op.get("relax.vm.alloc_tensor")
_KILL = ir.Op.get("relax.vm.kill_object")


def lift_storages(entry: str = "main", record=None) -> tvm.transform.Pass:
    """The pass that lifts ``entry``'s statically sized storages, and the tensors it makes on
    them at constant places, out of it (see the module docstring), for a module lowered by TVM's default Relax pipeline. The function that
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
    >>> [p.name for p in lifted["main"].params], lifted["main_storages"].ret_ty    # y, made on it
    (['x', 'alloc'], T.Tuple(R.Tensor((T.int64(4),), dtype="int32")))
    >>> vm = relax.VirtualMachine(tvm.compile(lifted, "llvm", relax_pipeline=tvm.transform.Sequential([])),
    ...                           tvm.cpu())
    >>> storages = vm["main_storages"]()                   # once
    >>> vm["main"](tvm.runtime.tensor(np.arange(4, dtype="int32")), *storages).numpy().tolist()
    [0, 4, 16, 36]
    """
    @tvm.transform.module_pass(opt_level=0, name="tirpat.LiftStorages")
    def lift(mod: ir.IRModule, ctx) -> ir.IRModule:
        names = {gv.name_hint for gv in mod.functions}
        func = mod[entry] if entry in names else None
        if not isinstance(func, relax.Function) or not _offloads(mod):
            return mod
        escaping = _escaping(func)
        bindings = [b for block in func.body.blocks for b in block.bindings]
        storages = {b.var.__chandle__(): b for b in bindings
                    if b.var.__chandle__() not in escaping and _static_storage(b.value)}
        if not storages:
            return mod
        # the tensors made on them at constant places: one per place, shared by the bindings that make it
        places: dict = {}       # place -> (its binding in the allocating function, its parameter)
        taken: dict = {}        # var handle -> the parameter it becomes (a lifted storage's or tensor's)
        own = {h: relax.Var(b.var.name, b.var.ty) for h, b in storages.items()}
        for b in bindings:
            place = _static_place(b.value, storages)
            if place is not None:
                if place not in places:
                    made = relax.Var(b.var.name, b.var.ty)
                    value = relax.Call(b.value.op, [own[place[0]], *b.value.args[1:]], b.value.attrs, b.value.ty_args)
                    places[place] = (relax.VarBinding(made, value), relax.Var(b.var.name, b.var.ty))
                taken[b.var.__chandle__()] = places[place][1]
        # a lifted storage the entry still uses otherwise (a tensor of a symbolic place) is a parameter too
        used = _uses(bindings, func.body.body, skip=set(taken))
        kept = [h for h in storages if h in used]
        taken.update({h: relax.Var(storages[h].var.name, storages[h].var.ty) for h in kept})
        results = [param for _, param in places.values()] + [taken[h] for h in kept]
        made = [binding.var for binding, _ in places.values()] + [own[h] for h in kept]
        kinds = relax.TupleType([v.ty for v in made])
        alloc = relax.Function([], relax.SeqExpr([relax.BindingBlock(
            [relax.VarBinding(own[h], b.value) for h, b in storages.items()] + [b for b, _ in places.values()])],
            relax.Tuple(made)), kinds)
        dead = {b.var.__chandle__() for b in bindings if _dead_tuple(b, used)}
        gone = set(taken) | set(storages) | dead        # a kill of these goes with them
        blocks = []
        for block in func.body.blocks:
            kept_bindings = []
            for b in block.bindings:
                handle = b.var.__chandle__()
                if not (handle in taken or handle in storages or handle in dead or _kills(b.value, gone)):
                    kept_bindings.append(b)
            blocks.append(relax.BindingBlock(kept_bindings))
        # their uses read the parameters (a binding of one variable to another is a copy in the VM)
        body = tvm_ffi.structural_map(relax.SeqExpr(blocks, func.body.body),
                                      (relax.Var, lambda v: taken.get(v.__chandle__(), v)))
        name = f"{entry}_storages"
        while name in names:
            name += "_"
        mod = mod.clone()
        mod[entry] = relax.Function([*func.params, *results], body, func.ret_ty,
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


def _static_place(value, storages: dict) -> tuple | None:
    """Where ``value``, a tensor made on one of the lifted ``storages`` (by handle) at a
    constant offset, shape and dtype, lies: ``(storage, offset, shape, dtype, device)``;
    else None."""
    if not (isinstance(value, relax.Call) and value.op.same_as(_ALLOC_TENSOR)):
        return None
    storage, offset, shape, dtype, device = value.args
    if not isinstance(storage, relax.Var) or storage.__chandle__() not in storages \
            or len(relax.analysis.free_vars(value)) != 1 or not isinstance(shape, relax.ShapeExpr) \
            or not all(isinstance(d, tirx.IntImm) for d in shape.values):
        return None
    return (storage.__chandle__(), int(offset.value), tuple(int(d) for d in shape.values), str(dtype.value),
            int(device.value))


def _uses(bindings: list, result, skip: set) -> set:
    """The variables (handles) that a binding of ``bindings`` other than a kill, or those of the
    variables ``skip`` names, or ``result`` uses."""
    used = {v.__chandle__() for v in relax.analysis.free_vars(result)}
    for b in bindings:
        if b.var.__chandle__() not in skip and not (isinstance(b.value, relax.Call) and b.value.op.same_as(_KILL)):
            used.update(v.__chandle__() for v in relax.analysis.free_vars(b.value))
    return used


def _kills(value, gone: set) -> bool:
    """Whether ``value`` kills one of the variables ``gone`` names: a dropped one, or one that
    became a parameter, whose register (the parameter's) later bindings of the same place read."""
    return isinstance(value, relax.Call) and value.op.same_as(_KILL) and isinstance(value.args[0], relax.Var) \
        and value.args[0].__chandle__() in gone


def _dead_tuple(binding, used: set) -> bool:
    """Whether ``binding`` makes a tuple nothing uses (a call's outputs, scratch included, of
    which only the tensors are read): one instruction each, for nothing."""
    return isinstance(binding.value, relax.Tuple) and binding.var.__chandle__() not in used
