"""A build's bookkeeping travels explicitly: each build fills its own record (concurrent builds
too), and a PrimFunc says which Relax partition it computes in an attribute, which consumers
read instead of parsing function names."""

import threading

import numpy as np
import pytest
import tvm
from tvm import relax, tirx
from tvm.relax.dpl import is_op, wildcard

import tirpat as tp
import tirpat.model.backend as backend_module
from tirpat.model.partition import PARTITION_ATTR, PartitionOrigin, origin_of
from tirpat.model.pipeline import Record, lower_partitions, tir_pipeline_for
from models import matmul, random_inputs, reference


def _own_registry(monkeypatch) -> None:
    """Backends registered by the test go into a copy of the registry, dropped after it; the
    entry points' backends (accel) are loaded first, so they are not dropped with the copy."""
    tp.backends()
    monkeypatch.setattr(backend_module, "_REGISTRY", dict(backend_module._REGISTRY))


@pytest.fixture
def lockstep(monkeypatch):
    """A backend taking matmuls whose schedule waits for a second build at the same point:
    two builds are surely inside their pipelines at once."""
    _own_registry(monkeypatch)
    barrier = threading.Barrier(2)

    class Lockstep(tp.Backend):
        name = "ctx-test-lockstep"

        def patterns(self, opts):
            return [("ctx-test-lockstep.matmul", is_op("relax.matmul")(wildcard(), wildcard()))]

        def schedule(self, func, opts):
            barrier.wait(timeout=120)
            return func

    tp.register_backend(Lockstep)
    return Lockstep.name


@pytest.mark.filterwarnings("ignore:part of the model stays on the host")
def test_two_threads_building_at_once_each_get_their_own_record(lockstep):
    shapes = {"a": (3, 20, 7), "b": (5, 11, 4)}
    mods = {key: matmul(*shape) for key, shape in shapes.items()}    # (a BlockBuilder is not for threads)
    built, errors = {}, []

    def build(key):
        try:
            built[key] = tp.build(mods[key], f"{lockstep}, llvm")
        except Exception as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=build, args=(k,)) for k in shapes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and not any(t.is_alive() for t in threads), errors
    for key, (m, k, n) in shapes.items():
        report = built[key].report
        (part,) = report.partitions         # its own partition only, not the other build's
        assert part.backend == lockstep and part.fallback is None and part.macs == m * k * n
        assert sum(report.macs.values()) == m * k * n       # (on the host: the backend has no rules)
        args = random_inputs(mods[key], np.random.default_rng(0))
        np.testing.assert_array_equal(built[key](*args), reference(mods[key], args))
    # each build's TIR pipeline was registered for it alone, and is gone
    assert not [n for n in tvm.tirx.compilation_pipeline.PIPELINE_MAP if n.startswith(f"{tp.TIR_PIPELINE}.")]


def test_each_lowered_primfunc_names_its_partition_and_operators(monkeypatch):
    _own_registry(monkeypatch)

    class Plain(tp.Backend):
        name = "ctx-test-plain"

        def patterns(self, opts):
            return [("ctx-test-plain.matmul_add",
                     is_op("relax.add")(is_op("relax.matmul")(wildcard(), wildcard()), wildcard()))]

    tp.register_backend(Plain)
    x = relax.Var("x", relax.TensorType((4, 8), "int32"))
    w = relax.Var("w", relax.TensorType((8, 3), "int32"))
    b = relax.Var("b", relax.TensorType((3,), "int32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(x, w), b))
        bb.emit_func_output(out)
    record = Record()
    lowered = lower_partitions(record=record)(tp.partition(bb.get(), "ctx-test-plain, llvm"))
    tagged = {gv.name_hint: f for gv, f in lowered.functions.items()
              if isinstance(f, tirx.PrimFunc) and f.attrs is not None and "tirpat.backend" in f.attrs}
    ((name, func),) = tagged.items()
    assert origin_of(func) == PartitionOrigin(name, ("relax.matmul", "relax.add"))
    assert list(record.partitions) == [name]

    # under any other name (a copy TVM makes, say) it is still that partition, for the record
    renamed = tvm.IRModule({"arbitrary_copy_17": func.with_attr("global_symbol", "arbitrary_copy_17")})
    with tir_pipeline_for(record) as pipeline:
        tvm.compile(renamed, target="llvm", tir_pipeline=pipeline)
    assert list(record.rules) == [name] and not record.failed


def test_a_primfunc_without_the_attribute_has_no_origin():
    func = tirx.PrimFunc([], tirx.Evaluate(0))
    assert origin_of(func) is None
    assert origin_of(func.with_attr(PARTITION_ATTR, PartitionOrigin("p", ()).attr())) == PartitionOrigin("p", ())
