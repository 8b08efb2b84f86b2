"""Sessions and runtime functions: a small vector unit built from the kit alone runs compiled
code; errors are relayed as themselves; failed calls are atomic; threads never share a
session by accident and take turns when they share one on purpose."""

import contextlib
import threading
import time

import numpy as np
import pytest
import tvm
from hypothesis import given
from hypothesis import strategies as st
from tvm.script import tirx as T

import tirpat as tp
from tirpat import device


# -- a 16-lane int32 vector unit: its whole runtime --------------------------------------
class VecSession(device.Session):
    """A register file of 64 int32 elements; instructions run at sync."""

    def __init__(self):
        super().__init__()
        self.regs = np.zeros(64, np.int32)

    def reg(self, addr):
        return device.strided_view(self.regs, addr, (16,), what="register file")


VEC = device.Runtime("devtest_vec", VecSession)


@VEC.function
def load(s, addr, host, offset):
    src, dst = s.buffers.view(s.buffers.slot(host), offset, (16,)), s.reg(addr)
    s.enqueue(lambda: dst.__setitem__(Ellipsis, src))


@VEC.function
def add(s, dst, src):
    d, a = s.reg(dst), s.reg(src)
    s.enqueue(lambda: np.add(d, a, out=d))


@VEC.function
def store(s, host, offset, addr):
    out, src = s.buffers.view(s.buffers.slot(host), offset, (16,), write=True), s.reg(addr)
    s.enqueue(lambda: out.__setitem__(Ellipsis, src))


class Refused(Exception):
    """An exception TVM's FFI cannot rebuild (two constructor arguments)."""

    def __init__(self, what, why):
        super().__init__(f"{what}: {why}")
        self.what = what


@VEC.function
def refuse(s, n):
    raise Refused("refuse", f"n={n}")


PLANNER = device.ScratchpadPlanner("devtest_vec", [device.Memory("VREG", "local.devtest_vec", "int32", 64, 16)])
tvm.tirx.compilation_pipeline.register_tir_pipeline("devtest_vec", tp.tir_pipeline(PLANNER.as_pass()))


@T.prim_func
def vadd(A: T.Buffer((64,), "int32"), B: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "main"})
    for i in range(4):
        va = T.alloc_buffer((16,), "int32", scope="local.devtest_vec")
        vb = T.alloc_buffer((16,), "int32", scope="local.devtest_vec")
        T.call_packed("devtest_vec.load", va.access_ptr("w"), A, i * 16)
        T.call_packed("devtest_vec.load", vb.access_ptr("w"), B, i * 16)
        T.call_packed("devtest_vec.add", va.access_ptr("rw"), vb.access_ptr("r"))
        T.call_packed("devtest_vec.store", C, i * 16, va.access_ptr("r"))


@T.prim_func
def copy_then_fail(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32"), offset: T.int32):
    T.func_attr({"global_symbol": "main"})
    T.call_packed("devtest_vec.load", 0, A, 0)
    T.call_packed("devtest_vec.store", C, 0, 0)
    T.call_packed("devtest_vec.load", 16, A, offset)
    T.call_packed("devtest_vec.sync")


@T.prim_func
def refusing(n: T.int32):
    T.func_attr({"global_symbol": "main"})
    T.call_packed("devtest_vec.refuse", n)


_COMPILED = {}


def compiled(func, pipeline="default"):
    key = (func.script(), pipeline)
    if key not in _COMPILED:
        _COMPILED[key] = tvm.compile(tvm.IRModule({"main": func}), target="llvm", tir_pipeline=pipeline)["main"]
    return _COMPILED[key]


def tensors(*arrays):
    return [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays]


@given(st.lists(st.integers(-2**31, 2**31 - 1), min_size=128, max_size=128))
def test_a_vector_unit_built_from_the_kit_runs_planned_compiled_code(values):
    a, b = np.array(values[:64], np.int32), np.array(values[64:], np.int32)
    ta, tb, tc = tensors(a, b, np.zeros(64, np.int32))
    with VecSession() as s:
        device.invoke(compiled(vadd, "devtest_vec"), ta, tb, tc)
    np.testing.assert_array_equal(tc.numpy(), a + b)      # int32, wrapping like numpy
    assert s.pending == 0 and all(v is None for v in s.buffers.views)


def test_the_planner_double_buffers_the_vector_registers():
    planned = PLANNER.plan(vadd)
    calls = PLANNER.runtime_calls(planned.body)
    register = {"load": 1, "add": 1, "store": 3}
    addresses = [(c.args[0].value.split(".")[1], str(c.args[register[c.args[0].value.split(".")[1]]]))
                 for c in calls[2:-1]]
    assert addresses == [("load", "i % 2 * 16"), ("load", "i % 2 * 16 + 32"), ("add", "i % 2 * 16"),
                         ("store", "i % 2 * 16")]
    assert [c.args[0].value for c in (calls[0], calls[1], calls[-1])] == \
        ["devtest_vec.begin", "devtest_vec.replay", "devtest_vec.sync"]
    assert "alloc_buffer" not in planned.script()


def test_an_exception_in_a_runtime_function_reaches_the_caller_as_itself():
    with pytest.raises(Refused, match="refuse: n=3") as info:
        device.invoke(compiled(refusing), 3)
    assert info.value.what == "refuse"
    with pytest.raises(RuntimeError, match="refuse: n=4"):   # without invoke, TVM's FFI rebuilds it
        compiled(refusing)(4)
    a = tvm.runtime.tensor(np.zeros(64, np.int32))
    with pytest.raises(device.BoundsError, match=r"host buffer slot 0: elements \[60, 76\) are outside"):
        device.invoke(compiled(copy_then_fail), a, a, 60)


@pytest.mark.parametrize("entered", [False, True])
def test_a_failed_call_leaves_nothing_pending(entered):
    ta, tc = tensors(np.arange(64, dtype=np.int32), np.full(64, -1, np.int32))
    s = VecSession() if entered else VEC.default()
    with s if entered else contextlib.nullcontext():
        with pytest.raises(Exception, match=r"elements \[100, 116\) are outside"):
            compiled(copy_then_fail)(ta, tc, 100)              # a bare call, no invoke
        assert s.pending == 0
    s.sync()
    assert (tc.numpy() == -1).all()                            # the STORE before the error never ran
    compiled(copy_then_fail)(ta, tc, 0)
    np.testing.assert_array_equal(tc.numpy()[:16], np.arange(16))


def test_invoke_discards_the_pending_work_of_a_call_that_fails_outside_the_runtime():
    a = np.arange(64, dtype=np.int32)
    out = np.zeros(64, np.int32)

    def call():
        VEC.functions["load"](0, a, 0)
        VEC.functions["store"](out, 0, 0)
        raise KeyError("the host code failed after two instructions")

    with VecSession() as s:
        with pytest.raises(KeyError, match="host code failed"):
            device.invoke(call)
        assert s.pending == 0
    assert not out.any()


@T.prim_func
def copy_then_assert(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32"), bad: T.int32):
    T.func_attr({"global_symbol": "main"})
    T.call_packed("devtest_vec.load", 0, A, 0)
    T.call_packed("devtest_vec.store", C, 0, 0)
    assert bad == 0, "host code failed after two instructions"
    T.call_packed("devtest_vec.sync")


@pytest.mark.parametrize("entered", [False, True])
def test_a_direct_call_that_fails_in_host_code_leaves_nothing_for_the_next_call(entered):
    """No runtime function sees a host-side failure; the next compiled call, from another
    line, finds its work pending and discards it unrun."""
    ta, tc, tout = tensors(np.arange(64, dtype=np.int32), np.full(64, -1, np.int32), np.zeros(64, np.int32))
    with VecSession() if entered else contextlib.nullcontext():
        with pytest.raises(Exception, match="host code failed after two instructions"):
            compiled(copy_then_assert)(ta, tc, 1)
        assert VEC.current().pending == 2                       # nothing could tell the runtime yet
        compiled(copy_then_assert)(ta, tout, 0)                 # the next call, from another line
        assert VEC.current().pending == 0
    assert (tc.numpy() == -1).all()                             # the failed call's STORE never ran
    np.testing.assert_array_equal(tout.numpy()[:16], np.arange(16))


@T.prim_func
def marked_copy_then_assert(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32"), bad: T.int32):
    T.func_attr({"global_symbol": "main"})
    T.call_packed("tirpat.partition_begin", "copy", "devtest", "{}", "devtest_vec")
    T.call_packed("devtest_vec.load", 0, A, 0)
    T.call_packed("devtest_vec.store", C, 0, 0)
    assert bad == 0, "host code failed after two instructions"
    T.call_packed("devtest_vec.sync")


def test_calls_from_one_line_are_told_apart_by_the_code_tirpat_builds():
    """A loop calls from one line: code built by tirpat's pipelines starts each offloaded
    function with a marker (Runtime.begin), which discards what a failed call left."""
    import tirpat.model.pipeline  # noqa: F401 - registers the marker
    a = tvm.runtime.tensor(np.arange(64, dtype=np.int32))
    outs = tensors(*[np.full(64, -1, np.int32)] * 4)
    failed = []
    for n, out in enumerate(outs):
        try:
            compiled(marked_copy_then_assert)(a, out, n % 2)    # calls 1 and 3 fail
        except Exception:  # noqa: BLE001 - counted below
            failed.append(n)
    assert failed == [1, 3] and VEC.default().pending == 2
    compiled(marked_copy_then_assert)(a, tensors(np.zeros(64, np.int32))[0], 0)
    for n, out in enumerate(outs):
        assert (out.numpy()[:16] == (np.arange(16) if n % 2 == 0 else -1)).all(), n


@T.prim_func
def planned_copy_then_assert(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32"), bad: T.int32):
    T.func_attr({"global_symbol": "main"})
    v = T.alloc_buffer((16,), "int32", scope="local.devtest_vec")
    T.call_packed("devtest_vec.load", v.access_ptr("w"), A, 0)
    T.call_packed("devtest_vec.store", C, 0, v.access_ptr("r"))
    assert bad == 0, "host code failed after two instructions"


def test_calls_from_one_line_are_told_apart_in_the_code_the_planner_plans():
    """The planner puts <prefix>.begin() first, so calls from one line (a loop) that fail
    in host code leave nothing for the next call either."""
    a = tvm.runtime.tensor(np.arange(64, dtype=np.int32))
    outs = tensors(*[np.full(64, -1, np.int32)] * 4)
    run = compiled(planned_copy_then_assert, "devtest_vec")
    failed = []
    for n, out in enumerate(outs):
        try:
            run(a, out, n % 2)                                  # calls 1 and 3 fail
        except Exception:  # noqa: BLE001 - counted below
            failed.append(n)
    assert failed == [1, 3] and VEC.default().pending == 2
    run(a, tensors(np.zeros(64, np.int32))[0], 0)
    for n, out in enumerate(outs):
        assert (out.numpy()[:16] == (np.arange(16) if n % 2 == 0 else -1)).all(), n


def test_a_runtime_begin_checks_the_options_the_code_was_built_for():
    class Sized(VecSession):
        def __init__(self, lanes):
            super().__init__()
            self.options = {"lanes": lanes}

    runtime = device.Runtime("devtest_sized", Sized, default=lambda key: Sized(16))
    with Sized(8) as s:
        assert runtime.begin({"lanes": 8, "other": 1}, "f") is s       # options it does not name: not its concern
        with pytest.raises(device.OptionsMismatch, match="f was built for devtest_sized with lanes=16, but the "
                                                         "current devtest_sized session \\(Sized\\) has lanes=8") as info:
            runtime.begin({"lanes": 16}, "f")
    assert (info.value.built, info.value.said, info.value.runtime) == ({"lanes": 16}, {"lanes": 8}, "devtest_sized")
    with pytest.raises(device.OptionsMismatch, match="this thread's default devtest_sized session"):
        runtime.begin({"lanes": 8}, "f")
    with pytest.raises(device.OptionsMismatch, match="does not say which options it runs"):
        with VecSession():
            VEC.begin({"lanes": 8}, "f")
    assert VEC.begin(None) is VEC.default()                      # code that carries no options


def test_read_only_options_found_to_agree_are_not_compared_again():
    """A model's partitions all carry one read-only mapping of options (the marker's), which
    a session with read-only options of its own compares once, not at each partition; other
    options are still compared, and refused when they differ."""
    from types import MappingProxyType

    compared = []

    class Counted(dict):
        def __eq__(self, other):
            compared.append(1)
            return super().__eq__(other)

    class Fixed(VecSession):
        options = MappingProxyType(Counted(lanes=16))

    runtime = device.Runtime("devtest_fixed", Fixed)
    code = MappingProxyType({"lanes": 16})
    with Fixed() as s:
        assert runtime.begin(code, "f") is s
        once = len(compared)
        for _ in range(3):
            assert runtime.begin(code, "f") is s
        assert once and len(compared) == once
        assert runtime.begin({"lanes": 16}, "g") is s and len(compared) > once     # a mapping that may change
        with pytest.raises(device.OptionsMismatch, match="lanes=8"):
            runtime.begin(MappingProxyType({"lanes": 8}), "h")
        assert runtime.begin(code, "f") is s


@T.prim_func
def outer_calls_back(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "main"})
    T.call_packed("devtest_vec.load", 0, A, 0)
    T.call_packed("devtest.callback", A)
    T.call_packed("devtest_vec.add", 0, 16)
    T.call_packed("devtest_vec.store", C, 0, 0)
    T.call_packed("devtest_vec.sync")


@T.prim_func
def inner_loads(A: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "main"})
    T.call_packed("devtest_vec.begin")                  # as planned code starts
    T.call_packed("devtest_vec.load", 16, A, 16)


def test_compiled_code_called_back_from_a_call_is_part_of_that_call():
    """A Python function that compiled code calls back, and that calls compiled code in turn,
    adds to the outer call's stream (it is not a failed call's leftover)."""
    tvm.register_global_func("devtest.callback", lambda a: compiled(inner_loads)(a), override=True)
    ta, tc = tensors(np.arange(64, dtype=np.int32), np.zeros(64, np.int32))
    with VecSession():
        compiled(outer_calls_back)(ta, tc)
    np.testing.assert_array_equal(tc.numpy()[:16], np.arange(16) + np.arange(16, 32))


def test_each_thread_has_its_own_default_and_its_own_stack():
    seen = {}
    main_default = VEC.default()

    def work(name):
        seen[name] = (VEC.current(), VEC.entered())

    with VecSession() as s:
        t = threading.Thread(target=work, args=("thread",))
        t.start()
        t.join()
        assert VEC.current() is s
    thread_current, thread_entered = seen["thread"]
    assert thread_entered is None and thread_current is not main_default and thread_current is not s
    assert VEC.current() is main_default


def _in_threads(*targets) -> None:
    """Run each target on a thread of its own, all at once, and wait for them (a minute at most)."""
    threads = [threading.Thread(target=target) for target in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)


def test_threads_sharing_a_session_take_turns_per_stream():
    s = VecSession()
    log = []
    a_started, b_trying = threading.Event(), threading.Event()

    def first():
        s.enqueue(lambda: log.append("a1"))
        a_started.set()
        b_trying.wait()
        s.enqueue(lambda: log.append("a2"))
        s.sync()

    def second():
        a_started.wait()
        b_trying.set()
        s.enqueue(lambda: log.append("b1"))     # waits until the first thread's stream is synced
        s.sync()

    _in_threads(first, second)
    assert log == ["a1", "a2", "b1"]


def test_a_thread_running_a_call_owns_the_session_from_stream_to_stream():
    """Inside ``running()`` (a compiled model's call) the thread owns the session for the
    whole call, claimed once, not at each stream: another thread's stream waits until the
    call ends, not only until the call's first stream is synced; at the end it is free."""
    s = VecSession()
    log, owned = [], []
    first_synced = threading.Event()

    def call():
        with s.running():
            s.enqueue(lambda: log.append("call 1"))
            s.sync()
            owned.append(s.owned_here())
            first_synced.set()
            # the other thread waits for the session (or, were it free, has run its stream)
            for _ in range(6000):
                if s._waiting or log[-1] == "other":
                    break
                time.sleep(0.01)
            s.enqueue(lambda: log.append("call 2"))
            s.sync()
        owned.append(s.owned_here())

    def other():
        first_synced.wait()
        s.enqueue(lambda: log.append("other"))
        s.sync()

    _in_threads(call, other)
    assert log == ["call 1", "call 2", "other"] and owned == [True, False]


def test_the_stream_of_a_thread_that_died_is_dropped_not_run():
    s = VecSession()
    log = []
    t = threading.Thread(target=lambda: s.enqueue(lambda: log.append("orphan")))
    t.start()
    t.join()
    s.enqueue(lambda: log.append("mine"))
    s.sync()
    assert log == ["mine"]


def test_a_thread_waiting_for_an_owner_that_dies_takes_over():
    s = VecSession()
    log = []
    owner_has_it, waiter_started = threading.Event(), threading.Event()

    def owner():
        s.enqueue(lambda: log.append("orphan"))
        owner_has_it.set()
        waiter_started.wait()          # then it ends without syncing

    def waiter():
        owner_has_it.wait()
        waiter_started.set()
        s.enqueue(lambda: log.append("mine"))
        s.sync()

    _in_threads(owner, waiter)
    assert log == ["mine"]


def test_nested_sessions_and_exits():
    outer, inner = VecSession(), VecSession()
    log = []
    with outer:
        with inner:
            assert VEC.current() is inner
            inner.enqueue(lambda: log.append("inner"))
        assert log == ["inner"] and VEC.current() is outer
        with pytest.raises(ZeroDivisionError):
            with outer:                      # entered twice: the inner exit discards
                outer.enqueue(lambda: log.append("discarded"))
                1 / 0
        assert VEC.current() is outer and outer.pending == 0
    assert log == ["inner"]


def test_misuse_is_a_clear_error():
    class Unbound(device.Session):
        pass

    with pytest.raises(TypeError, match="Unbound belongs to no tirpat.device.Runtime"):
        with Unbound():
            pass
    with pytest.raises(ValueError, match="prefix must be an identifier"):
        device.Runtime("vec.unit", Unbound)
    with pytest.raises(TypeError, match="Session subclass"):
        device.Runtime("devtest_other", object)
    with pytest.raises(ValueError, match="already belongs to the runtime 'devtest_vec'"):
        device.Runtime("devtest_other", VecSession)
    with pytest.raises(ValueError, match="not a valid function name"):
        VEC.function(lambda s: None, name="two words")
    assert device.runtimes()["devtest_vec"] is VEC


def test_full_collections_are_deferred_inside_and_restored_by_the_last_thread_out():
    """A session's running() (held around a compiled model's call) defers the oldest
    generation's collections, process-wide: nested and concurrent holders leave them deferred
    until the last one leaves, an exception included; young collections go on."""
    import gc

    before = gc.get_threshold()
    inside, leave = threading.Event(), threading.Event()

    def other():
        with device.Session().running():
            inside.set()
            leave.wait(5)

    with pytest.raises(RuntimeError, match="boom"):
        with device.full_collections_deferred():
            t = threading.Thread(target=other)
            t.start()
            assert inside.wait(5)
            deferred = gc.get_threshold()
            assert deferred[:2] == before[:2] and deferred[2] > before[2]
            raise RuntimeError("boom")
    assert gc.get_threshold() == deferred        # the other thread is still inside
    leave.set()
    t.join(5)
    assert gc.get_threshold() == before


def test_thresholds_someone_sets_while_collections_are_deferred_stay():
    import gc

    before = gc.get_threshold()
    try:
        with device.full_collections_deferred():
            gc.set_threshold(500, 5, 5)
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.set_threshold(*before)

