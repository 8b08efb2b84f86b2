"""A partition its backend cannot lower runs on the host; the build never fails for it."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm.script import ir as I, relax as R

import tirpat as tp
import tirpat.model.backend as backend_module
from models import matmul, mlp, random_inputs, reference


@I.ir_module
class InvertedClip:
    """matmul + bias + shift, then a clip whose bounds are inverted (every output is 10)."""

    @R.function
    def main(x: R.Tensor((5, 33), "int8"), w: R.Tensor((33, 19), "int8"), b: R.Tensor((19,), "int32")):
        with R.dataflow():
            h = R.add(R.matmul(x, w, out_dtype="int32"), b)
            h = R.right_shift(h, R.const(6, "int32"))
            y = R.astype(R.clip(h, 10, -10), "int8")
            R.output(y)
        return y


@pytest.fixture(scope="module")
def inverted_clip():
    with pytest.warns(tp.OffloadWarning, match=r"lv\d+ = relax.clip: accel: clip with its lower bound 10 above "
                      r"its upper bound -10"):
        return tp.build(InvertedClip, "accel, llvm")


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_accel_declines_a_clip_with_inverted_bounds_and_the_rest_stays_on_accel(inverted_clip, seed):
    args = random_inputs(InvertedClip, np.random.default_rng(seed))
    np.testing.assert_array_equal(inverted_clip(*args), reference(InvertedClip, args))
    (part,) = inverted_clip.report.partitions
    assert part.fallback is None and part.rules and part.ops[-1] == "relax.right_shift"


def test_a_partition_its_backend_cannot_lower_falls_back_to_the_host(monkeypatch):
    """Without accel's check, the clip joins the partition and accel's planner refuses it
    (PlanError): that partition runs on the host, TVM's lowering of the same PrimFunc."""
    import accel.compiler.patterns as patterns

    monkeypatch.setattr(patterns, "_check_epilogue", lambda *a: None)
    with pytest.warns(tp.OffloadWarning, match=r"(?s)fused_relax_matmul\S*_relax_clip\S* \(accel.matmul\) ran on the "
                      r"host: accel could not lower it \(its TIR passes or rules raised PlanError: .*no accel rule"):
        model = tp.build(InvertedClip, "accel, llvm")
    (part,) = model.report.partitions
    assert part.fallback.startswith("accel could not lower it") and part.rules == {} and part.host_macs == part.macs
    assert model.report.macs == {"accel": 0, "host": 5 * 33 * 19}
    # listed on the host, not under accel, which the model then does not need to run
    assert re.search(rf"  on the host:\n    {part.function} \(accel.matmul\): matmul \+ .*, 3,135 MACs: accel could "
                     r"not lower it", str(model.report)), str(model.report)
    assert model.backends == []
    for seed in range(3):
        args = random_inputs(InvertedClip, np.random.default_rng(seed))
        np.testing.assert_array_equal(model(*args), reference(InvertedClip, args))
    with pytest.raises(tp.OffloadError, match="could not lower it"):
        tp.build(InvertedClip, "accel, llvm", strict=True)


def test_a_fallen_back_partition_computes_what_the_model_computes(monkeypatch):
    """The planner refuses every partition of an MLP: each runs on the host, bit-exact."""
    from accel.compiler.planner import AccelPlanner
    from tirpat.device import PlanError

    def refuse(self, stmts, func_name):
        raise PlanError(f"{func_name}: refused by the test")

    monkeypatch.setattr(AccelPlanner, "check_sequence", refuse)
    mod = mlp(6, 40, 24, 10)
    with pytest.warns(tp.OffloadWarning, match="refused by the test"):
        model = tp.build(mod, "accel, llvm")
    assert model.report.partitions and all(p.fallback for p in model.report.partitions)
    assert model.report.macs["accel"] == 0
    for seed in range(3):
        args = random_inputs(mod, np.random.default_rng(seed))
        for got, want in zip(model(*args), reference(mod, args), strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_partition_scheduled_into_device_calls_falls_back_to_its_unscheduled_function(monkeypatch):
    """accel's element-wise core emits accel's calls in its schedule: when its planner then
    refuses the partition, the host runs the partition's own TIR (not those calls), bit-exact."""
    import sys
    from pathlib import Path

    from accel.compiler.planner import AccelPlanner
    from tirpat.device import PlanError

    sys.path.insert(0, str(Path(__file__).parents[1] / "accel"))
    from test_elementwise import chain_module

    def refuse(self, stmts, func_name):
        raise PlanError(f"{func_name}: refused by the test")

    monkeypatch.setattr(AccelPlanner, "check_sequence", refuse)
    mod = chain_module("add", (1, 8, 5, 5), (1, 8, 5, 5), (0.5, 0.25))
    with pytest.warns(tp.OffloadWarning, match=r"\(accel.elementwise\) ran on the host: accel could not lower it "
                      r"\(its TIR passes or rules raised PlanError: .*refused by the test"):
        model = tp.build(mod, "accel, llvm")
    (part,) = model.report.partitions
    assert part.fallback.startswith("accel could not lower it") and model.backends == []
    for seed in range(3):
        args = random_inputs(mod, np.random.default_rng(seed))
        np.testing.assert_array_equal(model(*args), reference(mod, args))


def test_a_schedule_that_raises_leaves_its_partition_on_the_host(monkeypatch):
    from tvm.relax.dpl import is_op, wildcard

    monkeypatch.setattr(backend_module, "_REGISTRY", dict(backend_module._REGISTRY))

    class Broken(tp.Backend):
        name = "fallback-test-broken"

        def patterns(self, opts):
            return [("fallback-test-broken.matmul", is_op("relax.matmul")(wildcard(), wildcard()))]

        def schedule(self, func, opts):
            raise ValueError("this backend cannot schedule anything")

    tp.register_backend(Broken)
    mod = matmul(3, 20, 7)
    with pytest.warns(tp.OffloadWarning, match=r"ran on the host: fallback-test-broken could not lower it \(its "
                      r"schedule raised ValueError: this backend cannot schedule anything\)"):
        model = tp.build(mod, "fallback-test-broken, llvm")
    args = random_inputs(mod, np.random.default_rng(0))
    np.testing.assert_array_equal(model(*args), reference(mod, args))


def test_an_interrupt_while_a_partition_is_lowered_is_no_fallback(monkeypatch):
    """Ctrl-C inside TVM's passes comes back out of the FFI as a RuntimeError (empty message): a
    build must not take it for a backend that failed (its partition on the host, exit 0) but stop."""
    import signal

    from accel.compiler.planner import AccelPlanner

    calls = []

    def interrupted(self, stmts, func_name):
        calls.append(func_name)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(AccelPlanner, "check_sequence", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tp.build(mlp(6, 40, 24, 10), "accel, llvm")
    assert calls     # (the interrupt arrived inside the lowering)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
