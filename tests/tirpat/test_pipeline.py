"""The TIR pipeline: TVM's passes, each once and in TVM's order, with tirpat's stage between
block lowering and FlattenBuffer."""

import doctest

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import tirpat as tp
from tirpat.tir import pipeline


@T.prim_func(s_tir=True)
def scale(A: T.Buffer((8,), "float32")):
    for i in range(8):
        with T.sblock("b"):
            vi = T.axis.remap("S", [i])
            A[vi] = A[vi] * T.float32(2)


@tvm.instrument.pass_instrument
class PassLog:
    """The names of the passes run, in order (wrappers included)."""

    def __init__(self):
        self.names = []

    def run_before_pass(self, mod, info):
        self.names.append(info.name)


STAGE = "tests.pipeline.stage"
tvm.tirx.compilation_pipeline.register_tir_pipeline(
    "tests.pipeline.identity", tp.tir_pipeline(tvm.transform.Sequential([], name=STAGE), name="tests.identity"))


EARLY = "tests.pipeline.early"
tvm.tirx.compilation_pipeline.register_tir_pipeline(
    "tests.pipeline.with_early", tp.tir_pipeline(tvm.transform.Sequential([], name=STAGE), name="tests.early",
                                                 early=tvm.transform.Sequential([], name=EARLY)))


def passes_run(pipeline_name, config):
    log = PassLog()
    with tvm.transform.PassContext(opt_level=3, instruments=[log], config=config):
        tvm.compile(tvm.IRModule({"main": scale}), target="llvm", tir_pipeline=pipeline_name)
    return log.names


SWITCHES = {"tirx.disable_storage_rewrite": True, "tirx.use_async_copy": True, "tirx.instrument_bound_checkers": True,
            "tirx.disable_cse_tir": True, "tirx.s_tir.ldg32": True}


@pytest.mark.parametrize("config", [{}, SWITCHES], ids=["default", "switches"])
def test_each_tvm_pass_runs_once_in_tvm_order_with_the_stage_before_flattening(config):
    ours = passes_run("tests.pipeline.identity", config)
    tvms = passes_run("default", config)
    wrappers = {"_pipeline", "tests.identity.pipeline", "tirpat.LowerBlocks", STAGE, "sequential"}
    assert [n for n in ours if n not in wrappers] == [n for n in tvms if n not in wrappers]
    assert ours.index(STAGE) == ours.index("s_tir.LowerOpaqueBlock") + 1
    assert ours.index("tirx.FlattenBuffer") > ours.index(STAGE)
    assert ours.count("s_tir.CompactBufferAllocation") == 1


def test_the_early_stage_runs_before_the_layout_passes():
    ours = passes_run("tests.pipeline.with_early", {})
    tvms = passes_run("default", {})
    wrappers = {"_pipeline", "tests.early.pipeline", "tirpat.LowerBlocks.early", "tirpat.LowerBlocks.late", STAGE, EARLY,
                "sequential"}
    assert [n for n in ours if n not in wrappers] == [n for n in tvms if n not in wrappers]
    assert ours.index("s_tir.LowerMatchBuffer") < ours.index(EARLY) < ours.index("s_tir.InjectPermutedLayout")
    assert ours.index("s_tir.InjectSoftwarePipeline") < ours.index("s_tir.LowerOpaqueBlock") < ours.index(STAGE)


def test_register_pipeline_runs_rewriters_once_in_the_stage():
    calls = []

    @tvm.transform.module_pass(opt_level=0, name="tests.pipeline.count")
    def count(mod, ctx):
        calls.append(mod)
        return mod

    rw = tp.Rewriter.from_pattern(tp.is_store(tp.is_buffer("A"), [tp.wildcard()], tp.wildcard()), lambda m: None)
    tp.register_pipeline("tests.pipeline.after", rw, after=[count])
    log = PassLog()
    with tvm.transform.PassContext(instruments=[log]):
        ex = tvm.compile(tvm.IRModule({"main": scale}), target="llvm", tir_pipeline="tests.pipeline.after")
    assert len(calls) == 1 and log.names.count("s_tir.LowerOpaqueBlock") == 1
    assert log.names.index("tests.pipeline.count") < log.names.index("tirx.FlattenBuffer")
    a = tvm.runtime.tensor(np.arange(8, dtype="float32"))
    ex["main"](a)
    np.testing.assert_array_equal(a.numpy(), 2 * np.arange(8, dtype="float32"))


def test_tir_pipeline_takes_a_pass():
    with pytest.raises(TypeError, match="stage must be a tvm.transform.Pass"):
        tp.tir_pipeline(lambda mod: mod)
    with pytest.raises(TypeError, match="early must be a tvm.transform.Pass"):
        tp.tir_pipeline(tvm.transform.Sequential([]), early="rules")
    with pytest.raises(TypeError, match="expected Rewriter objects"):
        tp.register_pipeline("tests.pipeline.bad_early", [], early=[tvm.transform.Sequential([])])


def test_docstring_examples():
    result = doctest.testmod(pipeline, extraglobs={"tp": tp, "np": np}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
