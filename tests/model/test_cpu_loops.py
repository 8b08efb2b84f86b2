"""An offloaded partition's large CPU nests that compute per element run in host functions
(-O3), called from the partition's -O0 code, when the model is linked (tirpat.model.cpu_loops)."""

import re

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import tirx
from tvm.script import tirx as T

import tirpat as tp
import tirpat.model.build as build_module
from tirpat.model.cpu_loops import MIN_ELEMENTS, SYMBOL_PREFIX, outline_cpu_loops
from tirpat.model.native import link
from models import cnn, random_inputs, reference


def _tree(module):
    yield module
    for imported in module.imports:
        yield from _tree(imported)


def _sources(model):
    """(host, offloaded): the LLVM source of the model's host module and of its partitions'."""
    sources = [m.inspect_source("ll") for m in _tree(model.executable.mod) if m.kind == "llvm"]
    offloaded = next(s for s in sources if "@.tvm_func.accel." in s)
    return next(s for s in sources if s is not offloaded), offloaded


def _called(source: str) -> set:
    return set(re.findall(rf"declare i32 @{SYMBOL_PREFIX}(\w+_cpu\d+)\(", source))


@pytest.fixture(scope="module")
def padded_cnn():
    mod = cnn(size=16)      # its convolutions' zero padding stays on the CPU: 9,216 guarded stores
    return mod, tp.build(mod, "accel, llvm")


def test_a_partitions_padding_runs_in_the_host_module_at_O3(padded_cnn):
    _, model = padded_cnn
    host, offloaded = _sources(model)
    called = _called(offloaded)
    assert called, "the partitions call their padding nests"
    for name in called:
        defined = re.compile(rf"^define .*@{SYMBOL_PREFIX}{name}\(", re.M)
        assert defined.search(host), "defined in the host's code (TVM's -O3)"
        assert not defined.search(offloaded)
    assert "opt-level" not in host and r"\22opt-level\22:0" in offloaded


def test_nothing_is_outlined_when_the_model_will_not_be_linked(padded_cnn, monkeypatch):
    """A JIT-compiled module cannot call into another: a model that is not linked keeps its
    nests in its partitions; both compute what tvm.compile's model does, and count the same cycles."""
    mod, linked = padded_cnn
    monkeypatch.setattr(build_module, "can_link", lambda host: False)
    model = tp.build(mod, "accel, llvm")
    host, offloaded = _sources(model)
    assert not _called(offloaded) and "_cpu0" not in host
    for seed in range(4):
        args = random_inputs(mod, np.random.default_rng(seed))
        want = reference(mod, args)
        np.testing.assert_array_equal(linked(*args), want)
        np.testing.assert_array_equal(model(*args), want)
        assert model.stats["accel"].cycles == linked.stats["accel"].cycles


def _partition(n: int, pad: int, copy: int):
    """A partition-like function: a guarded nest (zero padding of an n x n input), a small
    guarded nest, a copy nest, a nest calling a runtime function and a nest using an outer
    loop's variable."""
    m = n + 2 * pad

    @T.prim_func
    def part(x: T.Buffer((n, n), "int8"), y: T.Buffer((m, m), "int8"), z: T.Buffer((copy, n), "int8"),
             s: T.Buffer((4, 4), "int8"), r: T.Buffer((2, n, n), "int32")):
        T.func_attr({"global_symbol": "part", "tirx.noalias": True})
        for i, j in T.grid(m, m):
            y[i, j] = T.if_then_else(pad <= i and i < n + pad and pad <= j and j < n + pad,
                                     x[i - pad, j - pad], T.int8(0))
        for i, j in T.grid(4, 4):
            s[i, j] = T.if_then_else(i < 2, x[i, j], T.int8(1))
        for i, j in T.grid(copy, n):
            z[i, j] = x[j, i % n]
        for t in range(2):
            T.evaluate(T.call_packed("tirpat.test.nothing", t))
            for i, j in T.grid(n, n):
                r[t, i, j] = T.if_then_else(i < n - 1, T.Cast("int32", x[i, j]) * (t + 1), 0)

    return part


def test_only_large_nests_that_compute_alone_are_outlined():
    mod = outline_cpu_loops(lambda func: True)(tvm.IRModule({"part": _partition(64, 1, 64)}))
    assert sorted(gv.name_hint for gv in mod.functions) == ["part", "part_cpu0"]
    callee = mod["part_cpu0"]
    assert sorted(p.name for p in callee.params) == ["x", "y"] and bool(callee.attrs["tirx.noalias"])
    body = mod["part"].body
    assert isinstance(body, tirx.SeqStmt) and isinstance(body[0], tirx.Evaluate)
    assert body[0].value.op.name == "tirx.tvm_call_cpacked" and body[0].value.args[0].value == SYMBOL_PREFIX + "part_cpu0"
    assert all(isinstance(stmt, tirx.For) for stmt in list(body)[1:]), "the other nests stay"
    # below the threshold nothing moves
    small = tvm.IRModule({"part": _partition(8, 1, 8)})
    assert (8 + 2) ** 2 < MIN_ELEMENTS
    assert len(outline_cpu_loops(lambda func: True)(small).functions) == 1
    # a function the selection declines keeps its nests
    assert len(outline_cpu_loops(lambda func: False)(tvm.IRModule({"part": _partition(64, 1, 64)})).functions) == 1


@tvm.register_global_func("tirpat.test.nothing", override=True)
def _runtime_nothing(t):
    return None


@settings(max_examples=6, deadline=None)
@given(n=st.integers(64, 100), pad=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_outlined_nests_compute_what_the_partition_computed(n, pad, seed):
    """Differential: the partition compiled at -O0 with its nests, and the partition at -O0
    calling its outlined nest compiled at -O3, linked as tp.build links a model, on random data."""
    part = _partition(n, pad, 8)
    at_o0 = tvm.target.Target({"kind": "llvm", "opt-level": 0})
    whole = tvm.tirx.build(tvm.IRModule({"part": part}), at_o0)
    mod = outline_cpu_loops(lambda func: func.attrs["global_symbol"] == "part")(tvm.IRModule({"part": part}))
    host = tvm.tirx.build(tvm.IRModule({"part_cpu0": mod["part_cpu0"]}), "llvm")
    host.import_module(tvm.tirx.build(tvm.IRModule({"part": mod["part"]}), at_o0))
    linked = link(host, tvm.target.Target("llvm"))
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (n, n), dtype=np.int8)
    shapes = [((n + 2 * pad, n + 2 * pad), "int8"), ((8, n), "int8"), ((4, 4), "int8"), ((2, n, n), "int32")]
    results = []
    for function in (whole["part"], linked.module["part"]):
        outs = [tvm.runtime.tensor(rng.integers(-5, 5, shape).astype(dtype)) for shape, dtype in shapes]
        function(tvm.runtime.tensor(x), *outs)
        results.append([o.numpy() for o in outs])
    for want, got in zip(*results):
        np.testing.assert_array_equal(got, want)
