"""Inlining a replacement's parameters at a site, as ``LowerMatchBuffer`` inlines the
``match_buffer`` of a tensorized block.

A load or store of a buffer parameter becomes one of the bound buffer at the region's base
plus the index (the dropped dimensions fixed at the base), its data pointer the bound
buffer's, and its ``elem_offset`` and stride variables the region's offset and strides
(:func:`tirpat.tir.binding.bind_params` gives them). No buffer view is left behind, so every
later pass (virtual threads, warp memory, storage rewrite, shared-memory layout) sees the
real accesses, as it sees those of ``Schedule.tensorize``'s output. Variables the replacement
defines itself are made fresh at each site.

>>> A, B = tirx.decl_buffer((8,), "int8", "A"), tirx.decl_buffer((4, 8), "int8", "B")
>>> i, o = tirx.Var("i", "int32"), tirx.Var("o", "int32")
>>> store = tirx.BufferStore(A, tirx.IntImm("int8", 0), [i])
>>> out = inline_accesses(store, {key(A): (B, [o, tirx.IntImm("int32", 0)], (1,))})   # A is row o of B
>>> print(out.buffer.name, out.indices)
B (o, i)
"""

from __future__ import annotations

import tvm_ffi
from tvm import ir, tirx

from .analysis import defined_vars, fresh_var, key, rename_defs, substitute, vars_used


class Inliner:
    """A rule's ``replacement`` PrimFunc, checked once (``ValueError`` naming the rule when it
    cannot be inlined), then instantiated at each site by :meth:`at`.

    >>> A, i = tirx.decl_buffer((8,), "int8", "A"), tirx.Var("i", "int32")
    >>> store = tirx.BufferStore(A, tirx.IntImm("int8", 0), [i])
    >>> zero = tirx.PrimFunc([A], tirx.For(i, 0, 8, tirx.ForKind.SERIAL, store))
    >>> Inliner(zero, "zero").body_defs      # made fresh at each site
    [i]
    >>> Inliner(zero.with_body(tirx.Evaluate(tirx.Var("n", "int32"))), "bad")
    Traceback (most recent call last):
      ...
    ValueError: rule 'bad': the replacement is ill-formed: ...
    """

    def __init__(self, func: tirx.PrimFunc, rule: str):
        self.func = func
        # variables the replacement body defines itself (loops, Binds, ...): fresh ones per site
        self.body_defs = defined_vars(func.body)
        self._check(func, rule)

    def at(self, params: list, scalars: list):
        """The replacement's body at one site: ``params`` as :func:`~tirpat.tir.binding.bind_params`
        gives them, ``scalars`` the ``(replacement parameter, value)`` of each scalar parameter."""
        pairs, regions = [], {}
        for q, target, strides, offset, base, dims, info in params:
            regions[key(q)] = (target, base, dims)
            pairs.append((q, target))  # what is left of q after the accesses: its data pointer
            for d, var in info.stride_vars:
                pairs.append((var, strides[d]))
            if info.offset_var is not None:
                pairs.append((info.offset_var, offset))
        pairs.extend(scalars)
        body = self.func.body
        if self.accesses_params:
            body = inline_accesses(body, regions)
        # Only uses to replace: parameters are never defined inside the body.
        body = substitute(body, pairs)
        if self.body_defs:
            body = rename_defs(body, {key(v): fresh_var(v) for v in self.body_defs})
        return body

    def _check(self, func, rule: str) -> None:
        """What makes every instance well-formed, checked once here instead of per site: the
        replacement is a well-formed function using nothing but its parameters, and its buffer
        parameters only in forms that inline."""
        try:
            tirx.analysis.verify_well_formed(func, assert_mode=True)
        except Exception as err:  # noqa: BLE001 - the verifier reports through exceptions
            raise ValueError(f"rule {rule!r}: the replacement is ill-formed: "
                             f"{str(err).strip().splitlines()[-1]}") from None
        allowed = {key(v) for v in self.body_defs}
        for q in func.params:
            allowed.add(key(q))
            if tirx.is_buffer_var(q):
                for v in [q.data, q.elem_offset, *q.shape, *q.strides]:
                    if isinstance(v, tirx.Var):
                        allowed.add(key(v))
        for v in vars_used(func.body):
            if key(v) not in allowed:
                raise ValueError(f"rule {rule!r}: the replacement uses {v.name}, which is not a parameter")
        # A buffer parameter is inlined into the region it binds: its loads and stores, its data
        # pointer, offset and strides. Any other use (the buffer object itself) has no such form.
        params = {key(q): q for q in func.params if tirx.is_buffer_var(q)}
        uses, inlined = {}, {}

        def on_var(v, kind):
            if key(v) in params:
                uses[key(v)] = uses.get(key(v), 0) + 1

        def on_data(call):
            if call.op.name == "tirx.buffer_data" and key(call.args[0]) in params:
                inlined[key(call.args[0])] = inlined.get(key(call.args[0]), 0) + 1

        tvm_ffi.structural_walk(func.body, (ir.Call, on_data), with_def_region_kind=(ir.Var, on_var))
        accesses = param_accesses(func.body, params)
        for node in accesses:
            k = key(node.source if isinstance(node, ir.TensorLoad) else node.buffer)
            inlined[k] = inlined.get(k, 0) + 1
        for k, n in uses.items():
            if inlined.get(k, 0) != n:
                raise ValueError(f"rule {rule!r}: the replacement uses buffer parameter {params[k].name} other "
                                 f"than through loads, stores and its data pointer, so it cannot be bound to a region")
        self.accesses_params = bool(accesses)


def param_accesses(body: tirx.Stmt, params: dict) -> list:
    """The loads and stores of ``body`` whose buffer is one of ``params`` (keyed by ``key``)."""
    found = []

    def on_load(load):
        if key(load.source) in params:
            found.append(load)

    def on_store(store):
        if key(store.buffer) in params:
            found.append(store)

    tvm_ffi.structural_walk(body, [(ir.TensorLoad, on_load), (tirx.BufferStore, on_store)])
    return found


def inline_accesses(body: tirx.Stmt, regions: dict) -> tirx.Stmt:
    """``body`` with each load and store of a bound parameter made one of its target buffer
    at the region's base plus the index, as ``LowerMatchBuffer`` does (``regions`` maps
    ``key(param)`` to ``(target, base, the target dimensions of the parameter's)``)."""

    def at(base, dims, indices):
        out = list(base)
        for d, i in zip(dims, indices):
            b = base[d]
            out[d] = i if type(b) is tirx.IntImm and b.value == 0 else b + i
        return out

    def on_load(load):
        region = regions.get(key(load.source))
        if region is None:
            return load
        target, base, dims = region
        return tirx.BufferLoad(target, at(base, dims, load.indices))

    def on_store(store):
        region = regions.get(key(store.buffer))
        if region is None:
            return store
        target, base, dims = region
        return tirx.BufferStore(target, store.value, at(base, dims, store.indices))

    return tvm_ffi.structural_map(body, [(ir.TensorLoad, on_load), (tirx.BufferStore, on_store)])

