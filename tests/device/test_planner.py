"""The generic scratchpad planner on a made-up backend with two scratchpads."""

import dataclasses

import pytest
import tvm
from tvm import tirx
from tvm.script import tirx as T

from tirpat.device import Memory, PlanError, ScratchpadOverflow, ScratchpadPlanner

PADS = [Memory("A", "local.pt_a", "int8", capacity=64, align=16),
        Memory("B", "local.pt_b", "int32", capacity=32, align=8)]


def planner(double_buffer=True):
    return ScratchpadPlanner("pt", [dataclasses.replace(m, double_buffer=double_buffer) for m in PADS])


def addresses(func, **kw):
    p = planner(**kw)
    return [str(c.args[1]) for c in p.runtime_calls(p.plan(func).body) if c.args[0].value == "pt.use"]


@T.prim_func
def stacked(X: T.Buffer((8,), "int32")):
    a0 = T.alloc_buffer((10,), "int8", scope="local.pt_a")       # rounded up to 16
    b0 = T.alloc_buffer((3,), "int32", scope="local.pt_b")       # rounded up to 8
    T.call_packed("pt.use", a0.access_ptr("w", offset=2), X)
    T.call_packed("pt.use", b0.access_ptr("w"), X)
    for i in range(2):
        a1 = T.alloc_buffer((16,), "int8", scope="local.pt_a")   # two copies: 16 + i % 2 * 16
        T.call_packed("pt.use", a1.access_ptr("w"), X)
    X[0] = 1


def test_addresses_are_aligned_stacked_and_double_buffered_in_loops():
    assert addresses(stacked) == ["2", "0", "i % 2 * 16 + 16"]
    assert addresses(stacked, double_buffer=False) == ["2", "0", "16"]


def test_syncs_go_after_the_runtime_calls_and_before_the_cpu_code_and_begin_first():
    p = planner()
    body = p.plan(stacked).body
    assert isinstance(body, tirx.SeqStmt)
    names = [s.value.args[0].value if isinstance(s, tirx.Evaluate) else type(s).__name__ for s in body.seq]
    assert names == ["pt.begin", "IfThenElse", "BufferStore"]
    group = body.seq[1].then_case      # a static group: asks for a replay first
    names = [s.value.args[0].value if isinstance(s, tirx.Evaluate) else type(s).__name__ for s in group.seq]
    assert names == ["pt.use", "pt.use", "For", "pt.sync"]


def _shape(body):
    """Top-level statements of a planned body as names, a group's ``if`` as the list of its."""
    def name(s):
        if isinstance(s, tirx.Evaluate):
            return s.value.args[0].value
        if isinstance(s, tirx.IfThenElse):
            return [name(x) for x in s.then_case.seq]
        return type(s).__name__
    return [name(s) for s in body.seq]


_GROUPS = """
@T.prim_func
def f(T_: T.Buffer((16,), "int8"), X: T.Buffer((16,), "int8"), Y: T.Buffer((16,), "int8")):
    T.call_packed("pt.use", 0, T_)
    tmp = T.alloc_buffer((16,), "int8")
    for i in range(16):
        {cpu}
    T.call_packed("pt.use", 0, tmp, Y)
"""


def test_cpu_code_apart_from_the_pending_calls_runs_before_them_in_one_group():
    # an im2col (X into tmp) after an activation table's load: one group, one sync
    func = tvm.script.from_source(_GROUPS.format(cpu="tmp[i] = X[15 - i] + T.int8(1)"))
    assert _shape(planner().plan(func).body) == ["pt.begin", "AllocBuffer", "For",
                                                 ["pt.use", "pt.use", "pt.sync"]]


@pytest.mark.parametrize("cpu", [
    "tmp[i] = T_[i]",                                     # reads what the pending call uses
    "T_[i] = X[i]",                                       # writes it
    "tmp[i] = T.call_extern('int8', 'peek', X.data, i)",  # an outside function could touch anything
], ids=["reads its buffer", "writes its buffer", "calls a function"])
def test_cpu_code_that_may_share_memory_with_the_pending_calls_waits_for_their_sync(cpu):
    func = tvm.script.from_source(_GROUPS.format(cpu=cpu))
    assert _shape(planner().plan(func).body) == ["pt.begin", "AllocBuffer", ["pt.use", "pt.sync"], "For",
                                                 ["pt.use", "pt.sync"]]


def test_functions_without_runtime_calls_are_left_alone():
    @T.prim_func
    def cpu(X: T.Buffer((8,), "int32")):
        X[0] = 1

    assert "sync" not in planner().plan(cpu).script()


@T.prim_func
def too_big(X: T.Buffer((8,), "int32")):
    a0 = T.alloc_buffer((40,), "int8", scope="local.pt_a")
    a1 = T.alloc_buffer((20,), "int8", scope="local.pt_a")
    T.call_packed("pt.use", a0.access_ptr("w"), a1.access_ptr("w"), X)


def test_overflow_names_the_scratchpad_the_buffer_and_what_else_is_live():
    with pytest.raises(ScratchpadOverflow, match=r"too_big: scratchpad A overflows by 16 bytes when allocating "
                                                 r"a1 \(1 x 32 elements; live: a0 \(1 x 48 elements\); capacity 64 bytes\)"):
        planner().plan(too_big.with_attr("global_symbol", "too_big"))


def test_buffers_freed_at_the_end_of_their_sequence_give_their_space_back():
    @T.prim_func
    def scoped(X: T.Buffer((8,), "int32")):
        for i in range(3):
            for j in range(1):
                a = T.alloc_buffer((32,), "int8", scope="local.pt_a")
                T.call_packed("pt.use", a.access_ptr("w"), X)
            for k in range(1):
                b = T.alloc_buffer((32,), "int8", scope="local.pt_a")
                T.call_packed("pt.use", b.access_ptr("w"), X)

    assert len(addresses(scoped)) == 2      # each takes 2 x 32 of 64 elements, one after the other


@pytest.mark.parametrize("source, message", [
    ("""
@T.prim_func
def f(X: T.Buffer((16,), "int8")):
    a = T.alloc_buffer((16,), "int8", scope="local.pt_a")
    for i in range(16):
        a[i] = X[i]
""", r"no pt rule matched this access to scratchpad buffer a, so it cannot run: a\[i\] = X\[i\]"),
    ("""
@T.prim_func
def f(X: T.Buffer((16,), "int8")):
    a = T.alloc_buffer((16,), "int8", scope="local.pt_a")
    T.call_packed("pt.use", a.access_ptr("w"), X)
    for i in range(16):
        X[i] = a[i]
""", r"no pt rule matched this read of scratchpad buffer a"),
    ("""
@T.prim_func
def f(X: T.Buffer((16,), "int8")):
    for i in T.parallel(4):
        T.call_packed("pt.use", i, X)
""", r"pt calls inside the parallel loop 'i' are not supported"),
    ("""
@T.prim_func
def f(X: T.Buffer((16,), "int8")):
    for i in range(2):
        T.call_packed("pt.use", 0, X)
        X[i] = T.int8(1)
""", r"CPU code touches X between the pt calls that use it and the next sync: X\[i\] = T.int8\(1\)"),
    ("""
@T.prim_func
def f(X: T.Buffer((16,), "int8"), n: T.int32):
    a = T.alloc_buffer((n,), "int8", scope="local.pt_a")
    T.call_packed("pt.use", a.access_ptr("w"), X)
""", r"scratchpad buffer a has the non-constant shape"),
    ("""
@T.prim_func
def f(X: T.Buffer((16,), "int8")):
    a = T.alloc_buffer((16,), "int8", scope="local.pt_a")
    T.call_packed("pt.use", a.access_ptr("w"), X)
    T.call_packed("pt.use", 0, a)
""", r"scratchpad buffer a is used as host memory; only operands written a.access_ptr\(...\) get"),
], ids=["unmatched store", "unmatched load", "parallel", "cpu hazard", "dynamic shape", "as host memory"])
def test_what_cannot_run_is_named(source, message):
    with pytest.raises(PlanError, match=message):
        planner().plan(tvm.script.from_source(source))


def test_markers_are_removed_and_hooks_see_every_sequence_and_loop():
    seen = []

    class Checked(ScratchpadPlanner):
        def check_sequence(self, stmts, func_name):
            seen.append(("seq", len(stmts), func_name))

        def check_loop(self, loop, func_name):
            seen.append(("loop", loop.loop_var.name))

    marked = stacked.with_body(tirx.AttrStmt(tirx.IntImm("int32", 0), "pt.marker", tirx.IntImm("int32", 1),
                                             stacked.body))
    planned = Checked("pt", PADS).plan(marked)
    assert "pt.marker" not in planned.script()
    assert seen == [("seq", 6, "stacked"), ("seq", 2, "stacked"), ("loop", "i")]


def test_a_pass_plans_every_primfunc_of_a_module():
    mod = planner().as_pass()(tvm.IRModule({"main": stacked}))
    assert "alloc_buffer" not in mod["main"].script()
    with pytest.raises(ValueError, match="two memories share a storage scope"):
        ScratchpadPlanner("pt", PADS + PADS[:1])


def test_a_strided_buffer_takes_its_rows_strides_not_its_shape():
    # 2 rows of 3 at a row stride of 16 span 19 elements (rows padded for alignment, as
    # storage_align leaves them): the next buffer starts after them, not after 6
    @T.prim_func
    def strided(X: T.Buffer((8,), "int32")):
        a0 = T.alloc_buffer((2, 3), "int8", strides=(16, 1), scope="local.pt_a")
        a1 = T.alloc_buffer((16,), "int8", scope="local.pt_a")
        T.call_packed("pt.use", a0.access_ptr("w"), X)
        T.call_packed("pt.use", a1.access_ptr("w"), X)

    assert addresses(strided) == ["0", "32"]
