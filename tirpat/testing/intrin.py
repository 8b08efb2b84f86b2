"""TVM's registered TensorIntrins as test material for ``Rewriter.from_module``.

:func:`registered_intrins` lists the TensorIntrins that ``tvm.s_tir.tensor_intrin`` registers
(importing it costs about 40 s, once per process); :func:`tile_target` turns an intrinsic's
``desc`` into a function that computes it on tiles of bigger buffers, which is what a rule
built from the desc/impl pair should find and replace; :func:`tile_escapes` checks that the
rewritten accesses stay inside their tiles.

:func:`replay` runs a schedule written for ``Schedule.tensorize`` twice: once as written, and
once with its ``tensorize`` calls recorded instead of applied (:func:`recorded_tensorize`),
which gives the same schedule without them and, from the calls, the ``from_module`` rules
that should do tensorize's work on it (:func:`rules_for`).

>>> from tirpat.testing.intrin import registered_intrins, tile_target   # doctest: +SKIP
>>> for module, name in registered_intrins():                          # doctest: +SKIP
...     ti = tvm.s_tir.TensorIntrin.get(name)
...     rw = tp.Rewriter.from_module({"pattern": ti.desc, "replacement": ti.impl}, name)
...     rw(tile_target(ti.desc))
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from dataclasses import dataclass, field
from typing import Callable

import tvm_ffi
from tvm import ir, tirx

from ..tir.analysis import const_int, key, simplify, visit_accesses
from ..tir.rewrite import Rewriter
from ..tir.index_dtype import with_index_dtype
from ..tir.lowering import lower

#: The submodules of ``tvm.s_tir.tensor_intrin`` that register intrinsics when imported.
INTRIN_MODULES = ("x86", "arm_cpu", "cuda", "rocm", "metal", "hexagon", "riscv_cpu", "dot_product_common")

_PREFIX = "tvm.s_tir.tensor_intrin."


def registered_intrins(modules=INTRIN_MODULES) -> list:
    """``[(module, name)]`` of every TensorIntrin registered by importing ``modules``.

    ``module`` is the short name of the submodule that registered it (or that holds its name).
    The names are recorded while the modules register them; when they were imported before
    this call, every string constant of the modules that names a registered intrinsic is
    taken instead. Intrinsics registered on demand (riscv's, per target) are not listed.
    """
    from tvm.s_tir import TensorIntrin

    recorded: list = []
    fresh = _PREFIX.rstrip(".") not in sys.modules
    original = TensorIntrin.__dict__["register"]

    def recording(name, desc, impl, override=False):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        recorded.append((caller[len(_PREFIX):] if caller.startswith(_PREFIX) else caller, name))
        return original.__func__(name, desc, impl, override)

    if fresh:
        TensorIntrin.register = staticmethod(recording)
    loaded = []
    try:
        for m in modules:
            try:
                loaded.append((m, importlib.import_module(_PREFIX + m)))
            except ImportError:
                pass
    finally:
        if fresh:
            TensorIntrin.register = original
    seen = {n for _, n in recorded}
    out = list(recorded)
    for m, module in loaded:
        for value in vars(module).values():
            if isinstance(value, str) and value not in seen and TensorIntrin.get(value, allow_missing=True):
                seen.add(value)
                out.append((m, value))
    return out


def tile_target(desc, tiles: int = 2, layout: str = "tiled", name: str = "main", index_dtype: str = "int32"):
    """The lowered ``desc`` run on ``tiles`` tiles of bigger buffers, inside ``for t``.

    Every buffer parameter of shape ``S`` becomes a parameter of the same dtype and scope
    with shape ``tiles*S`` (``layout="tiled"``: the desc's index ``i`` in dimension ``d``
    becomes ``t*S[d] + i``, so a tile is a strided sub-region) or ``(tiles,) + S``
    (``layout="stacked"``: the index gains a leading ``t``, so a tile is a compact
    sub-region one rank down). Scalar parameters stay as they are.

    A symbolic extent (``vscale``) stays symbolic. ``index_dtype="int64"`` gives the same
    program with int64 loops and indices (as Relax emits them). Raises ValueError when the
    desc uses a buffer other than through loads and stores.
    """
    if layout not in ("tiled", "stacked"):
        raise ValueError(f"layout must be 'tiled' or 'stacked', got {layout!r}")
    func = lower(desc)
    t = tirx.Var("t", "int32")
    new_params, bufs = [], {}
    for p in func.params:
        if not tirx.is_buffer_var(p):
            new_params.append(p)
            continue
        shape = [int(s.value) if isinstance(s, tirx.IntImm) else s for s in p.shape]
        big = [tiles * s for s in shape] if layout == "tiled" else [tiles] + shape
        scope = p.scope() or "global"
        nb = tirx.decl_buffer(big, p.dtype, p.name, scope=scope)
        bufs[key(p)] = (nb, shape)
        new_params.append(nb)

    def tile_index(idx, extent):
        dtype = idx.ty.dtype
        tv = t if dtype == "int32" else tirx.Cast(dtype, t)
        base = tv * (tirx.IntImm(dtype, extent) if isinstance(extent, int) else extent)
        lanes = int(getattr(idx.ty.dtype, "lanes", 1) or 1)
        if lanes > 1:
            base = tirx.Broadcast(base, lanes)
        return base + idx

    def indices_for(buf, indices):
        nb, shape = bufs[key(buf)]
        if layout == "stacked":
            lead = indices[0].ty.dtype if len(indices) else "int32"
            return nb, [t if lead == "int32" else tirx.Cast(lead, t)] + list(indices)
        return nb, [tile_index(i, s) for i, s in zip(indices, shape)]

    def on_load(node):
        if key(node.source) not in bufs:
            return node
        nb, idx = indices_for(node.source, list(node.indices))
        return tirx.BufferLoad(nb, idx)

    def on_store(node):
        if key(node.buffer) not in bufs:
            return node
        nb, idx = indices_for(node.buffer, list(node.indices))
        return tirx.BufferStore(nb, node.value, idx)

    body = tvm_ffi.structural_map(func.body, [(ir.TensorLoad, on_load), (tirx.BufferStore, on_store)])
    left = []

    def on_var(v):
        if key(v) in bufs:
            left.append(v.name)

    tvm_ffi.structural_walk(body, (ir.Var, on_var))
    if left:
        raise ValueError(f"the desc uses buffer(s) {sorted(set(left))} other than through loads and stores")
    loop = tirx.For(t, tirx.IntImm("int32", 0), tirx.IntImm("int32", tiles), tirx.ForKind.SERIAL, body)
    func = tirx.PrimFunc(new_params, loop).with_attr("global_symbol", name)
    return func if index_dtype == "int32" else with_index_dtype(func, index_dtype)


def tile_escapes(func, layout: str = "tiled", tiles: int = 2) -> list:
    """Accesses of a rewritten :func:`tile_target` function that may leave their tile.

    Each buffer parameter of ``func`` holds ``tiles`` tiles and iteration ``t`` of the outer
    loop works on tile ``t``; whatever a replacement made of the desc, its accesses must stay
    inside that tile. In the ``"tiled"`` layout a tile is strided, so every index must stay in
    its dimension's part of the tile; in the ``"stacked"`` layout a tile is compact, so its
    flat offset must stay inside the tile (a whole-tile vector load is fine). Bounds come from
    the loops, thread extents and ``Bind``s inside the tile loop, with ``t`` left symbolic.
    Buffers whose shape is symbolic (``vscale``) are not checked.
    """
    if layout not in ("tiled", "stacked"):
        raise ValueError(f"layout must be 'tiled' or 'stacked', got {layout!r}")
    loop = func.body
    if not isinstance(loop, tirx.For):
        raise ValueError("expected a function made by tile_target (a loop over tiles at the top)")
    t = loop.loop_var
    tile_shapes = {}
    for p in func.params:
        if tirx.is_buffer_var(p):
            shape = [const_int(e) for e in p.shape]
            if None not in shape:
                tile_shapes[key(p)] = [e // tiles for e in shape] if layout == "tiled" else shape[1:]
    bad: list = []

    def shifted(idx, start):
        """``idx - start``, simplified, lane by lane for a Ramp or Broadcast."""
        if isinstance(idx, tirx.Ramp):
            return tirx.Ramp(simplify(idx.base - start), idx.stride, idx.lanes)
        if isinstance(idx, tirx.Broadcast):
            return tirx.Broadcast(simplify(idx.value - start), idx.lanes)
        return simplify(idx - start)

    def check(buf, indices, what, span):
        shape = tile_shapes.get(key(buf))
        if shape is None:
            return
        text = f"{what} {buf.name}{list(indices)}"
        indices = list(indices)
        if layout == "stacked":
            if const_int(simplify(indices[0] - t)) != 0:
                bad.append(f"{text}: not in tile t")
                return
            lo = hi = 0
            for idx, stride in zip(indices[1:], _row_major(shape)):
                bounds = span(simplify(idx))
                if bounds is None:
                    bad.append(f"{text}: an index whose range is unknown")
                    return
                lo, hi = lo + bounds[0] * stride, hi + bounds[1] * stride
            size = 1
            for e in shape:
                size *= e
            if not (0 <= lo and hi < size):
                bad.append(f"{text}: flat offsets [{lo}, {hi}] outside the tile's {size} elements")
            return
        for d, (idx, extent) in enumerate(zip(indices, shape)):
            bounds = span(shifted(idx, t * extent))
            if bounds is None or not (0 <= bounds[0] and bounds[1] < extent):
                bad.append(f"{text}: index {d} in {bounds} relative to the tile, outside its extent {extent}")
                return

    visit_accesses(loop.body, check)
    return bad


def _row_major(shape):
    out, acc = [], 1
    for e in reversed(shape):
        out.append(acc)
        acc *= e
    return list(reversed(out))


@dataclass(frozen=True)
class TensorizeCall:
    """One ``Schedule.tensorize`` call: the intrinsic, the buffers written by the blocks it
    was asked to tensorize, and TVM's error when tensorize refused it (else None)."""

    intrin: str
    writes: frozenset
    refused: str | None = None


@contextlib.contextmanager
def recorded_tensorize():
    """Within the ``with`` block, ``Schedule.tensorize`` records its calls (a list of
    :class:`TensorizeCall`, the value of the ``with``) instead of applying them.

    A call is first tried on a copy of the schedule: when tensorize refuses it, the refusal
    is recorded and tensorize's error raised, so a schedule that falls back on another
    intrinsic (as dlight's do) takes the same path it takes with tensorize.

    >>> with recorded_tensorize() as calls:     # doctest: +SKIP
    ...     plain = my_schedule().mod           # the schedule, minus its tensorize calls
    """
    from tvm import s_tir

    calls: list = []
    tensorize = s_tir.Schedule.tensorize

    def record(sch, block_or_loop, tensor_intrin, preserve_unit_iters=True):
        writes = frozenset(_written(sch.get(block_or_loop)))
        try:
            tensorize(sch.copy(), block_or_loop, tensor_intrin, preserve_unit_iters)
        except Exception as err:  # noqa: BLE001 - recorded, then raised as tensorize raised it
            lines = [l.strip() for l in str(err).strip().splitlines() if l.strip()]
            calls.append(TensorizeCall(tensor_intrin, writes, lines[-1] if lines else type(err).__name__))
            raise
        calls.append(TensorizeCall(tensor_intrin, writes))

    s_tir.Schedule.tensorize = record
    try:
        yield calls
    finally:
        s_tir.Schedule.tensorize = tensorize


def _written(stmt) -> set:
    """The buffers written by the s_tir blocks in (or at) ``stmt``."""
    from tvm import s_tir

    names: set = set()

    def on_block(block):
        names.update(w.source.name for w in block.writes)

    tvm_ffi.structural_walk(stmt, (s_tir.SBlock, on_block))
    return names


def stores_only_to(names) -> Callable:
    """A ``where=`` predicate: the site stores to some of ``names`` and to nothing else."""
    names = frozenset(names)

    def where(m) -> bool:
        stored = set()
        tvm_ffi.structural_walk(m.node, (tirx.BufferStore, lambda st: stored.add(st.buffer.name)))
        return bool(stored) and stored <= names

    return where


def rules_for(calls) -> Rewriter | None:
    """The ``from_module`` rules that do the work of ``calls``: one per intrinsic (its desc
    as the pattern, its impl as the replacement), in the order of the calls, each taking
    only sites that store to the buffers tensorize was pointed at (two intrinsics can share
    a desc: ldmatrix's A and B loads). None when there is no call."""
    from tvm.s_tir import TensorIntrin

    writes: dict = {}
    for call in calls:
        writes.setdefault(call.intrin, set()).update(call.writes)
    rules = None
    for name, names in writes.items():
        intrin = TensorIntrin.get(name)
        rule = Rewriter.from_module({"pattern": intrin.desc, "replacement": intrin.impl}, name=name,
                                    where=stores_only_to(names))
        rules = rule if rules is None else rules | rule
    return rules


@dataclass
class Replay:
    """A schedule built with its ``tensorize`` calls and without them, and the rules for them."""

    calls: list                     #: the :class:`TensorizeCall` s, in order
    tensorized: ir.IRModule         #: the schedule as written
    plain: ir.IRModule              #: the same schedule, with no tensorize call applied
    rules: Rewriter | None = field(default=None)   #: :func:`rules_for` the calls


def replay(schedule: Callable) -> Replay:
    """Run ``schedule()`` (it returns a ``Schedule``, or anything with a ``.mod``, or an
    IRModule) with and without its ``tensorize`` calls.

    >>> r = replay(lambda: my_tensorized_schedule())                      # doctest: +SKIP
    >>> tp.register_pipeline("peer", r.rules)                             # doctest: +SKIP
    >>> tvm.compile(r.plain, target, tir_pipeline="peer")                 # doctest: +SKIP
    """
    def module(result):
        return result if isinstance(result, ir.IRModule) else result.mod

    with recorded_tensorize() as calls:
        plain = module(schedule())
    return Replay(list(calls), module(schedule()), plain, rules_for(calls))
