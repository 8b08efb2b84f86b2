"""A model's entry takes its statically sized storages from its VM, allocated once
(tirpat.model.storages): its intermediate tensors stay where they are from call to call,
and what it returns is never among them."""

import json
import warnings
import zipfile
from unittest import mock

import numpy as np
import pytest
import tvm
from hypothesis import given, settings, strategies as st
from tvm import relax

import tirpat as tp
from tirpat.device import invoke
from tirpat.model.partition import BACKEND_ATTR
from tirpat.model.storages import lift_storages
from tirpat.testing.differential import llvm_reference
from tirpat.testing.int8_models import int8_layer, random_int8_model

#: three matmul sites of one partition function, each with its own intermediate
MODEL = random_int8_model(8, overflow=False)


def _built(mod):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)
        return tp.build(mod, "accel, llvm")


def _requantised_view(bb, y):
    """A requantise to int8 (accel's), then a reshape of it (a view of the partition's
    output, which TVM makes of a reshape inside the dataflow block) and its rows' sums."""
    q = bb.emit(relax.op.astype(relax.op.clip(relax.op.right_shift(y, relax.const(9, "int32")), -128, 127), "int8"))
    view = bb.emit(relax.op.reshape(q, [q.ty.shape[0] * q.ty.shape[1]]))
    return relax.Tuple([view, bb.emit(relax.op.sum(relax.op.astype(q, "int32"), axis=[1]))])


#: its result holds a view of the tensor its partition writes
VIEWED = int8_layer("matmul", 12, 16, 32, _requantised_view)


@pytest.fixture(scope="module")
def model():
    return _built(MODEL.mod)


@pytest.fixture(scope="module")
def viewed():
    return _built(VIEWED)


@pytest.fixture(scope="module")
def references():
    return {"model": llvm_reference(MODEL.mod), "viewed": llvm_reference(VIEWED)}


def _flat(out) -> list:
    return [out] if isinstance(out, (tvm.runtime.Tensor, np.ndarray)) else list(out)


def _direct_calls(model, inputs: list) -> tuple[list, list, list]:
    """``model``'s VM called on each of ``inputs`` directly (its outputs kept as the VM's
    tensors): the outputs; per call, the addresses of the tensors its functions were called
    on that are neither its input nor its outputs (intermediates and constants); and per
    call, how many times it ran each VM builtin."""
    vm, storages = model._vm()
    seen: list = []
    builtins: list = []

    def instrument(func, symbol, before, result, *args):
        if before and symbol.startswith("vm.builtin."):
            builtins[-1][symbol] = builtins[-1].get(symbol, 0) + 1
        elif before:
            seen[-1].extend(a.data_ptr() for a in args if isinstance(a, tvm.runtime.Tensor))

    vm.set_instrument(instrument)
    outputs = []
    try:
        for x in inputs:
            seen.append([])
            builtins.append({})
            given = tvm.runtime.tensor(x)
            outputs.append(invoke(vm[model.entry], given, *storages))
            seen[-1] = [p for p in seen[-1] if p != given.data_ptr()]
    finally:
        vm.set_instrument(None)
    returned = [{t.data_ptr() for t in _flat(out)} for out in outputs]
    return outputs, [[p for p in call if p not in out] for call, out in zip(seen, returned)], builtins


def test_intermediate_tensors_stay_at_their_addresses(model):
    """The VM's pool would hand the storages out in another order each call (a free list
    per size, last in first out): here they are the same ones, every call."""
    outputs, intermediates, _ = _direct_calls(model, [MODEL.inputs(seed) for seed in range(4)])
    assert model._storages == "main_storages" and len(intermediates[0]) >= 2
    assert intermediates[1:] == intermediates[:-1]
    assert len({out.data_ptr() for out in outputs}) == len(outputs)      # each call's result its own


def test_the_entry_makes_only_its_result(model):
    """The tensors on the lifted storages are made once per VM too, and passed to the entry:
    a call makes its result's tensor alone (a VM instruction each, and an allocation, for
    each tensor of a model's hundred partitions), kills none and makes no tuple of a
    partition's outputs that nothing reads."""
    _, _, builtins = _direct_calls(model, [MODEL.inputs(seed) for seed in range(2)])
    assert builtins[0] == builtins[1]
    assert builtins[0].get("vm.builtin.alloc_tensor", 0) == 1
    assert not {"vm.builtin.make_tuple", "vm.builtin.tuple_getitem", "vm.builtin.copy"} & set(builtins[0])
    assert builtins[0]["vm.builtin.null_value"] <= 2      # the shape heap, the result's tensor a reshape views


def test_calls_after_the_first_bind_no_plan_again(model):
    """On one input tensor, a call after the first replays every stream on views its plan
    was bound to (at the first call, which prepared them): none binds again, but for the
    result's, whose storage the VM's pool hands out at two places in turn (the second one
    new at the second call)."""
    from accel.hw import fused

    x = tvm.runtime.tensor(MODEL.inputs())
    model(x)
    made = []
    with mock.patch.object(fused.FusedPlan, "_calls", autospec=True, side_effect=fused.FusedPlan._calls) as calls:
        for _ in range(3):
            model(x)
            made.append(calls.call_count)
    assert made[0] <= 1 and made[2] == made[0]
    np.testing.assert_array_equal(model(x), llvm_reference(MODEL.mod)(MODEL.inputs())[0])


@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=3))
def test_repeated_calls_compute_what_llvm_does_and_keep_earlier_results(model, viewed, references, seeds):
    """Calls on drawn inputs equal llvm's, through the model and through its VM, whose
    earlier results (a view of a partition's output among them) later calls leave alone."""
    for built, mod, reference in ((model, MODEL.mod, references["model"]), (viewed, VIEWED, references["viewed"])):
        shape = tuple(int(d) for d in mod["main"].params[0].ty.shape.values)
        inputs = [np.random.default_rng(seed).integers(-128, 128, shape, dtype=np.int8) for seed in seeds]
        wants = [reference(x) for x in inputs]
        for x, want in zip(inputs, wants):
            for got, w in zip(_flat(built(x)), want, strict=True):
                np.testing.assert_array_equal(got, w)
        kept, _, _ = _direct_calls(built, inputs)
        for out, want in zip(kept, wants):
            for got, w in zip(_flat(out), want, strict=True):
                np.testing.assert_array_equal(got.numpy(), w)


def test_a_storage_the_result_lives_in_stays_per_call(viewed):
    """VIEWED's storages hold its partition's output, which the result views, and the rows'
    sums, which it returns: nothing lifted."""
    assert viewed._storages is None


def test_an_exported_model_allocates_them_once_too(model, references, tmp_path):
    path = model.export(tmp_path / "m.tirpat")
    loaded = tp.load(path)
    assert loaded._storages == "main_storages"
    reference = references["model"]
    for seed in range(2):
        x = MODEL.inputs(seed)
        np.testing.assert_array_equal(loaded(x), reference(x)[0])
    _, intermediates, _ = _direct_calls(loaded, [MODEL.inputs(seed) for seed in range(3)])
    assert intermediates[1:] == intermediates[:-1] and intermediates[0]


def test_a_model_file_without_the_entry_says_none_and_a_bad_one_is_refused(model, tmp_path):
    """A file written before storages were lifted has no ``storages``: its entry allocates
    its own. A manifest whose ``storages`` is no string is malformed."""
    good = model.export(tmp_path / "m.tirpat")
    with zipfile.ZipFile(good) as z:
        files = {name: z.read(name) for name in z.namelist()}
    manifest = json.loads(files["manifest.json"])
    for name, value in (("old", None), ("bad", 3)):
        if value is None:
            manifest.pop("storages")
        else:
            manifest["storages"] = value
        with zipfile.ZipFile(tmp_path / f"{name}.tirpat", "w") as z:
            z.writestr("model.so", files["model.so"])
            z.writestr("manifest.json", json.dumps(manifest))
    assert tp.load(tmp_path / "old.tirpat")._storages is None
    with pytest.raises(ValueError, match="bad.tirpat: its manifest is malformed .*'storages' is a JSON int"):
        tp.load(tmp_path / "bad.tirpat")


def test_a_model_on_the_host_alone_keeps_its_entry_as_it_was(references):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        host = tp.build(MODEL.mod, "llvm")
    assert host._storages is None
    np.testing.assert_array_equal(host(MODEL.inputs()), references["model"](MODEL.inputs())[0])


def test_storages_of_a_symbolic_size_stay_in_the_entry():
    """Lowered with a symbolic batch ``n`` and one PrimFunc tagged as offloaded: the static
    storage is lifted; those of a size of ``n`` and the result's stay, allocated per call."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 8], "int32"))
    s = relax.Var("s", relax.TensorType([8], "int32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, s]):
        with bb.dataflow():
            a = bb.emit(relax.op.add(x, x))
            b = bb.emit(relax.op.add(s, s))
            out = bb.emit_output(relax.op.sum(relax.op.multiply(a, b), axis=[0, 1]))
        bb.emit_func_output(out)
    lowered = relax.get_pipeline("default")(bb.get())
    prim = next(gv for gv, f in lowered.functions.items() if isinstance(f, tvm.tirx.PrimFunc))
    lowered[prim] = lowered[prim].with_attr(BACKEND_ATTR, "some_device")

    def sizes(func):
        """The size of each storage ``func`` allocates: its bytes, or None for one the VM computes."""
        return [[int(d) for d in b.value.args[0].values] if isinstance(b.value.args[0], relax.ShapeExpr) else None
                for block in func.body.blocks for b in block.bindings
                if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.vm.alloc_storage"]

    assert sizes(lowered["main"]) == [None, [32], None, [4]]
    lifted = lift_storages()(lowered)
    assert sizes(lifted["main_storages"]) == [[32]]
    assert sizes(lifted["main"]) == [None, None, [4]] and len(lifted["main"].params) == 3
    lowered[prim] = lowered[prim].without_attr(BACKEND_ATTR)        # nothing offloaded: nothing lifted
    assert lift_storages()(lowered).same_as(lowered)


def test_a_call_copies_its_input_into_the_tensor_of_an_earlier_one(model, references):
    """A numpy input goes into this thread's tensor for it, made by the first call: later
    calls allocate none (an allocation of the input's size each), and compute on their own
    input, whatever the earlier ones were."""
    seeds = (1, 2, 1)
    wants = [references["model"](MODEL.inputs(seed))[0] for seed in seeds]
    model(MODEL.inputs(0))
    with mock.patch.object(tvm.runtime, "empty", side_effect=tvm.runtime.empty) as empty, \
            mock.patch.object(tvm.runtime, "tensor", side_effect=tvm.runtime.tensor) as tensor:
        got = [model(MODEL.inputs(seed)) for seed in seeds]
    assert empty.call_count == tensor.call_count == 0
    for g, want in zip(got, wants):
        np.testing.assert_array_equal(g, want)
