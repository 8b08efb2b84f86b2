"""Any Config the option check accepts compiles: the scheduler shrinks a GEMM's blocks to
fit its scratchpads, or leaves the GEMM to the CPU with the reason; never a
ScratchpadOverflow at compile time. Bit-exact vs numpy (TIR) and ``tvm.compile`` (models)."""

import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import accel
import tirpat as tp
from tirpat.cli.model_file import load_model
from tirpat.testing.differential import assert_matches_llvm
ROOT = Path(__file__).resolve().parents[2]


def _sibling(name: str):
    """A test module next to this one, by path (tests/model has a test_build.py too)."""
    spec = importlib.util.spec_from_file_location(f"accel_tests_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


workload = _sibling("test_build").workload
conv_workload = _sibling("test_conv").conv_workload


@st.composite
def configs(draw):
    """Configs from one tile per scratchpad (the least the option check accepts) to a few:
    each size a whole number of SRAM rows."""
    t = draw(st.sampled_from([8, 16, 32]))
    rows = lambda: draw(st.integers(t, 6 * t))  # noqa: E731
    return accel.Config(tile=t, inp_bytes=rows() * t, wgt_bytes=rows() * t, acc_bytes=rows() * t * 4)


def roomy(config: accel.Config) -> bool:
    """Room for the smallest blocks, double-buffered, and a bias next to the accumulator."""
    t = config.tile
    return min(config.inp_elements, config.wgt_elements) >= 2 * t * t and config.acc_elements >= 2 * (t * t + t)


@settings(max_examples=25, deadline=None)
@given(configs(), st.sampled_from(["dense", "batch_matmul", "conv"]), st.integers(1, 70), st.integers(1, 70),
       st.integers(1, 70), st.sampled_from(["none", "bias", "requant"]))
def test_every_accepted_config_compiles_and_runs_bit_exact(config, kind, m, n, k, epilogue):
    if kind == "conv":
        func, inputs, reference = conv_workload("NHWC", 1, k, 1 + m % 9, 1 + m % 7, n, 3, 1, 1,
                                                epilogue="bias_relu" if epilogue == "bias" else epilogue)
    else:
        func, inputs, reference = workload(kind, m, n, k, "requant_saturate" if epilogue == "requant" else epilogue)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)
        ex = accel.build(func, config)
    args, out = inputs(np.random.default_rng(m + n + k))
    with accel.Session(config):
        ex(*args, out)
    np.testing.assert_array_equal(out, reference(*args))
    if roomy(config):
        assert ex.report.share("accel") == 1.0, str(ex.report)
    elif ex.report.share("accel") < 1.0:
        assert any("smallest blocks do not fit accel's" in why for _, why in ex.report.partitions[0].on_host), str(ex.report)


def test_a_gemm_that_does_not_fit_stays_on_the_cpu_and_says_which_option():
    func, inputs, reference = workload("dense", 32, 32, 32, "bias")
    config = accel.Config(acc_bytes=1024)       # one 16x16 int32 tile, no room for its bias
    with pytest.warns(tp.OffloadWarning, match=r"ACC scratchpad: .* the target's Config has 1024 \(acc_bytes"):
        ex = accel.build(func, config)
    assert ex.report.share("accel") == 0.0
    args, out = inputs(np.random.default_rng(0))
    ex(*args, out)
    np.testing.assert_array_equal(out, reference(*args))


@pytest.fixture(scope="module")
def mlp_int8():
    return load_model(ROOT / "examples" / "models" / "mlp_int8.py")


@pytest.mark.parametrize("options, on_accel", [("-wgt_bytes=2048", True), ("-wgt_bytes=1024", True),
                                               ("-acc_bytes=1024", False), ("-tile=64 -acc_bytes=16384", False)])
def test_the_trials_configs_compile_the_example_mlp(mlp_int8, options, on_accel):
    # the new-user trial's targets, which failed with ScratchpadOverflow
    model = assert_matches_llvm(mlp_int8, f"accel {options}, llvm", calls=1)     # on an int8 x[16, 64] of seed 0
    assert (model.report.macs["host"] == 0) == on_accel
    if not on_accel:
        assert "do not fit accel's ACC scratchpad" in str(model.report)
