"""Scratchpad planning: from buffers in a backend's storage scopes to on-chip addresses.

A backend's rules rewrite loop nests into calls of its runtime functions
(``T.call_packed("<prefix>.op", ...)``) whose on-chip operands are written as
``buffer.access_ptr(...)`` of buffers in the backend's scratchpad scopes. After them,
:class:`ScratchpadPlanner` (as a pass, e.g. in ``tp.register_pipeline(..., after=[...])``):

- gives every scratchpad buffer an address in its :class:`~tirpat.device.Memory`, stack-like
  per statement sequence, taking the memory's
  :meth:`~tirpat.device.Memory.footprint` (a double-buffering memory gives a buffer
  allocated inside a loop that runs more than once two copies used on alternate
  iterations, so the next tile's transfer can overlap the current tile's compute). The
  allocations disappear from the TIR;
- replaces the ``access_ptr`` operands by those addresses (element offsets);
- raises :class:`ScratchpadOverflow` naming the scratchpad, the buffer, by how much it
  overflows and what else is live; :class:`PlanError` for a scratchpad access no rule
  rewrote (naming the statement), a scratchpad buffer handed on as host memory (not
  through ``access_ptr``), a runtime call in a ``parallel`` loop, and CPU code touching a
  host buffer between the runtime calls that use it and their sync;
- inserts ``<prefix>.sync()`` after each run of top-level statements that call the runtime
  (CPU code after a run that names none of its buffers, only memory of parameters and
  allocations, and calls no function runs before it instead, so that the runs around it are
  one: an im2col between an activation table's load and the convolution that uses it),
  and ``<prefix>.begin()`` first (see :meth:`tirpat.device.Runtime.begin`: what a call that
  failed in host code left pending is discarded, even when calls come from one line);
- asks the runtime first, for each such run (a *group*) that is *static*, whether it can
  replay the stream the group made before: ``if <prefix>.replay(key, *hosts) == 0:
  <group>; <prefix>.sync()``. ``key`` names the function, the group's index in it and a
  structural hash of the group, then after ``;`` the hosts' dtypes (``"f:0:<hash>;int8,int32"``);
  ``hosts`` are the host buffers the group's calls use, in order of first use (the buffers
  themselves, whole). A session that stored the group's stream runs it again on this call's
  ``hosts`` in that one callback (:meth:`tirpat.device.Session.replay`) instead of one
  callback per call; else the calls run.
  Static means the group provably makes the same calls every run: it is loops (not
  ``parallel``) whose bounds are constants or integer expressions of the enclosing loops'
  variables, ``if`` and ``Evaluate`` statements of ``<prefix>.*`` calls whose arguments are
  constants, integer expressions of the group's loop variables, and host buffers that are
  parameters or allocated before it (allocations inside the group at its top level move
  before the ``if``). Anything else keeps the group as it is, since what its
  calls are could change from run to run: a host store or load (the data could steer a
  call), another call, a loop bound or argument from a scalar parameter or a ``Bind`` (its
  value is unknown until the run), a buffer allocated inside a loop, a ``while``.

``AttrStmt`` markers whose key starts with ``<prefix>.`` are removed (rules use them to
tell a subclass's checks something); :meth:`ScratchpadPlanner.check_sequence` and
:meth:`ScratchpadPlanner.check_loop` are the hooks for a backend's own checks.

>>> from tvm.script import tirx as T
>>> @T.prim_func
... def f(A: T.Buffer((64,), "int8")):
...     for i in range(4):
...         v = T.alloc_buffer((16,), "int8", scope="local.vec")
...         T.call_packed("vec.load", v.access_ptr("w"), A.data, i * 16)
>>> planner = ScratchpadPlanner("vec", [Memory("VREG", "local.vec", capacity=64)])
>>> print(planner.plan(f).script())     # doctest: +ELLIPSIS
# from tvm.script import tirx as T
...
    T.call_packed("vec.begin")
    if T.call_packed("vec.replay", "f:0:...", T.tvm_stack_make_array(A.data, ...)) == 0:
        for i in range(4):
            T.call_packed("vec.load", i % 2 * 16, A.data, i * 16)
        T.call_packed("vec.sync")
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import ir, tirx

from .instr import Instruction
from .memory import Memory

__all__ = ["PlanError", "ScratchpadOverflow", "ScratchpadPlanner", "access_ptr_buffer", "describe"]

_ANALYZER = tvm.sym.Analyzer()


@tvm_ffi.register_error
class PlanError(ValueError):
    """The rewritten function cannot run on the device; the message names the cause."""


@tvm_ffi.register_error
class ScratchpadOverflow(PlanError):
    """The live scratchpad buffers do not fit."""


def describe(stmt) -> str:
    """A statement as one line for an error message (the last line of its script)."""
    lines = [l for l in str(stmt).strip().splitlines() if l.strip() and not l.lstrip().startswith("#")]
    lines = [l for l in lines if "T.Buffer(" not in l]
    return (lines[-1] if lines else type(stmt).__name__).strip()


class ScratchpadPlanner:
    """Plans the ``memories`` (one :class:`~tirpat.device.Memory` per storage scope) of the
    backend whose runtime functions start with ``prefix.``, for the backend ``options`` their
    capacities and alignments depend on (see the module doc). Each memory's
    :meth:`~tirpat.device.Memory.footprint` is what a buffer takes. ``instructions``, the
    backend's :func:`~tirpat.device.instr` declarations, say which call arguments are
    addresses in which memory: a buffer of another memory there is a :class:`PlanError`.
    Subclass and override :meth:`check_sequence` / :meth:`check_loop` for a backend's own checks.
    """

    def __init__(self, prefix: str, memories: Sequence[Memory], options: Optional[Mapping[str, Any]] = None,
                 *, instructions: Sequence[Instruction] = ()) -> None:
        if any(not isinstance(m, Memory) for m in memories):
            raise TypeError(f"ScratchpadPlanner: memories must be tirpat.device.Memory, got {list(memories)!r}")
        self.prefix = prefix
        self.memories = {m.scope: m.bind(options) for m in memories}
        if len(self.memories) != len(memories):
            raise ValueError("ScratchpadPlanner: two memories share a storage scope")
        self.instructions = tuple(instructions)
        for ins in self.instructions:
            if not ins.runtime_name.startswith(prefix + "."):
                raise ValueError(f"ScratchpadPlanner: instruction {ins.name} calls {ins.runtime_name}, "
                                 f"not a {prefix}.* function")
            for op in ins.memory_operands:
                if op.memory.scope not in self.memories:
                    raise ValueError(f"ScratchpadPlanner: instruction {ins.name} uses memory {op.memory.name}, "
                                     f"which is not one of the planned memories")

    # -- what a backend's checks use ----------------------------------------------------
    def is_scratchpad(self, buffer) -> bool:
        """True for a buffer in one of the planned scopes."""
        return buffer.scope() in self.memories

    def instruction_of(self, call) -> Optional[Instruction]:
        """The declared instruction a runtime call is (by its name and fixed arguments), or None."""
        return next((ins for ins in self.instructions if ins.is_call(call)), None)

    def is_runtime_call(self, node) -> bool:
        """True for a ``T.call_packed("<prefix>.*", ...)`` call."""
        return (isinstance(node, ir.Call) and node.op.name == "tirx.tvm_call_packed"
                and isinstance(node.args[0], ir.StringImm) and node.args[0].value.startswith(self.prefix + "."))

    def runtime_calls(self, stmt) -> list:
        """The runtime calls in ``stmt``, in program order."""
        found = []
        tvm_ffi.structural_walk(stmt, (ir.Call, lambda c: found.append(c) if self.is_runtime_call(c) else None))
        return found

    def calls_runtime(self, stmt) -> bool:
        """True when ``stmt`` calls the runtime anywhere."""
        def on_call(c):
            return tvm_ffi.VisitInterrupt(c) if self.is_runtime_call(c) else None

        return tvm_ffi.structural_walk(stmt, (ir.Call, on_call)) is not None

    def check_sequence(self, stmts: list, func_name: str) -> None:
        """Hook: check one statement sequence before it is planned (raise PlanError)."""

    def check_loop(self, loop, func_name: str) -> None:
        """Hook: check a loop after its body was planned (raise PlanError)."""

    # -- planning -----------------------------------------------------------------------
    def plan(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """Plan one PrimFunc (see the module doc)."""
        attrs = func.attrs
        name = str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "main"
        body = _FunctionPlan(self, name).run(func.body)
        if not self.calls_runtime(body):
            return func.with_body(body)
        synced = self._with_syncs(body, name, func.params)
        begin = tirx.Evaluate(tirx.call_packed(f"{self.prefix}.begin"))
        return func.with_body(tirx.SeqStmt([begin, *(synced.seq if isinstance(synced, tirx.SeqStmt) else [synced])]))

    def as_pass(self, name: Optional[str] = None) -> tvm.transform.Pass:
        """:meth:`plan` as a PrimFunc pass (named ``<prefix>.PlanScratchpads``)."""
        return tirx.transform.prim_func_pass(lambda f, mod, ctx: self.plan(f), opt_level=0,
                                             name=name or f"{self.prefix}.PlanScratchpads")

    # -- syncs ---------------------------------------------------------------------------
    def _with_syncs(self, body, name, params=()):
        """Sync after each run of top-level statements that call the runtime, before the
        CPU code that follows it (the device's work only runs at the sync); a static run
        asks the runtime to replay it first (see the module doc)."""
        stmts = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
        out, group = [], []
        # the buffers a group's replay call can name: parameters and top-level allocations before it
        defined = {p.__chandle__() for p in params if tirx.is_buffer_var(p)}
        groups = 0

        def close():
            nonlocal groups
            if group:
                self._check_cpu_hazards(tirx.SeqStmt(group) if len(group) > 1 else group[0], name)
                out.extend(self._replayed(group, f"{name}:{groups}", defined) or
                           [*group, tirx.Evaluate(tirx.call_packed(f"{self.prefix}.sync"))])
                groups += 1
                group.clear()

        for s in stmts:
            if self.calls_runtime(s):
                group.append(s)
            elif group and not self._touches_memory(s):
                group.append(s)     # an allocation or a no-op does not need the results
            elif group and self._apart(s, calls := [g for g in group if self.calls_runtime(g)], defined):
                # CPU code that shares no buffer with the pending calls (an im2col after an
                # activation table's load) runs first, after the group's allocations (which
                # it may use): the group goes on past it, one stream and one sync where a
                # sync before it would split the device's work in two
                out.extend(g for g in group if not any(g is c for c in calls))
                group[:] = calls
                out.append(s)
            else:
                close()
                out.append(s)
            if isinstance(s, (tirx.AllocBuffer, tirx.DeclBuffer)):
                defined.add(s.buffer.__chandle__())
        close()
        return out[0] if len(out) == 1 else tirx.SeqStmt(out)

    def _replayed(self, group: list, name: str, defined: set) -> Optional[list]:
        """A static group as ``[allocations..., if <prefix>.replay(key, *hosts) == 0: group;
        sync]``, or None when the group is not static (see the module doc)."""
        moved = [s for s in group if isinstance(s, tirx.AllocBuffer)]
        calls = [s for s in group if not isinstance(s, tirx.AllocBuffer)]
        check = _Static(self, defined)
        if not all(check.stmt(s) for s in calls):
            return None
        stmt = tirx.SeqStmt(calls) if len(calls) > 1 else calls[0]
        # the key holds the group's content: a group's stream is only replayed for that group,
        # whatever function (of whatever module) another group with its name came from
        key = f"{name}:{tvm_ffi.structural_hash(stmt, map_free_vars=True) & (1 << 64) - 1:016x}"
        # and after ";" the hosts' dtypes, which the DLTensors compiled code makes of these
        # buffers carry: the session takes them from here instead of reading each tensor's
        # (a string conversion through tvm_ffi, ~1.5 us a host, ~320 hosts a classifier call)
        hosts = list(check.hosts.values())
        key += ";" + ",".join(str(b.dtype) for b in hosts)
        ask = tirx.call_packed(f"{self.prefix}.replay", key, *hosts)
        then = tirx.SeqStmt([*calls, tirx.Evaluate(tirx.call_packed(f"{self.prefix}.sync"))])
        return [*moved, tirx.IfThenElse(tirx.EQ(ask, tirx.IntImm("int32", 0)), then, None)]

    def _check_cpu_hazards(self, stmt, name):
        shared = self._buffer_vars(self.runtime_calls(stmt))
        if not shared:
            return

        def check(buf, node):
            if buf.__chandle__() in shared:
                raise PlanError(f"{name}: CPU code touches {buf.name} between the {self.prefix} calls that "
                                f"use it and the next sync: {describe(node)}")

        tvm_ffi.structural_walk(stmt, [(tirx.BufferStore, lambda s: check(s.buffer, s)),
                                       (ir.TensorLoad, lambda l: check(l.source, l))])

    def _apart(self, stmt, calls: list, defined: set) -> bool:
        """True when CPU code ``stmt`` may run before the statements ``calls`` of a group (its
        program-order predecessors, not yet synced): the memory it names is parameters'
        and allocations' (``defined``, or allocated inside it), none of it the group's
        (a pointer bound elsewhere could alias anything), and it calls nothing that could
        act on memory or on the runtime otherwise (only operators that at most read state,
        no function of the module or outside it)."""
        used = self._buffer_vars(calls)
        inside: set = set()
        tvm_ffi.structural_walk(stmt, (tirx.AllocBuffer, lambda a: inside.add(a.buffer.data.__chandle__())))

        def blocks(node):
            if isinstance(node, ir.Call):
                effect = node.op.get_attr("TCallEffectKind") if isinstance(node.op, ir.Op) else None
                if effect is None or int(effect) > _READS_STATE:
                    return tvm_ffi.VisitInterrupt(node)
            elif tirx.is_buffer_var(node):
                handle = node.__chandle__()
                if handle in used or (handle not in defined and handle not in inside):
                    return tvm_ffi.VisitInterrupt(node)
            return None

        return tvm_ffi.structural_walk(stmt, [(ir.Call, blocks), (ir.Var, blocks)]) is None

    @staticmethod
    def _buffer_vars(nodes: list) -> set:
        """The handles of the buffer variables ``nodes`` (statements, calls) name."""
        found: set = set()
        for node in nodes:
            tvm_ffi.structural_walk(node, (ir.Var, lambda v: found.add(v.__chandle__()) if tirx.is_buffer_var(v)
                                        else None))
        return found

    def _touches_memory(self, stmt) -> bool:
        found = []
        tvm_ffi.structural_walk(stmt, [(tirx.BufferStore, found.append), (ir.TensorLoad, found.append),
                                       (ir.Call, lambda c: found.append(c) if not self.is_runtime_call(c) else None)])
        return bool(found)


_BINARY = tuple(getattr(tirx, n) for n in (
    "Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max", "EQ", "NE", "LT", "LE", "GT", "GE",
    "And", "Or", "LShift", "RShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"))
_UNARY = (tirx.Not, tirx.BitwiseNot)
# TVM's CallEffectKind of an operator that at most reads state (annotation 0, pure 1, read 2)
_READS_STATE = 2
# calls that compute a value from their arguments alone (a host buffer's DLTensor among them)
_PURE_CALLS = frozenset(("tirx.tvm_stack_make_array", "tirx.tvm_stack_make_shape", "tirx.buffer_data",
                         "prim.if_then_else", "prim.likely"))


class _Static:
    """Whether statements make the same runtime calls every run (see the module doc); the
    host buffers they use gather in ``hosts`` (handle -> buffer, in order of first use)."""

    def __init__(self, planner: ScratchpadPlanner, defined: set) -> None:
        self.planner = planner
        self.defined = defined
        self.bound: set = set()         # loop variables of the statements
        self.hosts: dict = {}
        self.control = {f"{planner.prefix}.{n}" for n in ("sync", "begin", "replay")}

    def stmt(self, s) -> bool:
        kind = type(s)
        if kind is tirx.SeqStmt:
            return all(self.stmt(x) for x in s.seq)
        if kind is tirx.For:
            # bounds from constants and the enclosing loops' variables (a tail tile's
            # ``range(4 - max(0, i * 4 - 6))``) are the same every run
            if not (self.expr(s.min) and self.expr(s.extent)) \
                    or int(s.kind) == int(tirx.ForKind.PARALLEL) or s.thread_binding is not None \
                    or not (s.step is None or self.expr(s.step)):
                return False
            self.bound.add(s.loop_var.__chandle__())
            return self.stmt(s.body)
        if kind is tirx.Evaluate:
            v = s.value
            if isinstance(v, tirx.IntImm):
                return True
            return (self.planner.is_runtime_call(v) and v.args[0].value not in self.control
                    and all(self.expr(a) for a in v.args[1:]))
        if kind is tirx.IfThenElse:
            return self.expr(s.condition) and self.stmt(s.then_case) and \
                (s.else_case is None or self.stmt(s.else_case))
        return False

    def expr(self, e) -> bool:
        if isinstance(e, (tirx.IntImm, tirx.FloatImm, ir.StringImm)):
            return True
        if isinstance(e, ir.Var):
            handle = e.__chandle__()
            if tirx.is_buffer_var(e):
                if handle not in self.defined:
                    return False
                self.hosts.setdefault(handle, e)
                return True
            return handle in self.bound
        if isinstance(e, _BINARY):
            return self.expr(e.a) and self.expr(e.b)
        if isinstance(e, _UNARY):
            return self.expr(e.a)
        if isinstance(e, tirx.Cast):
            return self.expr(e.value)
        if isinstance(e, tirx.Select):
            return self.expr(e.condition) and self.expr(e.true_value) and self.expr(e.false_value)
        if isinstance(e, ir.Call):
            return getattr(e.op, "name", None) in _PURE_CALLS and all(self.expr(a) for a in e.args)
        return False


def _footprint(buf) -> int | None:
    """The elements ``buf`` spans: its shape's product, or with strides (rows padded for
    alignment, say) one past its last element; None when they are not constants."""
    dims = [int(d.value) if isinstance(d, tirx.IntImm) else None for d in buf.shape]
    strides = [int(s.value) if isinstance(s, tirx.IntImm) else None for s in buf.strides]
    if None in dims or None in strides:
        return None
    if not strides or 0 in dims:
        return int(np.prod(dims, dtype=np.int64))
    return 1 + sum((d - 1) * s for d, s in zip(dims, strides))


def access_ptr_buffer(arg: ir.Expr) -> ir.Var | None:
    """The buffer of an ``access_ptr`` argument (how a declared instruction's call passes a
    memory operand), else None.

    >>> buf = tirx.decl_buffer((16,), "int8", "A")
    >>> access_ptr_buffer(buf.access_ptr("r")).same_as(buf), access_ptr_buffer(tirx.const(1))
    (True, None)
    """
    if isinstance(arg, ir.Call) and arg.op.name == "tirx.tvm_access_ptr":
        data = arg.args[1]
        if isinstance(data, ir.Call) and data.op.name == "tirx.buffer_data":
            return data.args[0]
    return None


class _FunctionPlan:
    """The addresses of one PrimFunc's scratchpad buffers, assigned while mutating it."""

    def __init__(self, planner: ScratchpadPlanner, name: str):
        self.planner = planner
        self.name = name
        self.loops: list = []
        self.top = dict.fromkeys(planner.memories, 0)
        self.live: dict[str, list] = {scope: [] for scope in planner.memories}
        self.addr: dict = {}

    def alloc(self, buf):
        mem = self.planner.memories[buf.scope()]
        size = _footprint(buf)
        if size is None:
            raise PlanError(f"{self.name}: scratchpad buffer {buf.name} has the non-constant shape "
                            f"{list(buf.shape)}" + (f" or strides {list(buf.strides)}" if buf.strides else ""))
        # the loops around the allocation run more than once unless every extent is a constant 1
        repeated = any(not (isinstance(l.extent, tirx.IntImm) and l.extent.value == 1) for l in self.loops)
        total = mem.footprint(size, repeated=repeated)
        copies, size = mem.copies(repeated=repeated), total // mem.copies(repeated=repeated)
        base = self.top[mem.scope]
        end = base + total
        if end > mem.capacity:
            item = mem.itemsize
            live = ", ".join(f"{b.name} ({n} x {s} elements)" for b, n, s in self.live[mem.scope]) or "nothing else"
            raise ScratchpadOverflow(
                f"{self.name}: scratchpad {mem.name} overflows by {(end - mem.capacity) * item} bytes when "
                f"allocating {buf.name} ({copies} x {size} elements; live: {live}; capacity "
                f"{mem.capacity * item} bytes)")
        self.top[mem.scope] = end
        self.live[mem.scope].append((buf, copies, size))
        offset = tirx.IntImm("int32", base)
        if copies == 2:
            it = tirx.IntImm("int32", 0)
            for l in self.loops:
                it = it * l.extent + (l.loop_var - l.min)
            offset = offset + tirx.floormod(it, 2) * size
        self.addr[buf.__chandle__()] = offset

    def on_seq(self, seq, mut):
        self.planner.check_sequence(list(seq.seq), self.name)
        saved = dict(self.top)
        saved_live = {m: list(v) for m, v in self.live.items()}
        out = []
        for s in seq.seq:
            if isinstance(s, tirx.AllocBuffer) and self.planner.is_scratchpad(s.buffer):
                self.alloc(s.buffer)
                continue
            out.append(mut.mutate(s))
        self.top, self.live = saved, saved_live
        if not out:
            return tirx.Evaluate(tirx.IntImm("int32", 0))
        return out[0] if len(out) == 1 else tirx.SeqStmt(out)

    def on_stmt(self, node, mut):
        planner = self.planner
        if isinstance(node, tirx.SeqStmt):
            return self.on_seq(node, mut)
        if isinstance(node, tirx.AttrStmt) and str(node.attr_key).startswith(planner.prefix + "."):
            return mut.mutate(node.body)
        if isinstance(node, tirx.AllocBuffer) and planner.is_scratchpad(node.buffer):
            self.alloc(node.buffer)
            return tirx.Evaluate(tirx.IntImm("int32", 0))
        if isinstance(node, tirx.For):
            if int(node.kind) == int(tirx.ForKind.PARALLEL) and planner.calls_runtime(node):
                raise PlanError(f"{self.name}: {planner.prefix} calls inside the parallel loop "
                                f"'{node.loop_var.name}' are not supported (the stream is one sequence)")
            self.loops.append(node)
            try:
                planned = mut.default_mutate(node)
            finally:
                self.loops.pop()
            # after the body: an access no rule matched inside it is the error to report first
            planner.check_loop(node, self.name)
            return planned
        if isinstance(node, tirx.BufferStore) and planner.is_scratchpad(node.buffer):
            raise PlanError(f"{self.name}: no {planner.prefix} rule matched this access to scratchpad buffer "
                            f"{node.buffer.name}, so it cannot run: {describe(node)}")
        return mut.default_mutate(node)

    def check_operands(self, ins, call):
        """A declared instruction's call: each scratchpad buffer passed where its memory is."""
        args = ins.arguments_of(call)
        for op in ins.operands:
            buf = access_ptr_buffer(args[op.name])
            if buf is None or not self.planner.is_scratchpad(buf):
                continue
            if op.kind != "memory":
                raise PlanError(f"{self.name}: {ins.name} takes {op.name} as a {op.kind} operand, but gets the "
                                f"address of scratchpad buffer {buf.name}: {describe(tirx.Evaluate(call))}")
            if buf.scope() != op.memory.scope:
                raise PlanError(f"{self.name}: {ins.name} takes {op.name} in {op.memory.name}, but gets "
                                f"{buf.name} of {self.planner.memories[buf.scope()].name}: "
                                f"{describe(tirx.Evaluate(call))}")

    def on_call(self, node, mut):
        ins = self.planner.instruction_of(node) if self.planner.is_runtime_call(node) else None
        if ins is not None:
            self.check_operands(ins, node)
        buf = access_ptr_buffer(node)
        if buf is not None:
            if self.planner.is_scratchpad(buf):
                base = self.addr.get(buf.__chandle__())
                if base is None:
                    raise PlanError(f"{self.name}: scratchpad buffer {buf.name} is used before it is allocated")
                return _ANALYZER.simplify(base + node.args[2])
        elif node.op.name == "tirx.buffer_data" and self.planner.is_scratchpad(node.args[0]):
            # any other use of its memory (a DLTensor of it, say) would reach for host memory
            raise PlanError(f"{self.name}: scratchpad buffer {node.args[0].name} is used as host memory; only "
                            f"operands written {node.args[0].name}.access_ptr(...) get a scratchpad address")
        return mut.default_mutate(node)

    def on_load(self, node, mut):
        if tirx.is_buffer_var(node.source) and self.planner.is_scratchpad(node.source):
            raise PlanError(f"{self.name}: no {self.planner.prefix} rule matched this read of scratchpad buffer "
                            f"{node.source.name}, so it cannot run: {node}")
        return mut.default_mutate(node)

    def run(self, body):
        return tvm_ffi.structural_mutate(body, [
            (tirx.Stmt, self.on_stmt), (ir.TensorLoad, self.on_load), (ir.Call, self.on_call),
            (ir.Type, lambda n, m: n)])
