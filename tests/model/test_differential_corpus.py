"""The differential corpus: random int8 models (``tirpat.testing.int8_models``) built with
``tp.build(mod, "accel, llvm")`` compute bit for bit what ``tvm.compile(mod, "llvm")``
computes, and accel takes work from them. ``benchmarks/differential_corpus.py`` runs the
same generator on hundreds of seeds."""

import warnings

import pytest
from hypothesis import Phase, given, note, settings

from tirpat.testing.int8_models import compare_with_llvm, int8_models, random_int8_model


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # offload warnings: operators left on the host are expected
        yield


# a model is drawn by its seed, which does not shrink to a simpler model: no shrink phase
# (each step would be one more build)
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)


def assert_bit_exact(model):
    result = compare_with_llvm(model, "accel, llvm")
    assert result.outcome == "bit-exact", f"{result}\n{model.describe()}"
    return result


@settings(max_examples=12, phases=NO_SHRINK)
@given(int8_models(overflow=False))
def test_models_without_overflow_are_bit_exact(model):
    note(model.describe())
    assert_bit_exact(model)


@settings(max_examples=8, phases=NO_SHRINK)
@given(int8_models(overflow=True))
def test_models_whose_epilogues_pass_int32_are_bit_exact(model):
    """Products that wrap and narrowing casts that truncate: accel computes llvm's wrapping
    int32 arithmetic (or declines the chain)."""
    note(model.describe())
    assert_bit_exact(model)


# seeds whose models hold a layer repeated at several sites with different constants, one
# of them with epilogues that wrap: the offload is checked where it is known to happen
@pytest.mark.parametrize("seed, overflow", [(1, False), (8, False), (5, True), (7, True)])
def test_partitions_called_at_several_sites_run_on_accel(seed, overflow):
    model = random_int8_model(seed, overflow=overflow)
    assert model.sites > 1
    result = assert_bit_exact(model)
    assert result.macs.get("accel", 0) > 0, result


def test_an_nchw_epilogue_the_alu_declines_wraps_on_the_cpu_as_llvm_does():
    """A grouped NCHW conv whose epilogue (``min(max(acc + b, 0) * 231919, 146733) + ...``
    plus a residual computed on the host) the ALU declines: its blocks stay apart on the CPU,
    where LLVM, inlined, would have folded the min as if the product never wrapped (117 of
    315 elements differed)."""
    model = random_int8_model(1460175, overflow=True)
    assert "g5" in model.describe() and "(overflows)" in model.describe()
    assert assert_bit_exact(model).macs.get("accel", 0) > 0


@pytest.mark.parametrize("seed", [1460085, 1460111])
def test_wrapping_chains_in_fused_functions_compute_what_one_loop_per_operator_computes(seed):
    """Epilogues whose products wrap, in a function of several operators (an accel partition's
    CPU part; a host function FuseTIR made, 1460111 runs all on the host): LLVM, unrolling
    the small loops, saw the chain at once and folded it as if nothing wrapped (44 of 64 and
    14 of 28 elements differed); tirpat.tir.wrapping makes the stored arithmetic wrap."""
    assert_bit_exact(random_int8_model(seed, overflow=True))


@pytest.mark.parametrize("seed", [1793, 2050, 17125])
def test_a_narrowing_cast_of_a_host_epilogue_pinned_to_a_constant_builds(seed):
    """A host epilogue whose max and min pin the value to one constant outside int8
    (``int8(min(max(v, 472153), -139616))`` at 2050, ``int8(max(min(v, -415006), 30366) >> 2)``
    at 1793; 17125 has an accel partition besides), narrowed without a clip: inlined into one
    expression, TVM's fold of the cast raised "Literal value ... exceeds range of int8"; the
    host truncates, as llvm does. Seeds 0 to 20000 held four such models (16784 the other)."""
    model = random_int8_model(seed, overflow=True)
    assert "(no clip: wrapping narrow)" in model.describe()
    assert assert_bit_exact(model).macs.get("host", 0) > 0
