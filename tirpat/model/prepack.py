"""Weight layout stages: split off the scheduled partitions and run once, at compile time.

A backend's ``schedule`` may mark a block that only re-lays out a parameter (a transpose or
reorder of a weight) with meta_schedule's ``meta_schedule.layout_rewrite_preproc``
annotation. :func:`split_layout_stages` moves each such block into a PrimFunc of its own
(Relax's ``SplitLayoutRewritePreproc``) and, where the weight is a constant, replaces the
call by its result: the model then holds the weight in the layout the device reads.

A layout stage is a loop nest of copies, so it is run by :func:`evaluate`, a vectorised
numpy interpreter of such TIR (each loop nest becomes index arrays); a stage using anything
it does not cover is compiled for the CPU instead (all of those in one build).

>>> mod, folded = split_layout_stages(scheduled_mod)     # doctest: +SKIP
"""

from __future__ import annotations

import operator

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, relax, s_tir, tirx

from .partition import BACKEND_ATTR, OPTIONS_ATTR, PARTITION_ATTR, PartitionOrigin, origin_of, tagged
from .report import SCHEDULE_NOTES

__all__ = ["split_layout_stages", "layout_stages", "evaluate", "Unsupported", "calls", "PREPROC"]

#: The block annotation (meta_schedule's layout rewriting) that marks a layout stage.
PREPROC = "meta_schedule.layout_rewrite_preproc"


def calls(func, op_name: str) -> list:
    """The calls of Relax operator ``op_name`` bound in ``func``'s blocks (none for a PrimFunc)."""
    out = []
    if isinstance(func, relax.Function):
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if isinstance(call, relax.Call) and isinstance(call.op, ir.Op) and call.op.name == op_name:
                    out.append(call)
    return out


def layout_stages(stmt) -> list:
    """The blocks under ``stmt`` that a schedule marked as weight layout stages (:data:`PREPROC`).

    >>> from tvm import te
    >>> a = te.placeholder((4,), "int8", name="a")
    >>> sch = s_tir.Schedule(te.create_prim_func([a, te.compute((4,), lambda i: a[3 - i], name="b")]))
    >>> sch.annotate(sch.get_sblock("b"), PREPROC, 1)
    >>> [block.name_hint for block in layout_stages(sch.mod["main"].body)]
    ['b']
    """
    found: list = []
    tvm_ffi.structural_walk(stmt, (s_tir.SBlock, lambda b: found.append(b) if PREPROC in b.annotations else None))
    return found


def split_layout_stages(mod: ir.IRModule) -> tuple[ir.IRModule, dict]:
    """Split marked weight layout stages off the tagged PrimFuncs of ``mod`` (the stage
    functions are the host's: untagged) and run those whose weights are constants.

    Returns the module and, per partition (the name its
    :data:`~tirpat.model.partition.PARTITION_ATTR` gives, else the tagged function's), the
    names of the stage blocks that ran at compile time.
    """
    if not any(isinstance(f, tirx.PrimFunc) and tagged(f) is not None and layout_stages(f.body)
               for f in mod.functions.values()):
        return mod, {}
    for gv, func in list(mod.functions.items()):
        if isinstance(func, tirx.PrimFunc) and tagged(func) is not None and origin_of(func) is None \
                and layout_stages(func.body):
            # the pass copies a function's attributes to the two it splits it into: so each
            # stage knows its partition
            mod[gv] = func.with_attr(PARTITION_ATTR, PartitionOrigin(gv.name_hint, ()).attr())
    mod = relax.transform.SplitLayoutRewritePreproc()(mod)
    stages = {}     # stage function -> (its partition, its blocks)
    for gv, func in list(mod.functions.items()):
        # the pass names the stage function it makes <partition function>_weight_prepack
        if isinstance(func, tirx.PrimFunc) and gv.name_hint.endswith("_weight_prepack"):
            partition = origin_of(func).name
            for key in (BACKEND_ATTR, OPTIONS_ATTR, PARTITION_ATTR, SCHEDULE_NOTES, "op_pattern"):
                func = func.without_attr(key)     # host code
            mod[gv] = func
            blocks = []
            tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda b: blocks.append(b.name_hint)
                                                if b.name_hint != "root" else None))
            stages[gv.name_hint] = (partition, blocks)
    folded: dict = {}
    constant_calls = []
    for func in mod.functions.values():
        for call in calls(func, "relax.call_tir"):
            name = call.args[0].name_hint
            if name in stages and all(isinstance(a, ir.Constant) for a in call.args[1].fields):
                partition, blocks = stages[name]
                folded.setdefault(partition, []).extend(blocks)
                constant_calls.append(call)
    if constant_calls:
        mod = _run_at_compile_time(mod, constant_calls)
    return mod, folded


def _run_at_compile_time(mod: ir.IRModule, stage_calls: list) -> ir.IRModule:
    """Replace each ``call_tir`` of ``stage_calls`` (all arguments constants) by its result:
    evaluated in numpy, or for stages :func:`evaluate` does not cover, compiled for the CPU
    together, once (``FoldConstant`` would compile each alone)."""
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    results, compiled = {}, []
    for call in stage_calls:
        try:
            out, = evaluate(mod[call.args[0].name_hint], *[a.value.numpy() for a in call.args[1].fields])
            results[tvm_ffi.structural_hash(call)] = (call, relax.const(out.reshape(_shape(call.ty.shape))))
        except Unsupported:
            compiled.append(call)
    if compiled:
        names = sorted({c.args[0].name_hint for c in compiled})
        lib = tvm.compile(ir.IRModule({n: mod[n].with_attr("global_symbol", n) for n in names}), "llvm")
        for call in compiled:
            out = tvm.runtime.empty(_shape(call.ty.shape), str(call.ty.dtype))
            lib[call.args[0].name_hint](*[a.value for a in call.args[1].fields], out)
            results[tvm_ffi.structural_hash(call)] = (call, relax.const(out.numpy()))

    def fold(call, _):
        found = results.get(tvm_ffi.structural_hash(call))
        return found[1] if found is not None and tvm_ffi.structural_equal(found[0], call) else call

    pattern = is_op("relax.call_tir")(wildcard(), wildcard())
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = rewrite_call(pattern, fold, func)
    return relax.transform.DeadCodeElimination()(mod)


def _shape(shape) -> list:
    return [int(d) for d in (shape.values if hasattr(shape, "values") else shape)]


# ----------------------------------------------------------------------------- evaluation
class Unsupported(Exception):
    """A construct :func:`evaluate` does not run (the caller compiles the function instead)."""


def evaluate(func: tirx.PrimFunc, *inputs: np.ndarray) -> list:
    """Run the PrimFunc ``func`` on numpy arrays: ``inputs`` are its first parameters, the
    remaining parameters its outputs, returned as new arrays (zeros where nothing is written).

    Covers loop nests of buffer stores (schedulable blocks included) over integer index
    arithmetic, comparisons, ``Select``/``if_then_else`` and casts: what a layout stage
    holds. Each outermost loop nest runs at once, as index arrays. Anything else (float
    arithmetic, a loop nest that reads a buffer it writes, stores that overlap, symbolic
    shapes, ...) raises :class:`Unsupported`.

    >>> from tvm.script import tirx as T
    >>> @T.prim_func(s_tir=True)
    ... def transpose(a: T.Buffer((2, 3), "int8"), b: T.Buffer((3, 2), "int8")):
    ...     for i, j in T.grid(2, 3):
    ...         with T.sblock("t"):
    ...             vi, vj = T.axis.remap("SS", [i, j])
    ...             b[vj, vi] = a[vi, vj]
    >>> evaluate(transpose, np.arange(6, dtype="int8").reshape(2, 3))[0]
    array([[0, 3],
           [1, 4],
           [2, 5]], dtype=int8)
    """
    params = list(func.params)
    if len(inputs) > len(params) or not all(tirx.is_buffer_var(p) for p in params):
        raise Unsupported("parameters that are not buffers, or more inputs than parameters")
    run = _Interpreter()
    for p, value in zip(params, inputs):
        value = np.asarray(value)
        if tuple(value.shape) != tuple(run.static_shape(p)) or str(value.dtype) != str(p.dtype):
            raise ValueError(f"evaluate: {p.name}: expected {str(p.dtype)}{run.static_shape(p)}, "
                             f"got {value.dtype}{list(value.shape)}")
        run.buffers[p.__chandle__()] = np.array(value)       # a copy: a function may write its inputs
    outputs = [run.allocate(p) for p in params[len(inputs):]]
    run.stmt(func.body, None)
    return outputs


_ARITH = {tirx.Add: operator.add, tirx.Sub: operator.sub, tirx.Mul: operator.mul,
          tirx.Min: np.minimum, tirx.Max: np.maximum, tirx.FloorDiv: np.floor_divide, tirx.FloorMod: np.remainder}
_COMPARE = {tirx.EQ: np.equal, tirx.NE: np.not_equal, tirx.LT: np.less, tirx.LE: np.less_equal,
            tirx.GT: np.greater, tirx.GE: np.greater_equal}
_LOGIC = {tirx.And: np.logical_and, tirx.Or: np.logical_or}


class _Interpreter:
    """Vectorised execution: the variable of the loop at depth ``d`` (0 outermost) is an index
    array of ``d + 1`` axes with its extent on the first, so that every value computed inside
    the nest broadcasts against the others (numpy aligns shapes from the last axis)."""

    def __init__(self) -> None:
        self.buffers: dict = {}     # buffer var handle -> ndarray
        self.env: dict = {}         # scalar var handle -> value (array or numpy scalar)
        self.depth = 0

    @staticmethod
    def static_shape(buf) -> list:
        if any(not isinstance(d, tirx.IntImm) for d in buf.shape):
            raise Unsupported(f"buffer {buf.name} has a symbolic shape")
        if list(buf.strides) or not (isinstance(buf.elem_offset, tirx.IntImm) and int(buf.elem_offset) == 0):
            raise Unsupported(f"buffer {buf.name} is a strided or offset view")
        return [int(d) for d in buf.shape]

    def allocate(self, buf) -> np.ndarray:
        out = np.zeros(self.static_shape(buf), dtype=_np_dtype(str(buf.dtype)))
        self.buffers[buf.__chandle__()] = out
        return out

    # ------------------------------------------------------------------ statements
    def stmt(self, s, mask) -> None:
        if isinstance(s, s_tir.SBlockRealize):
            block = s.block
            if block.init is not None or list(block.match_buffers):
                raise Unsupported("a reduction block or a match_buffer")
            for buf in block.alloc_buffers:
                self.allocate(buf)
            for iv, value in zip(block.iter_vars, s.iter_values):
                self.env[iv.var.__chandle__()] = self.expr(value)
            self.stmt(block.body, _and(mask, self.expr(s.predicate)))
        elif isinstance(s, tirx.For):
            self.loop(s, mask)
        elif isinstance(s, tirx.SeqStmt):
            for child in s.seq:
                self.stmt(child, mask)
        elif isinstance(s, tirx.BufferStore):
            self.store(s, mask)
        elif isinstance(s, tirx.IfThenElse):
            cond = self.expr(s.condition)
            self.stmt(s.then_case, _and(mask, cond))
            if s.else_case is not None:
                self.stmt(s.else_case, _and(mask, np.logical_not(cond)))
        elif isinstance(s, tirx.LetStmt):
            self.env[s.var.__chandle__()] = self.expr(s.value)
            self.stmt(s.body, mask)
        elif isinstance(s, tirx.Evaluate) and isinstance(s.value, tirx.IntImm):
            pass
        else:
            raise Unsupported(f"statement {type(s).__name__}")

    def loop(self, s, mask) -> None:
        if s.thread_binding is not None or (getattr(s, "step", None) is not None and not _is_one(s.step)):
            raise Unsupported("a thread-bound or strided loop")
        if not isinstance(s.min, tirx.IntImm) or not isinstance(s.extent, tirx.IntImm):
            raise Unsupported("a loop with a symbolic range")
        if self.depth == 0:
            _check_independent(s)
        lo, n = int(s.min), int(s.extent)
        index = np.arange(lo, lo + n, dtype=_np_dtype(str(s.loop_var.ty.dtype)))
        self.env[s.loop_var.__chandle__()] = index.reshape((n,) + (1,) * self.depth)
        self.depth += 1
        try:
            self.stmt(s.body, mask)
        finally:
            self.depth -= 1

    def store(self, s, mask) -> None:
        target = self.buffers.get(s.buffer.__chandle__())
        if target is None:
            raise Unsupported(f"a store to {s.buffer.name}, which is neither a parameter nor allocated")
        if getattr(s, "predicate", None) is not None:
            raise Unsupported("a predicated store")
        parts = [self.expr(i) for i in s.indices] + [self.expr(s.value)]
        parts = np.broadcast_arrays(*[np.asarray(p) for p in parts] + ([np.asarray(mask)] if mask is not None else []))
        if mask is not None:
            keep = parts.pop()
            parts = [p[keep] for p in parts]
        *indices, value = [p.reshape(-1) for p in parts]
        for axis, (i, n) in enumerate(zip(indices, target.shape)):
            if i.size and (i.min() < 0 or i.max() >= n):
                raise IndexError(f"a store to {s.buffer.name} outside its bounds (axis {axis}: "
                                 f"{int(i.min())}..{int(i.max())} of {n})")
        flat = np.ravel_multi_index(indices, target.shape) if indices else np.zeros(value.shape, dtype=np.intp)
        written = np.zeros(target.size, dtype=bool)
        written[flat] = True
        if np.count_nonzero(written) != flat.size:
            raise Unsupported(f"stores to {s.buffer.name} that overlap")
        target.reshape(-1)[flat] = value.astype(target.dtype, copy=False)

    # ------------------------------------------------------------------ expressions
    def expr(self, e):
        kind = type(e)
        if kind in (tirx.IntImm, tirx.FloatImm):
            return _np_dtype(_dtype(e)).type(e.value)
        if isinstance(e, ir.Var):
            found = self.env.get(e.__chandle__())
            if found is None:
                raise Unsupported(f"a free variable {e.name}")
            return found
        if kind in _ARITH:
            a, b = self.expr(e.a), self.expr(e.b)
            if not np.issubdtype(_np_dtype(_dtype(e)), np.integer):
                raise Unsupported("arithmetic on floats")
            if kind in (tirx.FloorDiv, tirx.FloorMod) and np.any(np.asarray(b) == 0):
                raise Unsupported("a division by zero")
            with np.errstate(over="ignore"):
                return _ARITH[kind](a, b)
        if kind in _COMPARE:
            return _COMPARE[kind](self.expr(e.a), self.expr(e.b))
        if kind in _LOGIC:
            return _LOGIC[kind](self.expr(e.a), self.expr(e.b))
        if kind is tirx.Not:
            return np.logical_not(self.expr(e.a))
        if kind is tirx.Select:
            return np.where(self.expr(e.condition), self.expr(e.true_value), self.expr(e.false_value))
        if kind is tirx.Cast:
            return np.asarray(self.expr(e.value)).astype(_np_dtype(_dtype(e)))
        if isinstance(e, ir.TensorLoad):
            return self.load(e)
        if isinstance(e, ir.Call) and isinstance(e.op, ir.Op):
            if e.op.name == "prim.if_then_else":
                return np.where(*[self.expr(a) for a in e.args])
            if e.op.name == "prim.likely":
                return self.expr(e.args[0])
        raise Unsupported(f"expression {kind.__name__}")

    def load(self, e):
        source = self.buffers.get(e.source.__chandle__())
        if source is None:
            raise Unsupported(f"a load from {e.source.name}, which is neither a parameter nor allocated")
        indices = np.broadcast_arrays(*[np.asarray(self.expr(i)) for i in e.indices])
        # lanes outside the buffer are those a condition discards (if_then_else(i < n, a[i], 0)):
        # they read element 0 instead
        inside = np.ones(indices[0].shape, dtype=bool) if indices else True
        for i, n in zip(indices, source.shape):
            inside &= (i >= 0) & (i < n)
        return source[tuple(np.where(inside, i, 0) for i in indices)]


def _check_independent(loop) -> None:
    """A loop nest runs at once only when it reads no buffer it writes."""
    stored, loaded = set(), set()
    tvm_ffi.structural_walk(loop, [(tirx.BufferStore, lambda s: stored.add(s.buffer.__chandle__())),
                                   (ir.TensorLoad, lambda t: loaded.add(t.source.__chandle__()))])
    if stored & loaded:
        raise Unsupported("a loop nest that reads a buffer it writes")


def _and(mask, cond):
    if isinstance(cond, (bool, np.bool_)) and cond:
        return mask
    return cond if mask is None else np.logical_and(mask, cond)


def _is_one(e) -> bool:
    return isinstance(e, tirx.IntImm) and int(e) == 1


def _dtype(e) -> str:
    return str(e.ty.dtype)


def _np_dtype(dtype: str):
    if dtype == "bool":
        return np.dtype(bool)
    try:
        return np.dtype(dtype)
    except TypeError:
        raise Unsupported(f"dtype {dtype}") from None
