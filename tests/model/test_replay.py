"""A compiled model keeps its backend sessions between calls: accel replays the streams it
built on the first call instead of building them again, with the same outputs, cycles and
layers as a model called once, and statistics of one call each."""

import threading

import numpy as np
import pytest

import tirpat as tp
from models import cnn, random_inputs, reference


@pytest.fixture(scope="module")
def built():
    mod = cnn(8, 8, 10)
    return mod, tp.build(mod, "accel, llvm")


def replays(model) -> int:
    """Streams the sessions the model keeps have replayed so far, in one callback each
    (``Session.replay``) or call by call (the stream builder)."""
    return sum(s.replayed + s.builder.replays for kept in model._kept_sessions for s in kept.values())


def records_at_its_first_call(mod, model, seed: int) -> None:
    """The model's first call builds its streams (computing what the model computes), the second replays."""
    args = random_inputs(mod, np.random.default_rng(seed))
    np.testing.assert_array_equal(model(*args), reference(mod, args))
    assert replays(model) == 0            # the first call built its streams
    model(*args)
    assert replays(model) > 0


def once(mod, args):
    """Outputs, cycles and layer cycles of a model that is called once."""
    fresh = tp.build(mod, "accel, llvm")
    out = fresh(*args)
    return out, fresh.stats["accel"].cycles, [(layer.function, layer.cycles) for layer in fresh.layers]


def test_later_calls_replay_with_the_same_results(built):
    mod, model = built
    rng = np.random.default_rng(0)
    first, other = random_inputs(mod, rng), random_inputs(mod, rng)
    want_out, want_cycles, want_layers = once(mod, first)
    np.testing.assert_array_equal(want_out, reference(mod, first))
    before = replays(model)
    for args in (first, other, first):
        out = model(*args)
        np.testing.assert_array_equal(out, reference(mod, args))
        # statistics of this call alone, not accumulated over the calls the session saw
        assert model.stats["accel"].cycles == want_cycles
        assert [(layer.function, layer.cycles) for layer in model.layers] == want_layers
    assert replays(model) > before            # the streams of the first call were replayed


def test_the_first_call_replays_the_streams_the_build_recorded():
    """tp.build runs the model once on zeros (CompiledModel.record_streams): the first call
    replays, and nothing of that run shows in the statistics."""
    mod = cnn(8, 8, 6)
    model = tp.build(mod, "accel, llvm")
    assert model.stats == {} and model.layers == [] and "nothing ran yet" in model.profile()
    assert replays(model) == 0
    args = random_inputs(mod, np.random.default_rng(2))
    np.testing.assert_array_equal(model(*args), reference(mod, args))
    assert replays(model) > 0


def test_a_build_that_does_not_record_leaves_the_streams_to_the_first_call():
    mod = cnn(8, 8, 6)
    records_at_its_first_call(mod, tp.build(mod, "accel, llvm", record_streams=False), seed=3)


def test_a_recording_run_that_raises_leaves_the_streams_to_the_first_call(monkeypatch):
    """A run on zeros that raises (a check zeros do not pass) does not fail the build: it warns
    with the error, keeps no session, and the first call records on its own inputs."""
    import tirpat.model.compiled as compiled

    def refuse(*args):
        raise ZeroDivisionError("integer division by zero")

    mod = cnn(8, 8, 6)
    with monkeypatch.context() as patch:
        patch.setattr(compiled, "invoke", refuse)
        with pytest.warns(RuntimeWarning, match="recorded at the first call.*ZeroDivisionError: integer division"):
            model = tp.build(mod, "accel, llvm")
    assert model._kept_sessions == [] and model.stats == {}
    records_at_its_first_call(mod, model, seed=4)


def test_every_replay_key_gives_the_dtypes_of_the_tensors_compiled_code_passes(built, monkeypatch):
    """A session takes a tensor host's dtype from its replay key, where the planner wrote the
    dtypes of the buffers compiled code makes its DLTensors of: every replay of a built model's
    call gives hosts of exactly those dtypes."""
    from tirpat.device import session
    from tirpat.device.buffers import dtype_entry

    mod, model = built
    seen = []
    replay = session.Session.replay

    def checked(self, key, hosts):
        seen.append((session._declared_dtypes(key), tuple(dtype_entry(str(h.dtype)) for h in hosts)))
        return replay(self, key, hosts)

    monkeypatch.setattr(session.Session, "replay", checked)
    model(*random_inputs(mod, np.random.default_rng(1)))
    assert seen and all(declared == given for declared, given in seen)


def test_concurrent_calls_take_sessions_of_their_own(built):
    mod, model = built
    inputs = [random_inputs(mod, np.random.default_rng(seed)) for seed in range(4)]
    want = [reference(mod, args) for args in inputs]
    got = [None] * len(inputs)

    def run(k):
        got[k] = model(*inputs[k])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    sessions = [s for kept in model._kept_sessions for s in kept.values()]
    assert len(sessions) == len({id(s) for s in sessions})     # no session kept twice



class _Stopped(Exception):
    """What a stream raises halfway through a call."""


def test_a_call_sets_blas_to_one_thread_once_and_gives_the_setting_back(built, monkeypatch):
    """The simulator's products are small blocks, run on one BLAS thread: a model's call sets
    that once for all its streams (not per stream) and restores the caller's setting at its
    end, also when the call fails."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from accel.hw import runtime, sim
    if not sim._BLAS:
        pytest.skip("no BLAS library whose threads threadpoolctl can set")
    mod, model = built
    args = random_inputs(mod, np.random.default_rng(0))
    want = model(*args)
    sets, during = [], []
    for lib in sim._BLAS:
        monkeypatch.setattr(lib, "set_num_threads", lambda n, real=lib.set_num_threads: sets.append(n) or real(n))
    run_stored = runtime.Session.run_stored

    def watched(self, program, views):
        during.append([lib.get_num_threads() for lib in sim._BLAS])
        if stop_at is not None and len(during) == stop_at:
            raise _Stopped("halfway")
        return run_stored(self, program, views)

    monkeypatch.setattr(runtime.Session, "run_stored", watched)

    def threads():      # the libraries the simulator sets (another loaded later is not its)
        return [lib.get_num_threads() for lib in sim._BLAS]

    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        stop_at = None
        sets.clear()
        np.testing.assert_array_equal(model(*args), want)
        assert len(during) > 2 and all(n == [1] * len(sim._BLAS) for n in during)
        assert sets == [1] * len(sim._BLAS) + [2] * len(sim._BLAS) and threads() == [2] * len(sim._BLAS)
        during.clear()
        stop_at = 2
        with pytest.raises(_Stopped):
            model(*args)
        assert threads() == [2] * len(sim._BLAS)
        stop_at = None
        np.testing.assert_array_equal(model(*args), want)


def test_a_call_defers_full_collections_and_restores_the_thresholds(built, monkeypatch):
    """The first call records and plans every stream, hundreds of thousands of objects that
    live on: full collections wait until the call ends (young ones go on), and the
    thresholds are the caller's again afterwards, also when the call fails."""
    import gc

    import accel

    mod, model = built
    seen = []
    real = accel.Session.execute

    def execute(self):
        seen.append(gc.get_threshold())
        return real(self)

    before = gc.get_threshold()
    monkeypatch.setattr(accel.Session, "execute", execute)
    args = random_inputs(mod, np.random.default_rng(3))
    model._kept_sessions.clear()        # a first call
    np.testing.assert_array_equal(model(*args), reference(mod, args))
    assert seen and all(t[:2] == before[:2] and t[2] > before[2] for t in seen)
    assert gc.get_threshold() == before

    def fail(self):
        raise RuntimeError("the device failed")

    monkeypatch.setattr(accel.Session, "execute", fail)
    model._kept_sessions.clear()
    with pytest.raises(RuntimeError, match="the device failed"):
        model(*args)
    assert gc.get_threshold() == before


def test_what_building_plans_keeps_is_let_go_when_the_call_ends(built, monkeypatch):
    """A first call's plans renumber their values in one array of the simulator's workspace,
    reused stream after stream; the call's end drops it (the arrays that run plans stay)."""
    from accel.hw import fused

    mod, model = built
    layouts = []
    real = fused._layout

    def layout(*args):
        layouts.append(args[-1].size)      # the workspace's array it renumbers in
        return real(*args)

    monkeypatch.setattr(fused, "_layout", layout)
    model._kept_sessions.clear()
    args = random_inputs(mod, np.random.default_rng(4))
    np.testing.assert_array_equal(model(*args), reference(mod, args))
    assert layouts      # plans were built
    sessions = [s for kept in model._kept_sessions for s in kept.values()]
    assert sessions and all(fused._RENUMBER not in s.simulator.workspace for s in sessions)
    assert any("values" in s.simulator.workspace for s in sessions)
