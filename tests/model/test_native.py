"""tp.build leaves machine code: the offloaded partitions compiled apart at LLVM -O0, the model
linked into a shared library, so that its VMs compile nothing (tirpat.model.native)."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tirpat as tp
from models import cnn, random_inputs, reference


@pytest.fixture(scope="module")
def cnn_model():
    mod = cnn()
    return mod, tp.build(mod, "accel, llvm")


def _tree(module):
    yield module
    for imported in module.imports:
        yield from _tree(imported)


def test_offloaded_partitions_are_an_llvm_module_of_their_own_at_O0(cnn_model):
    _, model = cnn_model
    sources = [m.inspect_source("ll") for m in _tree(model.executable.mod) if m.kind == "llvm"]
    assert len(sources) == 2
    offloaded = [s for s in sources if "@.tvm_func.accel." in s]
    assert len(offloaded) == 1, "the device's runtime calls are all in one module"
    assert r"\22opt-level\22:0" in offloaded[0]
    host = next(s for s in sources if s is not offloaded[0])
    assert "opt-level" not in host, "the host's operators keep TVM's default (-O3)"
    assert any(p.backend == "accel" for p in model.report.partitions)


def test_offloaded_partitions_are_compiled_without_argument_checks(cnn_model):
    """The offloaded partitions' code has none of the packed calling convention's argument
    checks (their caller is the model's VM, typed by Relax); the host's functions keep theirs,
    and a wrong input is still refused at the model's entry."""
    mod, model = cnn_model
    sources = [m.inspect_source("ll") for m in _tree(model.executable.mod) if m.kind == "llvm"]
    offloaded = next(s for s in sources if "@.tvm_func.accel." in s)
    host = next(s for s in sources if s is not offloaded)
    assert "Mismatched type on argument #" in host
    assert "Mismatched" not in offloaded and " arguments" not in offloaded
    args = random_inputs(mod, np.random.default_rng(0))
    with pytest.raises(ValueError, match="shape"):
        model(*[a[..., :-1] for a in args])


def test_the_model_runs_a_loaded_library_whose_vms_compile_nothing(cnn_model):
    mod, model = cnn_model
    runnable = model._linked.module
    assert [m.kind for m in _tree(runnable) if m.kind == "llvm"] == [], "no LLVM IR left to JIT"
    args = random_inputs(mod, np.random.default_rng(3))
    want = reference(mod, args)
    got = {}

    def call(n):        # each thread makes its own VM on the same library
        got[n] = model(*args)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in range(2):
        np.testing.assert_array_equal(got[n], want)


@settings(max_examples=10)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_linked_model_is_bit_exact(cnn_model, seed):
    mod, model = cnn_model
    args = random_inputs(mod, np.random.default_rng(seed))
    np.testing.assert_array_equal(model(*args), reference(mod, args))


def test_export_writes_the_library_linked_at_build_time(cnn_model, tmp_path):
    mod, model = cnn_model
    path = model.export(tmp_path / "m.tirpat")
    args = random_inputs(mod, np.random.default_rng(5))
    np.testing.assert_array_equal(tp.load(path)(*args), reference(mod, args))


def test_a_model_for_another_cpu_is_not_linked_here():
    """Code for another architecture cannot be linked or run here: it stays LLVM IR, as
    tvm.compile leaves it (export compiles it; the first call here is refused)."""
    model = tp.build(cnn(), "accel, llvm -mtriple=aarch64-linux-gnu")
    assert model._linked is None
    with pytest.raises(tp.TargetError, match="aarch64"):
        model(*random_inputs(cnn(), np.random.default_rng(0)))


def test_a_linked_library_is_removed_with_its_model_quietly():
    """The library's directory goes when nothing holds the link any more, without the
    ResourceWarning a TemporaryDirectory left to the collector gives once per model."""
    import gc
    import os
    import warnings

    import tvm
    from tvm.script import tirx as T

    from tirpat.model.native import link

    @T.prim_func
    def double(A: T.Buffer((4,), "float32")):
        for i in range(4):
            A[i] = A[i] * T.float32(2)

    linked = link(tvm.compile(tvm.IRModule({"main": double}), "llvm"), tvm.target.Target("llvm"))
    directory = os.path.dirname(linked.path)
    module = linked.module
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del linked
        gc.collect()
    assert not os.path.exists(directory)
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    a = tvm.runtime.tensor(np.arange(4, dtype="float32"))
    module["main"](a)                       # the loaded code stays usable
    np.testing.assert_array_equal(a.numpy(), [0, 2, 4, 6])
