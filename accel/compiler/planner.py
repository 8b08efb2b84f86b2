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

import itertools

import tvm
import tvm_ffi
from tvm import ir, tirx

from accel.hw.config import Config
from accel.hw.isa import Mem
from accel.compiler.rules import IN_PLACE, SCOPES, is_scratchpad


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
        _check_in_place(list(seq.seq), self.name, self.config.tile)
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
            _check_loop_carried(node, self.name, self.config.tile)
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


def _uses_in_order(stmt, buf, tile, inner=(), conditional=False):
    """``(reads, written, stmt)`` for each accel call using ``buf`` in ``stmt``, in program
    order (loops inside ``stmt`` taken at their first iteration; ``inner``: the ``(var, min,
    extent)`` of those entered so far). ``written``: the elements of ``buf`` the call surely
    writes without reading, over all iterations of those loops (empty under an ``if`` the
    first iteration leaves open, or in a loop that may not run)."""
    kind = type(stmt)
    if kind is tirx.SeqStmt:
        for s in stmt.seq:
            yield from _uses_in_order(s, buf, tile, inner, conditional)
    elif kind is tirx.For:
        runs = isinstance(stmt.extent, tirx.IntImm) and stmt.extent.value > 0
        yield from _uses_in_order(stmt.body, buf, tile, inner + ((stmt.loop_var, stmt.min, stmt.extent),),
                                  conditional or not runs)
    elif kind is tirx.AttrStmt:
        yield from _uses_in_order(stmt.body, buf, tile, inner, conditional)
    elif kind is tirx.IfThenElse:
        cond = _at(stmt.condition, [(v, m) for v, m, _ in inner])
        known = cond.value if isinstance(cond, tirx.IntImm) else None
        if known != 0:
            yield from _uses_in_order(stmt.then_case, buf, tile, inner, conditional or known is None)
        if known != 1 and stmt.else_case is not None:
            yield from _uses_in_order(stmt.else_case, buf, tile, inner, conditional or known is None)
    else:
        certain = not conditional and kind is tirx.Evaluate
        for c in _accel_calls(stmt):
            uses = [(reads, offset) for b, reads, _, offset in _scratch_uses(c) if b.same_as(buf)]
            if uses:
                reads = any(r for r, _ in uses)
                written = _written(c, uses[0][1], tile, inner) if certain and not reads else set()
                yield reads, written, stmt


def _at(expr, values):
    """``expr`` with each ``(var, value)`` substituted, simplified."""
    at = {v.__chandle__(): m for v, m in values}
    return _ANALYZER.simplify(tvm_ffi.structural_map(expr, (ir.Var, lambda v: at.get(v.__chandle__(), v))))


def _int_at(arg, values) -> int | None:
    if isinstance(arg, tirx.IntImm):
        return arg.value
    if not str(getattr(getattr(arg, "ty", None), "dtype", "")).startswith("int"):
        return None
    value = _at(arg, values)
    return value.value if isinstance(value, tirx.IntImm) else None


def _accel_calls(stmt) -> list:
    found = []
    tvm_ffi.structural_walk(stmt, (ir.Call, lambda c: found.append(c) if _is_accel_call(c) else None))
    return found


def _written(c, offset, tile, inner) -> set:
    """The elements a GEMM in reset form or a LOAD writes from ``offset`` on, over every
    iteration of the ``inner`` loops around it; empty when its arguments are not constant."""
    extents = [_int_at(e, []) for _, _, e in inner]
    if None in extents or any(e > 64 for e in extents):
        return set()
    out: set = set()
    for point in itertools.product(*(range(e) for e in extents)):
        values = [(v, m + p) for (v, m, _), p in zip(inner, point)]
        vals = [_int_at(a, values) for a in c.args[1:]]
        base = _int_at(offset, values)
        op = c.args[0].value
        if base is None:
            return set()
        if op == "accel.gemm" and vals[0] == 1 and None not in vals[4:11]:
            ld, ext_out, ext_in, so, si = vals[4], vals[7], vals[8], vals[9], vals[10]
            for o in range(ext_out):
                for i in range(ext_in):
                    for r in range(tile):
                        start = base + o * so + i * si + r * ld
                        out.update(range(start, start + tile))
        elif op == "accel.load" and None not in vals[4:12]:
            ld, rows, cols, pt, pb, pl, pr = vals[4], vals[5], vals[6], vals[8], vals[9], vals[10], vals[11]
            for r in range(pt + rows + pb):
                out.update(range(base + r * ld, base + r * ld + pl + cols + pr))
        else:
            return set()
    return out


def _elements(buf) -> set | None:
    size = 1
    for d in buf.shape:
        if not isinstance(d, tirx.IntImm):
            return None
        size *= d.value
    return set(range(size))


def _first_unsafe_read(stmt, buf, tile):
    """The statement that reads ``buf`` in ``stmt`` before all of it has been written anew, or None."""
    everything = _elements(buf)
    written: set = set()
    for reads, new, at in _uses_in_order(stmt, buf, tile):
        if reads:
            return at
        written |= new
        if everything is not None and written >= everything:
            return None
    return None


def _clobbered(stmt) -> list:
    """The accumulators an in-place epilogue in ``stmt`` overwrites."""
    found = []
    tvm_ffi.structural_walk(stmt, (tirx.AttrStmt, lambda a: found.append(a.node) if a.attr_key == IN_PLACE else None))
    return found


def _check_in_place(stmts, name, tile):
    """An epilogue that overwrote an accumulator in place must be its last reader, until the
    whole accumulator is written anew."""
    for n, stmt in enumerate(stmts):
        for buf in _clobbered(stmt):
            rest = stmts[n + 1:]
            later = None if not rest else _first_unsafe_read(rest[0] if len(rest) == 1 else tirx.SeqStmt(rest),
                                                             buf, tile)
            if later is not None:
                raise PlanError(f"{name}: an epilogue computed {buf.name} in place for its store, but "
                                f"{buf.name} is read again afterwards: {_snippet(later)}")


def _check_loop_carried(loop, name, tile):
    """An epilogue that overwrote an accumulator in place inside ``loop``: the loop's next
    iteration must write the whole accumulator anew (GEMMs in reset form, LOADs) before
    anything reads any part of it (conservative: the regions read are not compared)."""
    if isinstance(loop.extent, tirx.IntImm) and loop.extent.value == 1:
        return
    for buf in _clobbered(loop.body):
        stmt = _first_unsafe_read(loop.body, buf, tile)
        if stmt is not None:
            raise PlanError(f"{name}: an epilogue computed {buf.name} in place for its store inside loop "
                            f"'{loop.loop_var.name}', but the loop's next iteration reads {buf.name} before "
                            f"writing it anew: {_snippet(stmt)} (store the result after the loop that "
                            f"accumulates instead, e.g. reverse_compute_at an outer loop)")


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
