"""Scratchpad planning: the pass that runs right after accel's rewrite rules.

- every buffer in a scratchpad scope gets an address; one allocated inside a loop gets two
  copies used alternately (double buffering), so that the LOAD of the next tile can run
  while the GEMM reads the current one. The allocations disappear from the TIR;
- ``buffer.access_ptr(...)`` operands of accel calls become those addresses;
- a scratchpad access no rule rewrote, an accel call in a ``parallel`` loop, CPU code
  touching a buffer between the accel calls that use it and the sync, and an accumulator
  read again after an epilogue overwrote it in place (later on, or in the next iteration of
  an enclosing loop) are errors naming the statement; scratchpad overflow names the buffer
  and by how much;
- ``accel.sync()`` is inserted after each top-level statement that calls the accelerator.

>>> mod = plan_pass(accel.Config())(mod)        # doctest: +SKIP
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import ir, tirx

from accel.config import Config
from accel.isa import Mem
from accel.rules import IN_PLACE, SCOPES, is_scratchpad


_ANALYZER = tvm.sym.Analyzer()


@tvm_ffi.register_error
class PlanError(ValueError):
    """The rewritten function cannot run on the accelerator; the message names the cause."""


@tvm_ffi.register_error
class ScratchpadOverflow(PlanError):
    """The live scratchpad buffers do not fit."""


def _capacity(config: Config, mem: Mem) -> int:
    return {Mem.INP: config.inp_elements, Mem.WGT: config.wgt_elements, Mem.ACC: config.acc_elements}[mem]


def _is_accel_call(node) -> bool:
    return (isinstance(node, ir.Call) and node.op.name == "tirx.tvm_call_packed"
            and isinstance(node.args[0], ir.StringImm) and node.args[0].value.startswith("accel."))


def _calls_accel(stmt) -> bool:
    found = []

    def on_call(c):
        if _is_accel_call(c):
            found.append(c)
            return tvm_ffi.VisitInterrupt(c)
        return None

    return tvm_ffi.structural_walk(stmt, (ir.Call, on_call)) is not None


def _snippet(stmt) -> str:
    lines = [l for l in str(stmt).strip().splitlines() if l.strip() and not l.lstrip().startswith("#")]
    lines = [l for l in lines if "T.Buffer(" not in l]
    return (lines[-1] if lines else type(stmt).__name__).strip()


class _Planner:
    def __init__(self, config: Config, name: str):
        self.config = config
        self.name = name
        self.loops: list = []
        self.top = {m: 0 for m in Mem}
        self.live: dict[Mem, list] = {m: [] for m in Mem}
        self.addr: dict = {}

    def alloc(self, buf):
        mem = SCOPES[buf.scope()]
        t = self.config.tile
        size = 1
        for d in buf.shape:
            if not isinstance(d, tirx.IntImm):
                raise PlanError(f"{self.name}: scratchpad buffer {buf.name} has the non-constant shape {list(buf.shape)}")
            size *= int(d.value)
        size = -(-size // t) * t
        copies = 2 if self.loops else 1
        base = self.top[mem]
        end = base + copies * size
        cap = _capacity(self.config, mem)
        if end > cap:
            item = 1 if mem is not Mem.ACC else 4
            live = ", ".join(f"{b.name} ({n} x {s} elements)" for b, n, s in self.live[mem]) or "nothing else"
            raise ScratchpadOverflow(
                f"{self.name}: scratchpad {mem.name} overflows by {(end - cap) * item} bytes when allocating "
                f"{buf.name} ({copies} x {size} elements; live: {live}; capacity {cap * item} bytes)")
        self.top[mem] = end
        self.live[mem].append((buf, copies, size))
        offset = tirx.IntImm("int32", base)
        if copies == 2:
            it = tirx.IntImm("int32", 0)
            for l in self.loops:
                it = it * l.extent + (l.loop_var - l.min)
            offset = offset + tirx.floormod(it, 2) * size
        self.addr[buf.__chandle__()] = offset

    def on_seq(self, seq, mut):
        _check_in_place(list(seq.seq), self.name)
        saved = dict(self.top)
        saved_live = {m: list(v) for m, v in self.live.items()}
        out = []
        for s in seq.seq:
            if isinstance(s, tirx.AllocBuffer) and is_scratchpad(s.buffer):
                self.alloc(s.buffer)
                continue
            out.append(mut.mutate(s))
        self.top, self.live = saved, saved_live
        if not out:
            return tirx.Evaluate(tirx.IntImm("int32", 0))
        return out[0] if len(out) == 1 else tirx.SeqStmt(out)

    def on_stmt(self, node, mut):
        if isinstance(node, tirx.SeqStmt):
            return self.on_seq(node, mut)
        if isinstance(node, tirx.AttrStmt) and node.attr_key == IN_PLACE:
            return mut.mutate(node.body)
        if isinstance(node, tirx.AllocBuffer) and is_scratchpad(node.buffer):
            self.alloc(node.buffer)
            return tirx.Evaluate(tirx.IntImm("int32", 0))
        if isinstance(node, tirx.For):
            if int(node.kind) == int(tirx.ForKind.PARALLEL) and _calls_accel(node):
                raise PlanError(f"{self.name}: accelerator calls inside the parallel loop "
                                f"'{node.loop_var.name}' are not supported (the stream is one sequence)")
            self.loops.append(node)
            try:
                planned = mut.default_mutate(node)
            finally:
                self.loops.pop()
            # after the body: an access no rule matched inside it is the error to report first
            _check_loop_carried(node, self.name)
            return planned
        if isinstance(node, tirx.BufferStore) and is_scratchpad(node.buffer):
            raise PlanError(f"{self.name}: no accel rule matched this access to scratchpad buffer "
                            f"{node.buffer.name}, so it cannot run: {_snippet(node)}")
        return mut.default_mutate(node)

    def on_call(self, node, mut):
        if node.op.name == "tirx.tvm_access_ptr":
            data = node.args[1]
            if isinstance(data, ir.Call) and data.op.name == "tirx.buffer_data":
                buf = data.args[0]
                if is_scratchpad(buf):
                    base = self.addr.get(buf.__chandle__())
                    if base is None:
                        raise PlanError(f"{self.name}: scratchpad buffer {buf.name} is used before it is allocated")
                    return _ANALYZER.simplify(base + node.args[2])
        return mut.default_mutate(node)

    def on_load(self, node, mut):
        if tirx.is_buffer_var(node.source) and is_scratchpad(node.source):
            raise PlanError(f"{self.name}: no accel rule matched this read of scratchpad buffer "
                            f"{node.source.name}, so it cannot run: {node}")
        return mut.default_mutate(node)

    def run(self, body):
        return tvm_ffi.structural_mutate(body, [
            (tirx.Stmt, self.on_stmt), (ir.TensorLoad, self.on_load), (ir.Call, self.on_call),
            (ir.Type, lambda n, m: n)])


# For each accel call, which operand addresses it reads: (argument index, reads, writes).
_OPERANDS = {
    "accel.load": lambda args: [(4, False, True)],
    "accel.store": lambda args: [(3, True, False)],
    "accel.gemm": lambda args: [(2, not _is_one(args[1]), True), (3, True, False), (4, True, False)],
    "accel.alu": lambda args: [(3, True, True)] + ([] if _is_one(args[2]) else [(4, True, False)]),
}


def _is_one(e) -> bool:
    return isinstance(e, tirx.IntImm) and e.value == 1


def _scratch_uses(stmt) -> list:
    """``(buffer, reads, writes, offset)`` for every scratchpad operand of the accel calls in
    ``stmt``, in program order (``offset``: the element offset into the buffer)."""
    uses = []

    def on_call(c):
        if not _is_accel_call(c):
            return
        roles = _OPERANDS.get(c.args[0].value)
        for index, reads, writes in (roles(c.args) if roles else []):
            ptr = c.args[index]
            if isinstance(ptr, ir.Call) and ptr.op.name == "tirx.tvm_access_ptr":
                data = ptr.args[1]
                if isinstance(data, ir.Call) and data.op.name == "tirx.buffer_data":
                    uses.append((data.args[0], reads, writes, ptr.args[2]))

    tvm_ffi.structural_walk(stmt, (ir.Call, on_call))
    return uses


def _uses_in_order(stmt, buf, first=(), conditional=False):
    """``(reads, conditional, stmt)`` for each use of ``buf`` by an accel call in ``stmt``, in
    program order, on the first iteration of the loops inside ``stmt`` (``first``: the
    ``(var, min)`` of those entered so far); ``conditional`` when under an ``if`` that the
    first iteration does not decide, or another statement whose body may not run."""
    kind = type(stmt)
    if kind is tirx.SeqStmt:
        for s in stmt.seq:
            yield from _uses_in_order(s, buf, first, conditional)
    elif kind is tirx.For:
        yield from _uses_in_order(stmt.body, buf, first + ((stmt.loop_var, stmt.min),), conditional)
    elif kind is tirx.AttrStmt:
        yield from _uses_in_order(stmt.body, buf, first, conditional)
    elif kind is tirx.IfThenElse:
        at = {v.__chandle__(): m for v, m in first}
        cond = _ANALYZER.simplify(tvm_ffi.structural_map(stmt.condition, (ir.Var, lambda v: at.get(v.__chandle__(), v))))
        known = cond.value if isinstance(cond, tirx.IntImm) else None
        if known != 0:
            yield from _uses_in_order(stmt.then_case, buf, first, conditional or known is None)
        if known != 1 and stmt.else_case is not None:
            yield from _uses_in_order(stmt.else_case, buf, first, conditional or known is None)
    else:
        maybe = conditional or kind is not tirx.Evaluate
        for b, reads, _, _ in _scratch_uses(stmt):
            if b.same_as(buf):
                yield reads, maybe, stmt


def _check_in_place(stmts, name):
    """An epilogue that overwrote an accumulator in place must be its last reader."""
    for n, stmt in enumerate(stmts):
        clobbered = []
        tvm_ffi.structural_walk(stmt, (tirx.AttrStmt, lambda a: clobbered.append(a.node) if a.attr_key == IN_PLACE else None))
        for buf in clobbered:
            for later in stmts[n + 1:]:
                uses = [(reads, writes) for b, reads, writes, _ in _scratch_uses(later) if b.same_as(buf)]
                if any(reads for reads, _ in uses):
                    raise PlanError(f"{name}: an epilogue computed {buf.name} in place for its store, but "
                                    f"{buf.name} is read again afterwards: {_snippet(later)}")
                if uses:
                    break


def _check_loop_carried(loop, name):
    """An epilogue that overwrote an accumulator in place inside ``loop``: the loop's next
    iteration must write that accumulator anew before it reads it (a GEMM in reset form, a
    LOAD), whichever part of it the read is of (conservative: regions are not compared)."""
    if isinstance(loop.extent, tirx.IntImm) and loop.extent.value == 1:
        return
    clobbered = []
    tvm_ffi.structural_walk(loop.body, (tirx.AttrStmt, lambda a: clobbered.append(a.node) if a.attr_key == IN_PLACE else None))
    for buf in clobbered:
        for reads, conditional, stmt in _uses_in_order(loop.body, buf):
            if reads:
                raise PlanError(f"{name}: an epilogue computed {buf.name} in place for its store inside loop "
                                f"'{loop.loop_var.name}', but the loop's next iteration reads {buf.name} before "
                                f"writing it anew: {_snippet(stmt)} (store the result after the loop that "
                                f"accumulates instead, e.g. reverse_compute_at an outer loop)")
            if not conditional:
                break  # written anew first


def _host_buffers_of_calls(stmt) -> dict:
    found = {}

    def on_call(c):
        if _is_accel_call(c):
            for v in _buffers_in(c):
                found[v.__chandle__()] = v

    tvm_ffi.structural_walk(stmt, (ir.Call, on_call))
    return found


def _buffers_in(node) -> list:
    out = []

    def on_var(v):
        if tirx.is_buffer_var(v):
            out.append(v)

    tvm_ffi.structural_walk(node, (ir.Var, on_var))
    return out


def _check_cpu_hazards(stmt, name):
    shared = _host_buffers_of_calls(stmt)
    if not shared:
        return

    def check(buf, node):
        if buf.__chandle__() in shared:
            raise PlanError(f"{name}: CPU code touches {buf.name} between the accelerator calls that use "
                            f"it and the next sync: {_snippet(node)}")

    tvm_ffi.structural_walk(stmt, [(tirx.BufferStore, lambda s: check(s.buffer, s)),
                                   (ir.TensorLoad, lambda l: check(l.source, l))])


def _touches_memory(stmt) -> bool:
    found = []
    tvm_ffi.structural_walk(stmt, [(tirx.BufferStore, found.append), (ir.TensorLoad, found.append),
                                   (ir.Call, lambda c: found.append(c) if not _is_accel_call(c) else None)])
    return bool(found)


def _with_syncs(body, name):
    """Sync after each run of top-level statements that call the accelerator, before the
    CPU code that follows it (the instructions only execute at the sync)."""
    stmts = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    out, group = [], []

    def close():
        if group:
            _check_cpu_hazards(tirx.SeqStmt(group) if len(group) > 1 else group[0], name)
            out.extend(group)
            out.append(tirx.Evaluate(tirx.call_packed("accel.sync")))
            group.clear()

    for s in stmts:
        if _calls_accel(s):
            group.append(s)
        elif group and not _touches_memory(s):
            group.append(s)     # an allocation or a no-op does not need the results
        else:
            close()
            out.append(s)
    close()
    return out[0] if len(out) == 1 else tirx.SeqStmt(out)


def plan(func: tirx.PrimFunc, config: Config) -> tirx.PrimFunc:
    """Plan one PrimFunc (see the module docstring)."""
    name = str(func.attrs["global_symbol"]) if func.attrs is not None and "global_symbol" in func.attrs else "main"
    body = _Planner(config, name).run(func.body)
    if not _calls_accel(body):
        return func.with_body(body)
    return func.with_body(_with_syncs(body, name))


def plan_pass(config: Config) -> tvm.transform.Pass:
    """:func:`plan` as a PrimFunc pass."""
    return tirx.transform.prim_func_pass(lambda f, mod, ctx: plan(f, config), opt_level=0,
                                         name="accel.PlanScratchpads")
