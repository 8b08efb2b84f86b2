"""The CPU loops of an offloaded partition that compute per element, moved into functions of
their own that the host's code takes, so that LLVM optimises them (-O3) while the rest of the
partition stays at -O0.

An offloaded partition is compiled apart at -O0 (:mod:`tirpat.model.native`): its code is
mostly calls of the device runtime, which LLVM's optimiser takes seconds over for nothing.
But it also keeps loops that run on the CPU at every call: the zero padding of an input, the
im2col gather of a convolution whose few input channels the device would pad, layout copies.
A copy that :mod:`tirpat.model.host_loops` ordered runs as fast at -O0 as at -O3 (a 55,296
element transpose: 25 and 31 us); a nest that tests a bound and computes an address for each
element does not (zero padding of the same size: 76 us at -O0, 43 at -O3). Compiling whole
partitions at -O2 would cost ~10x their -O0 time (``ppocrv5_cls``: 3.6 s, not 0.3 s, nearly
all of it the runtime calls).

:func:`outline_cpu_loops` takes each large nest that computes more than a copy out of its
partition into a PrimFunc of its own (its buffers as parameters), called where the nest was,
directly by its symbol (``tvm_call_cpacked``): the PrimFunc stays in the host module, whose
code TVM compiles at -O3. The call is resolved when the model's library is linked
(:func:`tirpat.model.native.link`), so the pass runs only for a model that will be (a
JIT-compiled module cannot call into another). Only where the work is done changes: the
nest's statements are the same, on the same memory, in the same order.

``ppocrv5_cls``: 12 nests, a steady call 0.93 ms (6.5%) less CPU; ``ppocrv6_rec_small``: 17
nests, 1.2 ms less; its build ~0.2 s more (LLVM at -O3 on the nests at the link, less at -O0).

>>> mod = outline_cpu_loops(lambda func: True)(mod)     # doctest: +SKIP
"""

from __future__ import annotations

from typing import Callable

import tvm
import tvm_ffi
from tvm import ir, tirx

__all__ = ["outline_cpu_loops", "MIN_ELEMENTS", "SYMBOL_PREFIX"]

#: The fewest stores (the product of a nest's loop extents, vector lanes included) worth a call
#: and a function for LLVM to optimise: each outlined nest costs ~20-30 ms of -O3 at build time
#: and ~0.5 us a call (its arguments packed); a padding nest saves ~0.6 ns a store.
MIN_ELEMENTS = 4096
#: The prefix of the symbol under which TVM's code generator exports a PrimFunc's packed entry
#: (``__tvm_ffi_<global_symbol>``): what ``tvm_call_cpacked`` calls.
SYMBOL_PREFIX = "__tvm_ffi_"
#: TVM's ``CallEffectKind``: calls at most this (``kPure``) compute a value and nothing else.
_PURE = 1


def outline_cpu_loops(select: Callable[[tirx.PrimFunc], bool], min_elements: int = MIN_ELEMENTS) -> tvm.transform.Pass:
    """A module pass (lowered TIR, buffers not yet flattened): in each PrimFunc ``select``
    accepts, each outermost loop nest that computes on the CPU alone (no call but pure
    arithmetic; no variable from outside but buffers of host memory), computes more than a copy
    (some stored value is not an element of another buffer, cast or not) and stores at least
    ``min_elements`` times becomes a call of a new PrimFunc, ``<symbol>_cpu<k>``, that runs it.

    >>> from tvm.script import tirx as T
    >>> @T.prim_func
    ... def part(x: T.Buffer((64, 64), "int8"), y: T.Buffer((66, 66), "int8")):
    ...     T.func_attr({"global_symbol": "part"})
    ...     for i, j in T.grid(66, 66):
    ...         y[i, j] = T.if_then_else(1 <= i and i < 65 and 1 <= j and j < 65, x[i - 1, j - 1], T.int8(0))
    >>> mod = outline_cpu_loops(lambda func: True)(tvm.IRModule({"part": part}))
    >>> sorted(gv.name_hint for gv in mod.functions)
    ['part', 'part_cpu0']
    >>> mod["part"].body.value.args[0].value
    '__tvm_ffi_part_cpu0'
    """
    @tvm.transform.module_pass(opt_level=0, name="tirpat.OutlineCPULoops")
    def run(mod: ir.IRModule, ctx) -> ir.IRModule:
        # name -> callee. One function a call: TVM's code generator declares the callee anew at
        # each tvm_call_cpacked, and LLVM renames a second declaration of one symbol (f.1, f.2)
        added = {}
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc) and select(func):
                symbol = str((func.attrs or {}).get("global_symbol", gv.name_hint))
                body = _outlined(func, symbol, min_elements, added)
                if not body.same_as(func.body):
                    mod[gv] = func.with_body(body)
        for name, func in added.items():
            mod[ir.GlobalVar(name)] = func.with_attr("global_symbol", name)
        return mod

    return run


def _outlined(func: tirx.PrimFunc, symbol: str, min_elements: int, added: dict):
    """``func``'s body with its CPU nests replaced by calls of new functions, added to ``added``."""
    keep = {}
    attrs = func.attrs or {}
    for key in ("target", "tirx.noalias"):      # the partition's target; its buffers do not alias
        if key in attrs:
            keep[key] = attrs[key]

    def on_for(node, mutator):
        buffers = _cpu_nest(node, min_elements)
        if buffers is None:
            return mutator.default_mutate(node)
        # the callee's own buffer variables: a variable is defined by one function only
        fresh = {b: ir.Var(b.name, b.ty) for b in buffers}
        callee = tirx.PrimFunc([fresh[b] for b in buffers], tvm_ffi.structural_map(node, (ir.Var, lambda v: fresh.get(v, v))))
        for key, value in keep.items():
            callee = callee.with_attr(key, value)
        name = f"{symbol}_cpu{len(added)}"
        added[name] = callee
        return tirx.Evaluate(tirx.call_cpacked(SYMBOL_PREFIX + name, *buffers))

    return tvm_ffi.structural_mutate(func.body, (tirx.For, on_for))


def _cpu_nest(nest: tirx.For, min_elements: int):
    """The buffers ``nest`` uses, in the order it first names them, when it is a CPU nest to
    outline (see :func:`outline_cpu_loops`); else None."""
    elements, inner = 1, nest
    while isinstance(inner, tirx.For):
        if not isinstance(inner.extent, tirx.IntImm):
            return None
        elements *= int(inner.extent.value)
        inner = inner.body
    if elements < min_elements:
        return None
    stores, effects = [], []

    def look(node):
        if isinstance(node, ir.Call) and not _pure(node.op):
            effects.append(node)
            return tvm_ffi.VisitInterrupt(node)
        if isinstance(node, tirx.BufferStore):
            stores.append(node)
        return None

    tvm_ffi.structural_walk(nest, look)
    if effects or all(_copied(store.value) for store in stores):
        return None
    free = tirx.analysis.undefined_vars(nest)
    if not free or not all(tirx.is_buffer_var(v) and v.ty.storage_scope in ("", "global") for v in free):
        return None
    return free


def _copied(value) -> bool:
    """Whether ``value`` is an element of another buffer as it is, or cast: a copy, which
    :mod:`tirpat.model.host_loops` orders and vectorises, and which then runs as fast at -O0
    as at -O3 (a 55,296-element transpose: 25 us and 31 us), so not worth its -O3 build time."""
    while isinstance(value, tirx.Cast):
        value = value.value
    return isinstance(value, ir.TensorLoad)


def _pure(op) -> bool:
    """Whether a call of ``op`` only computes a value (TVM's effect kind at most ``kPure``)."""
    if not isinstance(op, ir.Op):
        return False
    effect = op.get_attr("TCallEffectKind")
    return effect is not None and int(effect) <= _PURE
