"""One callback per stream: the planner asks the runtime to replay each static group of calls
(``<prefix>.replay``), and a session that stores its streams runs the group's stream again on
the new call's host buffers, checked; every other case runs the calls as before."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import tirx
from tvm.script import tirx as T

import tirpat as tp
from tirpat import device


# -- a 16-lane int32 vector unit whose stream is data, so it can run again ----------------
class Stream(device.Session):
    """Instructions are tuples naming host memory by slot; ``sync`` interprets them."""

    def __init__(self):
        super().__init__()
        self.regs = np.zeros(64, np.int32)
        self.ops: list = []
        self.calls = 0          # instruction callbacks received
        self._last = None       # the stream the last sync ran
        self.ran = []           # per stream run: how many instructions

    @property
    def pending(self):
        return len(self.ops)

    def drop(self):
        self.ops = []

    def execute(self):
        self._last, self.ops = tuple(self.ops), []
        self.run_stored(self._last, self.buffers.views)

    def stored_stream(self):
        ops, self._last = self._last, None
        return ops, sorted({op[2] if op[0] == "load" else op[1] for op in ops if op[0] != "add"})

    def run_stored(self, ops, views):
        self.ran.append(len(ops))
        for op in ops:
            if op[0] == "load":
                _, addr, slot, offset = op
                self.regs[addr:addr + 16] = views[slot][offset:offset + 16]
            elif op[0] == "add":
                _, dst, src = op
                self.regs[dst:dst + 16] += self.regs[src:src + 16]
            else:
                _, slot, offset, addr = op
                views[slot][offset:offset + 16] = self.regs[addr:addr + 16]


RT = device.Runtime("devtest_replay", Stream)


@RT.function
def load(s, addr, host, offset):
    slot = s.buffers.slot(host)
    s.buffers.view(slot, offset, (16,))         # bounds-checked now
    s.calls += 1
    s.ops.append(("load", addr, slot, offset))


@RT.function
def add(s, dst, src):
    s.calls += 1
    s.ops.append(("add", dst, src))


@RT.function
def store(s, host, offset, addr):
    slot = s.buffers.slot(host)
    s.buffers.view(slot, offset, (16,), write=True)
    s.calls += 1
    s.ops.append(("store", slot, offset, addr))


@RT.function
def refuse(s, n):
    raise ValueError(f"refused n={n}")


PLANNER = device.ScratchpadPlanner("devtest_replay", [device.Memory("VREG", "local.devtest_replay", "int32", 64, 16)])
tvm.tirx.compilation_pipeline.register_tir_pipeline("devtest_replay", tp.tir_pipeline(PLANNER.as_pass()))
_COMPILED: dict = {}


def compiled(func):
    key = func.script()
    if key not in _COMPILED:
        _COMPILED[key] = tvm.compile(tvm.IRModule({"main": func}), target="llvm", tir_pipeline="devtest_replay")["main"]
    return _COMPILED[key]


@T.prim_func
def vadd(A: T.Buffer((64,), "int32"), B: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "main"})
    for i in range(4):
        va = T.alloc_buffer((16,), "int32", scope="local.devtest_replay")
        vb = T.alloc_buffer((16,), "int32", scope="local.devtest_replay")
        T.call_packed("devtest_replay.load", va.access_ptr("w"), A, i * 16)
        T.call_packed("devtest_replay.load", vb.access_ptr("w"), B, i * 16)
        T.call_packed("devtest_replay.add", va.access_ptr("rw"), vb.access_ptr("r"))
        T.call_packed("devtest_replay.store", C, i * 16, va.access_ptr("r"))


@T.prim_func
def vdouble(A: T.Buffer((64,), "int32"), B: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
    # the same name and host buffers as vadd, other calls: its stream must not be vadd's
    T.func_attr({"global_symbol": "main"})
    for i in range(4):
        va = T.alloc_buffer((16,), "int32", scope="local.devtest_replay")
        T.call_packed("devtest_replay.load", va.access_ptr("w"), A, i * 16)
        T.call_packed("devtest_replay.add", va.access_ptr("rw"), va.access_ptr("r"))
        T.call_packed("devtest_replay.store", C, i * 16, va.access_ptr("r"))


def tensors(*arrays):
    return [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays]


def three_calls(fn, check) -> "Stream":
    """Calls ``fn(A, C)`` on three random inputs in one session, ``check(a, c)`` after each; the session."""
    with Stream() as s:
        for seed in range(3):
            a = np.random.default_rng(seed).integers(-1000, 1000, 64, dtype=np.int32)
            ta, tc = tensors(a, np.zeros(64, np.int32))
            device.invoke(fn, ta, tc)
            check(a, tc.numpy())
    return s


def replay_calls(func) -> list:
    return [c for c in PLANNER.runtime_calls(PLANNER.plan(func).body) if c.args[0].value.endswith(".replay")]


ints = st.lists(st.integers(-2**31, 2**31 - 1), min_size=128, max_size=128)


@settings(deadline=None, max_examples=10)
@given(st.lists(ints, min_size=3, max_size=3))
def test_a_static_group_replays_in_one_callback_on_new_tensors(calls):
    """The first call makes the 16 instruction calls; each later call, with new tensors
    (new addresses, same shapes), is one replay callback, bit-exact with numpy."""
    fn = compiled(vadd)
    with Stream() as s:
        for n, values in enumerate(calls):
            a, b = np.array(values[:64], np.int32), np.array(values[64:], np.int32)
            ta, tb, tc = tensors(a, b, np.zeros(64, np.int32))
            device.invoke(fn, ta, tb, tc)
            np.testing.assert_array_equal(tc.numpy(), a + b)
            assert (s.calls, s.replayed) == (16, n)
    assert s.ran == [16] * len(calls) and s.pending == 0 and all(v is None for v in s.buffers.views)


def test_a_replay_on_the_hosts_of_the_last_one_reuses_its_views():
    """A model called again mostly finds its tensors where they were: the replay then runs
    on the views it made last time (no view is made per call), and reads the new contents;
    a host that moved gets views at its new place. The second call's are those the first
    call, which stored the stream, handed the device at once (``prepare_stored``)."""
    seen, prepared = [], []

    class Watched(Stream):
        def prepare_stored(self, ops, views):
            prepared.append((ops, views))

        def run_stored(self, ops, views):
            seen.append(views)
            super().run_stored(ops, views)

    fn = compiled(vadd)
    a = np.arange(64, dtype=np.int32)
    ta, tb, tc = tensors(a, a, np.zeros(64, np.int32))
    with Watched() as s:
        for k in range(4):
            ta.copyfrom(a * k)
            device.invoke(fn, ta, tb, tc)
            np.testing.assert_array_equal(tc.numpy(), a * k + a)
        device.invoke(fn, *tensors(a, 3 * a, np.zeros(64, np.int32)))     # new tensors: moved
        _, tb2, tc2 = tensors(a, 5 * a, np.zeros(64, np.int32))
        device.invoke(fn, ta, tb2, tc2)
        np.testing.assert_array_equal(tc2.numpy(), a * 3 + 5 * a)
    assert s.replayed == 5
    assert len(prepared) == 1 and len(prepared[0][0]) == 16 and type(seen[1]) is tuple and seen[1] is prepared[0][1]
    assert seen[2] is seen[1] and seen[3] is seen[1]        # the same hosts: the same views
    assert seen[4] is not seen[3] and seen[5] is not seen[4]


def test_groups_of_two_functions_with_one_name_do_not_share_a_stream():
    a = np.arange(64, dtype=np.int32)
    with Stream() as s:
        for _ in range(2):
            for func, want in ((vadd, a + 2 * a), (vdouble, 2 * a)):
                ta, tb, tc = tensors(a, 2 * a, np.zeros(64, np.int32))
                device.invoke(compiled(func), ta, tb, tc)
                np.testing.assert_array_equal(tc.numpy(), want)
    assert s.replayed == 2
    keys = [str(replay_calls(f)[0].args[1].value) for f in (vadd, vdouble)]
    assert keys[0] != keys[1] and all(k.startswith("main:0:") for k in keys)


def test_a_session_that_keeps_no_streams_runs_the_calls_every_time():
    a = np.arange(64, dtype=np.int32)
    s = Stream()
    s.kept_replays = 0
    with s:
        for _ in range(3):
            ta, tb, tc = tensors(a, a, np.zeros(64, np.int32))
            device.invoke(compiled(vadd), ta, tb, tc)
            np.testing.assert_array_equal(tc.numpy(), 2 * a)
    assert (s.calls, s.replayed) == (48, 0)


def _add_halves(key, a, c, hosts) -> bool:
    """A static group as compiled code runs it: replay group ``key`` on ``hosts`` (True), or
    make the calls (``c[16:] = a[:16] + a[16:]``) and sync them (False)."""
    fns = RT.functions
    if fns["replay"](key, *hosts):
        return True
    fns["load"](0, a, 0)
    fns["load"](16, a, 16)
    fns["add"](0, 16)
    fns["store"](c, 16, 0)
    fns["sync"]()
    return False


def test_aliasing_dtype_and_size_changes_run_the_calls():
    """Through the runtime functions as compiled code calls them: a stored stream runs
    again only on hosts of the same dtypes and sizes that overlap as before."""
    fns = RT.functions

    def group(s, a, c, hosts):
        return _add_halves("g:0", a, c, hosts)

    with Stream() as s:
        a, c = np.arange(32, dtype=np.int32), np.zeros(32, np.int32)
        assert not group(s, a, c, [a, c])
        a2, c2 = a + 1, np.zeros(32, np.int32)
        assert group(s, a2, c2, [a2, c2]) and (c2[16:] == a2[:16] + a2[16:]).all()
        # the output now is the input: their slots share memory, which orders the stream anew
        shared = np.arange(32, dtype=np.int32)
        assert not group(s, shared, shared, [shared, shared])
        assert (shared[16:] == np.arange(16) + np.arange(16, 32)).all()
        # both layouts are kept: each replays
        shared = np.arange(32, dtype=np.int32)
        assert group(s, shared, shared, [shared, shared]) and (shared[16:] == 2 * np.arange(16) + 16).all()
        a3, c3 = a + 2, np.zeros(32, np.int32)
        assert group(s, a3, c3, [a3, c3]) and (c3[16:] == a3[:16] + a3[16:]).all()
        # another dtype, size or writability: the calls run (and check what they are given)
        read_only = np.zeros(32, np.int32)
        read_only.flags.writeable = False
        for other in (np.zeros(32, np.int64), np.zeros(48, np.int32), read_only):
            assert fns["replay"]("g:0", a, other) == 0
            s.discard()
    assert s.replayed == 3


def test_tensors_where_the_last_replay_found_them_reuse_its_views_and_any_change_is_caught():
    """Compiled code passes new tensor objects for the same memory at every call: a replay on
    the hosts of one of the last few reuses its views, and a host at the same place but of
    another size or dtype, one moved, or hosts that now share memory, are each told apart."""
    fns = RT.functions
    seen = []

    class Watched(Stream):
        def run_stored(self, ops, views):
            seen.append(views)
            super().run_stored(ops, views)

    def group(a, c):
        return _add_halves("g:3", a, c, (a, c))

    memory = np.zeros(96, np.int32)
    a, c = memory[:32], memory[32:64]
    view = tvm_ffi.from_dlpack
    with Watched() as s:
        assert not group(view(a), view(c))
        for k in range(3):      # new tensor objects, the same memory: the views of the last replay
            a[:] = np.arange(32) * k
            assert group(view(a), view(c))
            np.testing.assert_array_equal(c[16:], a[:16] + a[16:])
        assert seen[2] is seen[1] and seen[3] is seen[1]      # seen[0]: the sync's run
        moved = memory[64:96]
        moved[:] = 7
        assert group(view(a), view(moved)) and seen[4] is not seen[1]
        np.testing.assert_array_equal(moved[16:], a[:16] + a[16:])
        # back at the first places (a memory pool hands tensors out at a few places in turn)
        c[:] = 0
        assert group(view(a), view(c)) and seen[5] is seen[1]
        np.testing.assert_array_equal(c[16:], a[:16] + a[16:])
        assert s.replayed == 5
        # at the places of the last replay but larger, of another dtype, or one inside the other
        for hosts in ((view(memory[:48]), view(moved)), (view(a.view(np.float32)), view(moved)),
                      (view(memory[:32]), view(memory[16:48]))):
            assert fns["replay"]("g:3", *hosts) == 0
            s.discard()
        assert s.replayed == 5


def test_a_group_run_at_many_places_a_call_reuses_the_views_of_each_place():
    """A function called at more places a model call than a stream keeps views for at one
    (a grouped convolution's, once per group: RegNet's 25 a call): each place's views made at
    the first call serve every later call (made again at every run, the device's calls over
    them were too, a later call of regnet_x_400mf 4x slower)."""
    seen = []

    class Watched(Stream):
        def run_stored(self, ops, views):
            seen.append(views)
            super().run_stored(ops, views)

    places = 7
    memory = np.zeros(64 * places, np.int32)
    view = tvm_ffi.from_dlpack
    with Watched() as s:
        for call in range(3):
            del seen[:]
            with s.running():
                for p in range(places):
                    a, c = memory[64 * p:64 * p + 32], memory[64 * p + 32:64 * p + 64]
                    a[:] = np.arange(32) * (call + p)
                    _add_halves("g:4", view(a), view(c), (view(a), view(c)))
                    np.testing.assert_array_equal(c[16:], a[:16] + a[16:])
            if call:    # (the first call's first place ran its calls, not a replay's views)
                assert all(v is w for v, w in zip(seen[call == 1:], last[call == 1:])), call
            last = list(seen)
        assert s.replayed == 3 * places - 1


def test_a_key_that_gives_the_hosts_dtypes_spares_reading_the_tensors():
    """The planner's keys end with the hosts' dtypes (those of the DLTensors compiled code
    makes of its buffers), and a session takes a tensor host's dtype from there instead of
    reading it (a string conversion through tvm_ffi, ~320 hosts a classifier call): shown
    with a tensor that says float32 where the key says int32, which replays; a numpy host's
    own dtype is still read (int64 where the key says int32: the calls run)."""
    assert [str(c.args[1].value).rpartition(";")[2] for c in replay_calls(vadd)] == ["int32,int32,int32"]
    memory = np.zeros(64, np.int32)
    a, c = memory[:32], memory[32:]
    view = tvm_ffi.from_dlpack
    with Stream() as s:
        a[:] = np.arange(32)
        assert not _add_halves("g:7;int32,int32", view(a), view(c), (view(a), view(c)))
        a[:] = np.arange(32) * 3
        assert _add_halves("g:7;int32,int32", view(a), view(c), (view(a.view(np.float32)), view(c)))
        np.testing.assert_array_equal(c[16:], a[:16] + a[16:])
        assert RT.functions["replay"]("g:7;int32,int32", np.zeros(16, np.int64), view(c)) == 0
        s.discard()
    assert s.replayed == 1


def test_a_slot_inside_a_host_is_found_again_at_its_offset():
    """A host view at an offset (a workspace inside a larger allocation, say) is rebuilt at
    the same place in the new call's host."""
    fns = RT.functions
    with Stream() as s:
        for n in range(3):
            big = np.arange(64, dtype=np.int32) * (n + 1)
            out = np.zeros(64, np.int32)
            if not fns["replay"]("g:1", big, out):
                fns["load"](0, big[32:], 0)
                fns["store"](out[16:], 0, 0)
                fns["sync"]()
            np.testing.assert_array_equal(out[16:32], big[32:48])
    assert s.replayed == 2


def test_a_failed_group_stores_nothing_and_the_next_call_stores_it():
    fns = RT.functions
    a, c = np.arange(32, dtype=np.int32), np.zeros(32, np.int32)
    with Stream() as s:
        assert fns["replay"]("g:2", a, c) == 0
        fns["load"](0, a, 0)
        with pytest.raises(ValueError, match="refused"):
            fns["refuse"](1)
        assert s.pending == 0 and s._capture is None
        assert fns["replay"]("g:2", a, c) == 0           # nothing was stored
        fns["load"](0, a, 16)
        fns["store"](c, 0, 0)
        fns["sync"]()
        assert fns["replay"]("g:2", a, c) == 1 and s.replayed == 1
    np.testing.assert_array_equal(c[:16], a[16:])


def test_a_session_without_stored_streams_runs_the_calls():
    """The default session (enqueued closures, which hold the old views) never replays."""
    assert device.Session().replay("f:0", [np.zeros(4)]) is False


# -- which groups are static ------------------------------------------------------------
@T.prim_func
def host_store_between(A: T.Buffer((64,), "int32"), B: T.Buffer((4,), "int32"), C: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "main"})
    for i in range(4):
        T.call_packed("devtest_replay.load", 0, A, i * 16)
        T.call_packed("devtest_replay.store", C, i * 16, 0)
        B[i] = 7        # no hazard (the device never sees B), but CPU code in the group


@T.prim_func
def data_dependent(A: T.Buffer((64,), "int32"), N: T.Buffer((1,), "int32"), C: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "main"})
    for i in range(N[0]):
        T.call_packed("devtest_replay.load", 0, A, i * 16)
        T.call_packed("devtest_replay.store", C, i * 16, 0)


@T.prim_func
def scalar_extent(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32"), n: T.int32):
    T.func_attr({"global_symbol": "main"})
    for i in range(n):
        T.call_packed("devtest_replay.load", 0, A, i * 16)
        T.call_packed("devtest_replay.store", C, i * 16, 0)


@T.prim_func
def scalar_argument(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32"), k: T.int32):
    T.func_attr({"global_symbol": "main"})
    for i in range(4):
        T.call_packed("devtest_replay.load", 0, A, i * 16 + k)
        T.call_packed("devtest_replay.store", C, i * 16, 0)


@T.prim_func
def other_call(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "main"})
    for i in range(4):
        T.call_packed("devtest_replay.load", 0, A, i * 16)
        T.call_packed("some.other_function", i)
        T.call_packed("devtest_replay.store", C, i * 16, 0)


@T.prim_func
def two_groups(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "main"})
    W = T.alloc_buffer((64,), "int32")
    T.call_packed("devtest_replay.load", 0, A, 0)
    T.call_packed("devtest_replay.store", W, 0, 0)
    for i in range(64):
        W[i] = W[i] * 2
    T.call_packed("devtest_replay.load", 0, W, 0)
    T.call_packed("devtest_replay.store", C, 0, 0)


@pytest.mark.parametrize("func", [host_store_between, data_dependent, scalar_extent, scalar_argument, other_call],
                         ids=["host_store", "data_dependent_loop", "scalar_extent", "scalar_argument", "other_call"])
def test_groups_that_may_call_differently_are_not_wrapped(func):
    planned = PLANNER.plan(func)
    assert not replay_calls(func)
    assert not any(isinstance(s, tirx.IfThenElse) for s in planned.body.seq)
    assert str(planned.body.seq[-1].value.args[0].value) == "devtest_replay.sync"


def test_a_function_with_cpu_code_between_groups_replays_each_group():
    planned = PLANNER.plan(two_groups)
    asks = replay_calls(two_groups)
    assert [str(c.args[1].value).split(":")[:2] for c in asks] == [["main", "0"], ["main", "1"]]
    assert [[a.args[0].args[0].name for a in c.args[2:]] for c in asks] == [["A", "W"], ["W", "C"]]
    assert "W = T.alloc_buffer" in planned.script()
    fn = compiled(two_groups)
    s = three_calls(fn, lambda a, c: np.testing.assert_array_equal(c[:16], 2 * a[:16]))
    assert s.replayed == 4 and s.calls == 4


def test_a_non_static_group_runs_its_calls_every_time():
    fn = compiled(scalar_extent)
    a = np.arange(64, dtype=np.int32)
    with Stream() as s:
        for n in (2, 4, 4):
            ta, tc = tensors(a, np.zeros(64, np.int32))
            device.invoke(fn, ta, tc, n)
            np.testing.assert_array_equal(tc.numpy()[:16 * n], a[:16 * n])
    assert s.replayed == 0 and s.calls == 2 * (2 + 4 + 4)


@T.prim_func
def computed_arguments(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
    T.func_attr({"global_symbol": "main"})
    T.call_packed("devtest_replay.load", 0, A, 0)
    W = T.alloc_buffer((32,), "int32")      # inside the group: allocated before the replay call
    for i in range(2):
        T.call_packed("devtest_replay.store", W, T.if_then_else(i == 0, 16, 0), T.min(i * 16, 0))
        T.call_packed("devtest_replay.load", (i + 1) << 4, W, T.max((1 - i) * 16, 0) >> 0)
    T.call_packed("devtest_replay.add", 16, 32)
    T.call_packed("devtest_replay.store", C, 0, 16)


def test_arguments_computed_from_loop_variables_and_allocations_in_the_group_replay():
    planned = PLANNER.plan(computed_arguments)
    assert [type(s).__name__ for s in planned.body.seq] == ["Evaluate", "AllocBuffer", "IfThenElse"]
    fn = compiled(computed_arguments)
    s = three_calls(fn, lambda a, c: np.testing.assert_array_equal(c[:16], 2 * a[:16]))
    assert (s.replayed, s.calls) == (2, 7)


@T.prim_func
def tail_loop(A: T.Buffer((64,), "int32"), C: T.Buffer((64,), "int32")):
    # a tiled loop's last tile is shorter: the inner extent is an expression of the outer loop's variable
    T.func_attr({"global_symbol": "main"})
    for i in range(2):
        for j in range(3 - i * 2):
            T.call_packed("devtest_replay.load", 0, A, (i * 3 + j) * 16)
            T.call_packed("devtest_replay.store", C, (i * 3 + j) * 16, 0)


def test_loop_bounds_from_enclosing_loop_variables_replay():
    assert len(replay_calls(tail_loop)) == 1
    fn = compiled(tail_loop)
    s = three_calls(fn, lambda a, c: np.testing.assert_array_equal(c, a))
    assert (s.replayed, s.calls) == (2, 8)


class Broken(Exception):
    """What a device raises while running a stored stream."""


def test_an_error_in_a_replayed_stream_reaches_the_caller_as_itself():
    fn = compiled(vadd)
    a = np.arange(64, dtype=np.int32)

    class Failing(Stream):
        fail = False

        def run_stored(self, ops, views):
            if self.fail:
                raise Broken("the device stopped")
            super().run_stored(ops, views)

    with Failing() as s:
        device.invoke(fn, *tensors(a, a, np.zeros(64, np.int32)))
        s.fail = True
        with pytest.raises(Broken, match="the device stopped"):
            device.invoke(fn, *tensors(a, a, np.zeros(64, np.int32)))
        assert s.pending == 0 and not s.owned_here() and all(v is None for v in s.buffers.views)
        s.fail = False
        ta, tb, tc = tensors(a, a, np.zeros(64, np.int32))
        device.invoke(fn, ta, tb, tc)
        np.testing.assert_array_equal(tc.numpy(), 2 * a)
    assert s.replayed == 1 and s.calls == 16
