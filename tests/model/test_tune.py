"""tp.tune in this process: knob spaces whose sampled values reach the schedule, the heuristic
measured first and never beaten by a worse record, bit-exactness as the gate (a wrong but
cheap schedule is an error, never the best), records applied by tp.build and accel."""

import json

import numpy as np
import pytest
import tvm
from hypothesis import example, given
from hypothesis import strategies as st
from tvm import ir, s_tir, te, tirx, topi

import accel
import tirpat as tp
import tirpat.model.backend as backend_module
from accel.compiler.schedule import Knobs, schedule
from tirpat.model.tune import MutateKnob
from tirpat.model.tune.artifact import NotBitExact, measure, pack, reference


def conv_layer(size=16, c=32, f=64, stride=2):
    """3x3 conv2d + bias + ReLU + requantise, NHWC: an 8x8 output, whose rows of 8 pixels
    the heuristic pads to 16-row tiles."""
    x = te.placeholder((2, size, size, c), "int8", name="x")
    w = te.placeholder((3, 3, c, f), "int8", name="w")
    b = te.placeholder((f,), "int32", name="b")
    conv = topi.nn.conv2d_nhwc(x, w, stride, 1, 1, out_dtype="int32")
    acc = topi.nn.relu(te.compute(conv.shape, lambda *i: conv(*i) + b[i[3]], name="bias"))
    out = te.compute(acc.shape, lambda *i: te.max(te.min((acc(*i) + 128) >> 8, 127), -128).astype("int8"),
                     name="requant")
    return te.create_prim_func([x, w, b, out])


def cycles_and_output(func, seed=3):
    ex = accel.build(func)
    rng = np.random.default_rng(seed)
    args = [rng.integers(-128, 128, shape).astype(dtype) for _, shape, dtype in ex.params]
    with accel.Session() as session:
        ex(*args)
    return session.stats.cycles, args[-1], schedule(func, accel.Config())[1]     # the scheduler's notes


@pytest.fixture(scope="module")
def tuned_conv(tmp_path_factory):
    """The conv layer tuned with the default strategy (evolutionary search, XGBoost model)."""
    func = conv_layer()
    before = func.script()
    records = tmp_path_factory.mktemp("records")
    result = tp.tune(func, "accel, llvm", trials=20, records=records, batch=8, seed=1)
    assert func.script() == before, "tp.tune changed its input"
    return func, records, result


def test_the_heuristic_is_measured_first_and_never_beaten_by_a_worse_record(tuned_conv):
    func, _, result = tuned_conv
    [task] = result.tasks
    heuristic_cycles, _, _ = cycles_and_output(func)
    assert task.heuristic == heuristic_cycles
    assert task.best <= task.heuristic
    assert task.trials >= 20 and task.failures == 0
    # an image's 64 pixels in one M block instead of 8-pixel rows padded to 16
    assert task.gain > 0.25
    assert "trials in" in str(result) and "main" in str(result)


def test_tp_build_of_the_primfunc_applies_its_records(tuned_conv):
    """tp.tune tuned the PrimFunc; tp.build of it with the records schedules it as the best trial."""
    func, records, result = tuned_conv
    kernel = tp.build(func, "accel, llvm", records=records)
    assert kernel.report.records["applied"] == 1 and kernel.report.partitions[0].from_records
    assert "scheduled from a tuning record" in kernel.report.text(verbose=True)
    rng = np.random.default_rng(3)
    args = [rng.integers(-128, 128, shape).astype(dtype) for _, shape, dtype in kernel.params]
    with accel.Session() as session:
        kernel(*args)
    assert session.stats.cycles == result.tasks[0].best


def test_records_schedule_the_best_and_stay_bit_exact(tuned_conv):
    func, records, result = tuned_conv
    opts = tp.backends()["accel"].resolve()
    applied = tp.Records(records).apply(func, "accel", opts)
    tuned_cycles, tuned_out, report = cycles_and_output(applied)
    untuned_cycles, untuned_out, _ = cycles_and_output(func)
    assert tuned_cycles == result.tasks[0].best < untuned_cycles
    np.testing.assert_array_equal(tuned_out, untuned_out)
    assert report.offloaded[0].knobs != Knobs()
    # records of other options do not apply
    other = tp.Records(records).apply(func, "accel", {**opts, "acc_bytes": 64 * 1024})
    assert other.same_as(func)


def test_records_must_exist(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tuning records in"):
        tp.Records(tmp_path / "nowhere")


def test_a_relax_model_is_tuned_per_partition_and_built_with_its_records(tmp_path):
    from models import mlp, random_inputs, reference as vm_reference

    mod = mlp(batch=16, features=64, hidden=48, classes=10)
    result = tp.tune(mod, "accel, llvm", trials=9, records=tmp_path, strategy="replay-trace", batch=2)
    assert len(result.tasks) == 2 and all(t.best <= t.heuristic for t in result.tasks)
    # the budget is the budget: 4 trials each (a search), the one left over to the layer of
    # most work (16x64x48 MACs against 16x48x10)
    assert [t.trials for t in result.tasks] == [t.budget for t in result.tasks]
    by_work = sorted(result.tasks, key=lambda t: -flops(partition_function(mod, t.name)))
    assert [t.trials for t in by_work] == [5, 4]
    assert result.summary.startswith("9 trials in") and "searched" not in result.summary
    args = random_inputs(mod, np.random.default_rng(0))
    model = tp.build(mod, "accel, llvm", records=tmp_path)
    for got, want in zip(model(*args), vm_reference(mod, args)):
        np.testing.assert_array_equal(got, want)


def flops(func):
    """accel's estimate of a PrimFunc's cycles under its own schedule (what tp.tune splits a
    budget that searches every task by)."""
    return tp.backends()["accel"].tune_work(func, tp.backends()["accel"].resolve())


def gain(func):
    """The cycles accel estimates its cheapest candidate saves on its own schedule of a
    PrimFunc (what tp.tune ranks accel's tasks by when it cannot search them all)."""
    accel_backend = tp.backends()["accel"]
    opts = accel_backend.resolve()
    candidates = accel_backend.tune_candidates(func, opts)
    return max(0.0, flops(func) - candidates[0][0]) if candidates else 0.0


def partition_function(mod, name):
    """The legalized PrimFunc of ``mod``'s partition ``name`` for "accel, llvm"."""
    [func] = [f for n, _, _, f in tp.partition_functions(mod, "accel, llvm") if n == name]
    return func


def test_a_budget_below_the_tasks_searches_those_of_most_gain_and_measures_no_more(tmp_path):
    """Fewer trials than tasks: the budget is not raised (it used to be, to one heuristic
    trial per task); the task its backend estimates to gain most on gets all of it, a search,
    not only its heuristic; the other keeps its backend's own schedule, and the summary says so."""
    from models import mlp, random_inputs, reference as vm_reference

    mod = mlp(batch=8, features=32, hidden=16, classes=4)
    # of equal gains (none: the heuristic is the cheapest the estimate finds), the most work first
    [(big, *_), (small, *_)] = sorted(tp.partition_functions(mod, "accel, llvm"), key=lambda p: (-gain(p[3]),
                                                                                                -flops(p[3])))
    result = tp.tune(mod, "accel, llvm", trials=3, records=tmp_path, strategy="replay-trace", batch=2)
    assert result.trials == result.budget == result.asked == 3
    tasks = {t.name: t for t in result.tasks}
    assert (tasks[big].trials, tasks[big].heuristic is not None) == (3, True)
    assert (tasks[small].budget, tasks[small].trials, tasks[small].heuristic) == (0, 0, None)
    shown = {name: row.split()[0] for name, row in zip([t.name for t in result.tasks], str(result).splitlines()[1:])}
    assert (f"searched 1 of 2 tasks, the most to gain first: {shown[big]}; 3 trials each: its backend's own "
            f"schedule and its cheapest candidates by the backend's estimate; the other 1 left at their backend's "
            f"own schedule: {shown[small]}") in result.summary
    opts = tp.backends()["accel"].resolve()
    records = tp.Records(tmp_path)
    assert records.best(partition_function(mod, big), "accel", opts) is not None
    assert records.best(partition_function(mod, small), "accel", opts) is None
    args = random_inputs(mod, np.random.default_rng(1))           # the unsearched partition builds as untuned
    for got, want in zip(tp.build(mod, "accel, llvm", records=tmp_path)(*args), vm_reference(mod, args)):
        np.testing.assert_array_equal(got, want)


def dense(m=16, k=32, n=16):
    a = te.placeholder((m, k), "int8", name="a")
    w = te.placeholder((n, k), "int8", name="w")
    return te.create_prim_func([a, w, topi.nn.dense(a, w, out_dtype="int32")])


def test_a_small_budget_probes_the_tasks_of_most_gain_first(tmp_path):
    """Four tasks and 10 trials (below a search of 4 each): the tasks go in order of the gain
    their backend estimates, two trials each (the backend's own schedule and its cheapest
    candidate by the estimate) while the budget lasts, what is left to those of most gain;
    a task estimated to gain nothing comes last; no task is worse than its heuristic, and
    the summary says which were searched."""
    mod = ir.IRModule({name: dense(m, k, n).with_attr("global_symbol", name)
                       for name, (m, k, n) in {"huge": (64, 256, 64), "big": (32, 256, 32), "mid": (16, 128, 32),
                                               "small": (16, 32, 16)}.items()})
    gains = {name: gain(mod[name]) for name in ("huge", "big", "mid", "small")}
    result = tp.tune(mod, "accel, llvm", trials=10, records=tmp_path, strategy="replay-trace", batch=2, seed=1)
    tasks = {t.name: t for t in result.tasks}
    order = sorted(gains, key=lambda n: (gains[n] <= 0, -gains[n], -flops(mod[n])))
    budgets = [tasks[n].budget for n in order]
    assert sum(budgets) == result.trials == 10
    assert budgets == sorted(budgets, reverse=True) and all(b >= 2 for b in budgets if b)
    assert all(tasks[n].budget >= 2 for n in gains if gains[n] > 0)
    assert all(t.best <= t.heuristic for t in result.tasks if t.budget)
    assert "most to gain first" in result.summary or all(b >= 4 for b in budgets)


@given(st.lists(st.one_of(st.none(), st.just(0.0), st.floats(1.0, 1e6), st.floats(1.0, 50.0)), min_size=1,
                max_size=12), st.integers(1, 50))
@example([1000.0, 1.0], 4)              # a gain of 0.1%: not probed before the large one's next candidates
@example([45504.0, 43818.0, 15408.0, 11488.0, 760.0, 702.0, 488.0, None, 0.0], 20)   # ppocrv5_det's kind
def test_a_small_budget_searches_the_material_gains_before_probing_the_small_ones(gains, trials):
    """Short of SEARCH trials a task, the tasks of a material estimated gain (MATERIAL of the
    summed) are probed first and get SEARCH trials each (their next candidates: the estimate
    misranks some) before any task of a smaller, no or unknown gain is probed; the budget is
    spent exactly."""
    from tirpat.model.tune.tuner import MATERIAL, PROBE, SEARCH, _budgets

    n = len(gains)
    budgets = _budgets(trials, [1.0] * n, gains)
    assert sum(budgets) == trials
    if trials >= SEARCH * n:
        return
    summed = sum(g for g in gains if g)
    material = [i for i, g in enumerate(gains) if g and g >= MATERIAL * summed]
    rest = [i for i in range(n) if i not in material]
    if any(budgets[i] for i in rest):
        assert all(budgets[i] >= min(SEARCH, trials) for i in material)
    if material:        # the largest gain is searched whatever the budget
        assert budgets[max(material, key=lambda i: gains[i])] >= min(PROBE, trials)


def test_a_material_task_gets_its_next_candidates_only_where_the_estimate_cannot_tell_them_apart():
    """``close``: per task, its candidates within CLOSE of its cheapest by the estimate. A
    task of a material gain gets a trial for each (the heuristic's besides), the trials left
    probe the small gains."""
    from tirpat.model.tune.tuner import _budgets

    gains, work = [300.0, 100.0, 50.0, 1.0], [1.0] * 4
    assert _budgets(8, work, gains, close=[1, 1, 1, 1]) == [2, 2, 2, 2]
    assert _budgets(8, work, gains, close=[1, 3, 1, 1]) == [2, 4, 2, 0]
    assert _budgets(8, work, gains, close=[9, 1, 1, 1]) == [4, 2, 2, 0]      # SEARCH at most
    assert _budgets(8, work, gains) == [4, 2, 2, 0]         # no close: SEARCH each, the largest gain first


def test_identical_partitions_are_one_task_whose_record_serves_each(tmp_path):
    """Two functions of the same structure under different names (and a third of another
    shape) are two tasks; the record of the shared one applies to both names."""
    mod = ir.IRModule({"first": dense().with_attr("global_symbol", "first"),
                       "second": dense().with_attr("global_symbol", "second"),
                       "other": dense(n=32).with_attr("global_symbol", "other")})
    result = tp.tune(mod, "accel, llvm", trials=8, records=tmp_path, strategy="replay-trace", batch=2)
    assert [(t.name, t.copies, t.trials) for t in sorted(result.tasks, key=lambda t: t.name)] == [
        ("first", ("second",), 4), ("other", (), 4)]
    assert "first (+1 identical)" in str(result) and "  first: second" in str(result)
    opts = tp.backends()["accel"].resolve()
    records = tp.Records(tmp_path)
    for name in ("first", "second"):
        func = mod[name]
        assert records.best(func, "accel", opts) is not None
        applied = records.apply(func, "accel", opts)
        assert not applied.same_as(func)
        np.testing.assert_array_equal(cycles_and_output(applied)[1], cycles_and_output(func)[1])


def test_a_model_with_two_identical_layers_tunes_the_layer_once(tmp_path):
    """Two layers of the same shapes and constants: one task (one partition function, called
    twice), its record applied at both call sites of the build."""
    from models import random_inputs, reference as vm_reference
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Twin:
        @R.function
        def main(x: R.Tensor((8, 32), "int8"), w1: R.Tensor((32, 32), "int8"), b1: R.Tensor((32,), "int32"),
                 w2: R.Tensor((32, 32), "int8"), b2: R.Tensor((32,), "int32"), w3: R.Tensor((32, 16), "int8")):
            with R.dataflow():
                r1 = R.nn.relu(R.add(R.matmul(x, w1, out_dtype="int32"), b1))
                q1 = R.astype(R.clip(R.right_shift(R.add(r1, R.const(128, "int32")), R.const(8, "int32")),
                                     -128, 127), "int8")
                r2 = R.nn.relu(R.add(R.matmul(q1, w2, out_dtype="int32"), b2))
                q2 = R.astype(R.clip(R.right_shift(R.add(r2, R.const(128, "int32")), R.const(8, "int32")),
                                     -128, 127), "int8")
                o = R.matmul(q2, w3, out_dtype="int32")
                R.output(o)
            return o

    result = tp.tune(Twin, "accel, llvm", trials=8, records=tmp_path, strategy="replay-trace", batch=2)
    assert len(result.tasks) == 2 and result.trials == 8
    opts = tp.backends()["accel"].resolve()
    records = tp.Records(tmp_path)
    assert all(records.best(f, "accel", opts) is not None for *_, f in tp.partition_functions(Twin, "accel, llvm"))
    args = random_inputs(Twin, np.random.default_rng(2))
    np.testing.assert_array_equal(tp.build(Twin, "accel, llvm", records=tmp_path)(*args), vm_reference(Twin, args))


def test_ctrl_c_stops_a_tune_with_keyboard_interrupt_and_the_records_so_far_apply(tmp_path, ctrl_c):
    """SIGINT during tp.tune (sent by the progress callback after the first batch, so that
    it is raised inside a callback meta_schedule calls) is a KeyboardInterrupt, not the
    RuntimeError('') meta_schedule makes of it; the records measured so far apply."""
    import os
    import signal

    from models import mlp

    mod = mlp(batch=8, features=32, hidden=16, classes=4)
    handler, seen = signal.getsignal(signal.SIGINT), []

    def interrupt(progress):
        seen.append(progress.trials)
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        tp.tune(mod, "accel, llvm", trials=8, records=tmp_path, strategy="replay-trace", batch=2, progress=interrupt)
    assert len(seen) == 1 and signal.getsignal(signal.SIGINT) is handler
    opts = tp.backends()["accel"].resolve()
    records = tp.Records(tmp_path)
    assert sum(records.best(func, "accel", opts) is not None
               for _, _, _, func in tp.partition_functions(mod, "accel, llvm")) == 1
    tp.build(mod, "accel, llvm", records=tmp_path)


def test_a_first_ctrl_c_in_a_tune_is_raised_where_it_checks_a_second_at_once(ctrl_c):
    """Inside meta_schedule a first SIGINT only is noted (raised asynchronously, it would
    unwind native code from wherever Python ran): the code goes on until a check raises
    ``KeyboardInterrupt``; leaving the block raises it too; a second SIGINT raises at once."""
    import os
    import signal

    from tirpat.model.tune.tuner import _Interrupts

    ran_on = []
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with _Interrupts() as interrupts:
            os.kill(os.getpid(), signal.SIGINT)
            ran_on.append("after the signal")
            with pytest.raises(KeyboardInterrupt):
                interrupts.check()
            ran_on.append("after the check")
    assert ran_on == ["after the signal", "after the check"] and signal.getsignal(signal.SIGINT) is handler
    with pytest.raises(KeyboardInterrupt):
        with _Interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                ran_on.append("after the second signal")
            except KeyboardInterrupt:
                ran_on.append("raised by the second")
                raise
    assert ran_on[2:] == ["raised by the second"]


# --------------------------------------------------------------------------- knob spaces
def doubling():
    a = te.placeholder((64,), "int32", name="A")
    return te.create_prim_func([a, te.compute((64,), lambda i: a[i] * 2, name="B")])


def test_knobs_are_sampled_values_the_schedule_uses():
    seen = []
    space = tp.knob_space(lambda sch: [tp.Knob("B", "toy.variant", (0, 1, 2), default=1)],
                          lambda sch: seen.append(int(sch.get(sch.get_sblock("B")).annotations["toy.variant"])))
    mod = ir.IRModule({"main": doubling()})
    [design] = space.generate_design_space(mod)
    trace = design.trace
    assert "sample_categorical" in str(trace) and "ann_val=v0" in str(trace)    # the ExprRV, not an int
    assert int(trace.decisions[trace.insts[0]]) == 1                          # the default
    mutated = MutateKnob().apply(trace)
    sch = s_tir.Schedule(mod)
    mutated.apply_to_schedule(sch, remove_postproc=True)
    assert int(sch.get(sch.get_sblock("B")).annotations["toy.variant"]) in (0, 2)


def test_knobs_are_checked():
    with pytest.raises(ValueError, match="default 3 is not one of"):
        tp.Knob("B", "k", (1, 2), default=3)
    with pytest.raises(TypeError, match="values must be ints"):
        tp.Knob("B", "k", (1, "2"), default=1)


# --------------------------------------------------------------------------- bit-exactness
TICKS = []


class Cheater(tp.Backend):
    """A backend whose knob's second value computes one element less, and costs less: a
    wrong schedule that would win on cost alone."""

    name = "tune-test-cheater"

    def tune_space(self, func, opts):
        return tp.knob_space(lambda sch: [tp.Knob("B", "cheat", (0, 1), default=0)], self._schedule)

    @staticmethod
    def _schedule(sch):
        block = sch.get_sblock("B")
        variant = int(sch.get(block).annotations.get("cheat", 0))
        if "cheat" in sch.get(block).annotations:
            sch.unannotate(block, "cheat")
        sch.annotate(sch.get_loops(block)[0], "cheat", variant)

    def schedule(self, func, opts):
        sch = s_tir.Schedule(ir.IRModule({"main": func}))
        self._schedule(sch)
        return sch.mod["main"]

    def rules(self, opts):
        def rewrite(m):
            loop = m.node
            if "cheat" not in loop.annotations:
                return None
            cheat = int(loop.annotations["cheat"])
            tick = tirx.Evaluate(tirx.call_packed("tune_test.tick"))
            body = tirx.For(loop.loop_var, loop.min, loop.extent - cheat, loop.kind, loop.body)
            return tirx.SeqStmt([tick, body] if cheat else [tick, tick, body])

        return tp.Rewriter.from_pattern(tp.is_for(tp.wildcard()), rewrite, name="cheater")

    def measure(self, run, opts):
        TICKS.clear()
        run()
        return float(len(TICKS))


class Slower(Cheater):
    """A backend whose knob's second value is right but costs more: nothing beats the
    heuristic."""

    name = "tune-test-slower"

    def rules(self, opts):
        def rewrite(m):
            loop = m.node
            if "cheat" not in loop.annotations:
                return None
            ticks = 2 + 3 * int(loop.annotations["cheat"])
            body = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body)
            return tirx.SeqStmt([tirx.Evaluate(tirx.call_packed("tune_test.tick"))] * ticks + [body])

        return tp.Rewriter.from_pattern(tp.is_for(tp.wildcard()), rewrite, name="slower")


@pytest.fixture
def cheater(monkeypatch):
    tp.backends()
    monkeypatch.setattr(backend_module, "_REGISTRY", dict(backend_module._REGISTRY))
    tp.register_backend(Cheater)
    tvm.register_global_func("tune_test.tick", lambda: TICKS.append(1), override=True)


def test_a_wrong_schedule_is_an_error_and_never_the_best(cheater, tmp_path):
    func = doubling()
    result = tp.tune(func, "tune-test-cheater, llvm", trials=8, records=tmp_path, strategy="replay-trace",
                     batch=4, seed=2)
    [task] = result.tasks
    assert task.failures >= 1 and "NotBitExact: buffer B: 1 of 64 elements" in task.first_failure
    assert task.heuristic == task.best == 2.0
    records = json.loads("[" + ",".join((tmp_path / "database_tuning_record.json").read_text().split("\n")[:-1]) + "]")
    assert any(r[1][1][0] >= 1e9 for r in records)          # the cheat is recorded as an error
    opts = tp.backends()["tune-test-cheater"].resolve()
    best = tp.Records(tmp_path).best(func, "tune-test-cheater", opts)
    assert "decision=0" in str(best.trace) and float(best.run_secs[0]) == 2.0


def test_when_nothing_beats_the_heuristic_its_record_is_the_best_and_the_build_uses_it(cheater, tmp_path):
    tp.register_backend(Slower)
    func = doubling()
    result = tp.tune(func, "tune-test-slower, llvm", trials=4, records=tmp_path, strategy="replay-trace",
                     batch=2, seed=2)
    [task] = result.tasks
    assert task.failures == 0 and task.heuristic == task.best == 2.0 and task.trials == 4
    opts = tp.backends()["tune-test-slower"].resolve()
    best = tp.Records(tmp_path).best(func, "tune-test-slower", opts)
    assert "decision=0" in str(best.trace) and float(best.run_secs[0]) == 2.0
    model = tp.build(func, "tune-test-slower, llvm", records=tmp_path)
    x = np.arange(64, dtype=np.int32)
    TICKS.clear()
    model(x, np.zeros(64, np.int32))
    assert len(TICKS) == 2          # the heuristic's schedule, not the slower one


def test_an_artifact_that_is_not_bit_exact_says_which_buffer(cheater, tmp_path):
    from tirpat.model.records import workload

    opts = {}
    key = workload(doubling(), "tune-test-cheater", opts)
    sch = s_tir.Schedule(key)
    sch.annotate(sch.get_sblock("B"), "cheat", 1)
    Cheater._schedule(sch)
    host = tvm.target.Target("llvm")
    path = pack(tmp_path / "cheat.tptune", sch.mod, host, reference(key, host, seed=0))
    with pytest.raises(NotBitExact, match=r"buffer B: 1 of 64 elements differ from the reference \(first at \[63\]"):
        measure(path)


@pytest.mark.parametrize("name", ["tirpat.model.tune.space", "tirpat.model.tune.rpc", "tirpat.model.tune.artifact",
                                  "tirpat.model.tune.runners", "tirpat.model.tune.tuner", "tirpat.model.records",
                                  "accel.compiler.tuning", "accel.compiler.schedule"])
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS,
                             extraglobs={"tp": tp, "tvm": tvm})
    assert result.failed == 0


class Plain(tp.Backend):
    """A backend with no design space: its partitions are not tuned."""

    name = "tune-test-plain"


def test_a_primfunc_goes_to_the_first_backend_with_a_design_space(cheater, tmp_path):
    tp.register_backend(Plain)
    a = te.placeholder((32, 64), "int8", name="a")
    w = te.placeholder((16, 64), "int8", name="w")
    func = te.create_prim_func([a, w, topi.nn.dense(a, w, out_dtype="int32")])
    result = tp.tune(func, "tune-test-plain, accel, llvm", trials=2, records=tmp_path, strategy="replay-trace",
                     batch=1)
    assert [(t.backend, t.failures) for t in result.tasks] == [("accel", 0)]
    with pytest.raises(ValueError, match="nothing to tune.*tune-test-plain"):
        tp.tune(func, "tune-test-plain, llvm", trials=2, records=tmp_path)


# --------------------------------------------------------------------------- call sites and priors
def test_copies_for_call_sites_are_one_task_and_no_layer_gets_slower(tmp_path):
    """Three layers of one shape, the middle one with other requantise constants: two
    partition functions (``<name>`` and ``<name>_s1``) and one task, tuned once; its best
    record is written for both, so all three call sites are built from records, bit-exact,
    and none takes more cycles than untuned."""
    from models import reference as vm_reference
    from test_call_sites import chain, weights

    from tirpat.model.build import bind_params

    mod = bind_params(chain([(3, 9, 0), (5, 11, 0), (3, 9, 0)]), weights(3, 0))
    bases: dict = {}
    names = [name for name, *_ in tp.partition_functions(mod, "accel, llvm", bases=bases)]
    assert len(names) == 2 and list(bases.items()) == [(f"{names[0]}_s1", names[0])]
    result = tp.tune(mod, "accel, llvm", trials=6, records=tmp_path, strategy="replay-trace", batch=3, seed=2)
    [task] = result.tasks
    assert task.copies == (f"{names[0]}_s1",) and task.trials == 6
    x = np.random.default_rng(5).integers(-128, 128, (16, 32), dtype=np.int8)
    untuned, tuned = tp.build(mod, "accel, llvm"), tp.build(mod, "accel, llvm", records=tmp_path)
    assert tuned.report.records["applied"] == len(tuned.report.partitions) == 3
    np.testing.assert_array_equal(tuned(x), vm_reference(mod, [x]))
    untuned(x)
    before, after = [l.cycles for l in untuned.layers], [l.cycles for l in tuned.layers]
    assert len(before) == len(after) == 3
    assert all(a <= b for a, b in zip(after, before)), (before, after)
    assert tuned.stats["accel"].cycles <= untuned.stats["accel"].cycles
    assert task.best <= task.heuristic


def test_the_backends_cheapest_candidate_by_its_estimate_is_the_second_measured(tmp_path):
    """accel estimates its whole knob space (``Backend.tune_candidates``): with a budget of
    two, the heuristic and then the candidate it estimates cheapest are measured, and the
    best record is the cheaper of the two."""
    from accel.compiler.schedule import gemm_blocks

    func = conv_layer()
    accel_backend = tp.backends()["accel"]
    [(block, _)] = gemm_blocks(s_tir.Schedule(ir.IRModule({"main": func})))
    cheapest = accel_backend.tune_candidates(func, accel_backend.resolve())[0][1]
    result = tp.tune(func, "accel, llvm", trials=2, records=tmp_path, seed=1)
    assert result.trials == 2
    db = tp.Records(tmp_path).database
    annotations = []
    for record in db.get_all_tuning_records():
        sch = s_tir.Schedule(ir.IRModule({"main": func}))
        record.trace.apply_to_schedule(sch, remove_postproc=True)
        annotations.append({key: int(v) for key, v in sch.get(sch.get_sblock(block)).annotations.items()})
    assert {key: value for (_, key), value in cheapest.items()} in annotations
    [task] = result.tasks
    assert task.best <= task.heuristic


def test_without_estimates_a_prior_makes_its_likeliest_values_the_second_candidate(tmp_path, monkeypatch):
    """A backend without ``tune_candidates``: with a budget of two, the heuristic and then
    the values its knobs' priors favour (accel's: a large M block and a resident weight)."""
    from accel.compiler.schedule import gemm_blocks

    monkeypatch.setattr(type(tp.backends()["accel"]), "tune_candidates", lambda self, func, opts: None)
    func = conv_layer()
    result = tp.tune(func, "accel, llvm", trials=2, records=tmp_path, seed=1)
    assert result.trials == 2
    db = tp.Records(tmp_path).database
    knobs = []
    for record in db.get_all_tuning_records():
        sch = s_tir.Schedule(ir.IRModule({"main": func}))
        record.trace.apply_to_schedule(sch, remove_postproc=True)
        [(block, _)] = gemm_blocks(sch)
        knobs.append(Knobs.from_annotations(sch.get(sch.get_sblock(block)).annotations))
    heuristic = [k for k in knobs if k.bm == 1]
    likely = [k for k in knobs if k.bm != 1]
    assert len(heuristic) == 1 and len(likely) == 1
    assert likely[0].bm > 1 and likely[0].weights == "resident"


def test_priors_are_checked_and_give_the_likeliest_value():
    assert tp.Knob("B", "k", (1, 2, 4), default=1, prior=(1, 2, 3)).likely == 2
    assert tp.Knob("B", "k", (1, 2, 4), default=2, prior=(1, 1, 1)).likely == 1     # no preference: the default
    assert tp.Knob("B", "k", (1, 2), default=1).probabilities == [0.5, 0.5]
    with pytest.raises(ValueError, match="one positive weight per value"):
        tp.Knob("B", "k", (1, 2), default=1, prior=(1,))
    with pytest.raises(ValueError, match="one positive weight per value"):
        tp.Knob("B", "k", (1, 2), default=1, prior=(1, 0))


def test_the_table_tells_apart_tasks_whose_names_differ_only_in_the_middle(tmp_path):
    """A real model's partitions (ppocr's convolutions) differ in the middle of long names:
    elided alike, two rows would read the same; those are shown whole, in the summary too."""
    from tirpat.model.tune.tuner import TaskResult, TuneResult

    a, b = (f"fused_relax_nn_conv2d_relax_{op}_relax_multiply_relax_right_shift_relax_clip_relax_astype"
            for op in ("add", "subtract"))
    result = TuneResult(tmp_path, [TaskResult(a, "accel", budget=4, trials=4), TaskResult(b, "accel"),
                                   TaskResult("fused_small", "accel")], 1.0, asked=4)
    rows = str(result).splitlines()[1:4]
    assert [r.split()[0] for r in rows] == [a, b, "fused_small"]
    assert (f"the most to gain first: {a}; the other 2 left at their backend's own schedule: {b}, fused_small"
            in str(result))
