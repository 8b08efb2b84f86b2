"""A partition's own scratch buffers (layout copies, padded and im2col inputs) are outputs of
its call, which Relax plans and the model allocates once per VM (tirpat.model.scratch): from
the second call on, accel replays every stream on the hosts it was bound to."""

import warnings
from unittest import mock

import numpy as np
import pytest
import tvm
import tvm_ffi
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from tvm import relax, s_tir, tirx
from tvm.script import tirx as T

import tirpat as tp
from tirpat.device import invoke
from tirpat.device.buffers import host_span
from tirpat.device.session import Session
from tirpat.model.partition import BACKEND_ATTR
from tirpat.model.prepack import PREPROC
from tirpat.model.scratch import scratch_params
from tirpat.testing.differential import llvm_reference
from tirpat.testing.int8_models import int8_models
from models import in_threads


def _requantise(bb, y, shift: int = 9):
    return bb.emit(relax.op.astype(relax.op.clip(relax.op.right_shift(y, relax.const(shift, "int32")), -128, 127),
                                   "int8"))


def _conv_then_depthwise(channels: int = 8, out: int = 16, size: int = 8) -> tvm.IRModule:
    """``main(x)``: an NCHW 3x3 convolution and a depthwise one, each requantised to int8
    (accel lays the input out channels last, pads it and gathers its im2col tiles in buffers
    of its own), then a widening add on the host."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "int8"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w1 = relax.const(rng.integers(-128, 128, (out, channels, 3, 3), dtype=np.int8))
            a = _requantise(bb, bb.emit(relax.op.nn.conv2d(x, w1, padding=1, out_dtype="int32")))
            w2 = relax.const(rng.integers(-128, 128, (out, 1, 3, 3), dtype=np.int8))
            b = _requantise(bb, bb.emit(relax.op.nn.conv2d(a, w2, padding=1, groups=out, out_dtype="int32")), 8)
            y = bb.emit_output(relax.op.add(relax.op.astype(b, "int32"), relax.const(1, "int32")))
        bb.emit_func_output(y)
    return bb.get()


MODEL = _conv_then_depthwise()
SHAPE = (1, 8, 8, 8)


@pytest.fixture(scope="module")
def model():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tp.OffloadWarning)
        return tp.build(MODEL, "accel, llvm")


@pytest.fixture(scope="module")
def reference():
    return llvm_reference(MODEL)


def _input(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-128, 128, SHAPE, dtype=np.int8)


def _scratch_outputs(mod: tvm.IRModule) -> int:
    """How many scratch outputs the partitions' calls in ``mod``'s ``main`` allocate: each
    call's tuple fields after the first (each partition of the models here returns one tensor)."""
    lowered = tp.lower_partitions()(tp.partition(mod, "accel, llvm"))
    return sum(len(b.value.ty_args[0].fields) - 1 for block in lowered["main"].body.blocks for b in block.bindings
               if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.call_tir"
               and isinstance(b.value.ty_args[0], relax.TupleType))


def test_the_partitions_allocate_no_host_buffer_of_their_own():
    """Every host buffer the scheduled partitions allocated is a parameter, which their calls
    allocate as outputs after the real ones: none is left at the root of a PrimFunc."""
    lowered = tp.lower_partitions()(tp.partition(MODEL, "accel, llvm"))
    tagged = [f for f in lowered.functions.values()
              if isinstance(f, tirx.PrimFunc) and f.attrs is not None and BACKEND_ATTR in f.attrs]
    assert len(tagged) == 2
    for func in tagged:
        root = func.body.block
        assert [b.name for b in root.alloc_buffers if b.scope() in ("", "global")] == []
    assert _scratch_outputs(MODEL) >= 4         # each partition's layout copies, padding, gathered tiles


def test_after_the_second_call_every_stream_replays_on_the_hosts_it_had(model, reference):
    """No call after the first binds a stream's plan again (the first readied them all on
    these hosts), every replay meets the host buffers (addresses and sizes) it met on the
    second call, and the outputs are llvm's."""
    from accel.hw import fused

    x = tvm.runtime.tensor(_input(0))
    model(x)
    hosts: dict = {}        # (call, stream key) -> host spans
    call = [0]
    replay = Session.replay

    def watched(self, key, views):
        hosts.setdefault((call[0], key), []).append(tuple(host_span(v) for v in views))
        return replay(self, key, views)

    bound = []
    with mock.patch.object(fused.FusedPlan, "_calls", autospec=True, side_effect=fused.FusedPlan._calls) as calls, \
            mock.patch.object(Session, "replay", watched):
        for n in range(2, 7):
            call[0] = n
            out = model(x)
            bound.append(calls.call_count)
            np.testing.assert_array_equal(out, reference(x.numpy())[0])
    assert bound == [0] * 5                     # the first call readied every plan on these hosts
    keys = {key for n, key in hosts if n == 2}
    assert keys and all({key for m, key in hosts if m == n} == keys for n in range(3, 7))
    assert all(hosts[(n, key)] == hosts[(2, key)] for n in range(3, 7) for key in keys)


@settings(max_examples=6, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=3))
def test_calls_on_drawn_inputs_compute_what_llvm_does(model, reference, seeds):
    """Repeated calls on drawn inputs, each through scratch buffers the one before wrote:
    llvm's outputs, and earlier results left alone."""
    kept = []
    for seed in seeds:
        x = _input(seed)
        out = model(x)
        np.testing.assert_array_equal(out, reference(x)[0])
        kept.append((out, x))
    for out, x in kept:
        np.testing.assert_array_equal(out, reference(x)[0])


@settings(max_examples=4, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow])
@given(int8_models(overflow=False, max_layers=3), st.integers(0, 2**32 - 1))
def test_drawn_int8_models_compute_what_llvm_does_on_every_call(int8_model, seed):
    """Drawn int8 models (convolutions, pooling, matmuls, residual adds), built and called
    three times: llvm's outputs each time."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = tp.build(int8_model.mod, "accel, llvm")
    want = llvm_reference(int8_model.mod)
    for k in range(3):
        x = int8_model.inputs(seed + k)
        got = built(x)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want(x), strict=True):
            np.testing.assert_array_equal(g, w)


def test_two_threads_never_share_a_scratch_buffer(model, reference):
    """Two threads call the model together, each on its own VM: the tensors either VM
    makes (scratch buffers and intermediates, not the results: once per VM, the tensors
    its entry takes, or in a call) are at addresses the other's never uses, and every
    result is llvm's."""
    scratch = _scratch_outputs(MODEL)
    made = {0: set(), 1: set()}
    inputs = [_input(10 + k) for k in range(2)]
    wants = [reference(x)[0] for x in inputs]       # before: the reference's VM is not the threads' to share

    def worker(k):
        vm, storages = model._vm()
        made[k].update(t.data_ptr() for t in storages if isinstance(t, tvm.runtime.Tensor))
        seen: list = []

        def instrument(func, symbol, before, result, *args):
            if not before and symbol == "vm.builtin.alloc_tensor":
                seen.append(result.data_ptr())

        vm.set_instrument(instrument)
        x, want = inputs[k], wants[k]
        for _ in range(8):
            seen.clear()
            out = invoke(vm[model.entry], tvm.runtime.tensor(x), *storages)
            np.testing.assert_array_equal(out.numpy(), want)
            made[k].update(p for p in seen if p != out.data_ptr())
        vm.set_instrument(None)

    in_threads(worker, 2)
    assert min(len(made[0]), len(made[1])) >= scratch
    assert not made[0] & made[1]


# --------------------------------------------------------------------------- scratch_params
@T.prim_func(s_tir=True)
def _mixed(a: T.Buffer((16,), "int8"), w: T.Buffer((16,), "int8"), b: T.Buffer((16,), "int8")):
    kept_device = T.alloc_buffer((16,), "int8", scope="local.accel_inp")
    staged = T.alloc_buffer((16,), "int8")
    copy = T.alloc_buffer((16,), "int8")
    dead = T.alloc_buffer((16,), "int8")
    for i in range(16):
        with T.sblock("stage"):
            vi = T.axis.remap("S", [i])
            T.sblock_attr({PREPROC: 1})
            staged[vi] = w[vi]
    for i in range(16):
        with T.sblock("copy"):
            vi = T.axis.remap("S", [i])
            copy[vi] = a[vi] + staged[vi]
            dead[vi] = a[vi]
    for i in range(16):
        with T.sblock("inp"):
            vi = T.axis.remap("S", [i])
            kept_device[vi] = copy[vi]
    for o in range(2):
        with T.sblock("tile"):
            vo = T.axis.remap("S", [o])
            T.reads(kept_device[vo * 8:vo * 8 + 8])
            T.writes(b[vo * 8:vo * 8 + 8])
            inner = T.alloc_buffer((8,), "int8")
            for i in range(8):
                with T.sblock("fill"):
                    vi = T.axis.remap("S", [i])
                    inner[vi] = kept_device[vo * 8 + vi]
            for i in range(8):
                with T.sblock("out"):
                    vi = T.axis.remap("S", [i])
                    b[vo * 8 + vi] = inner[vi]


def test_only_the_roots_host_buffers_of_constant_size_become_parameters():
    """A device memory's buffer, a weight layout stage's output (prepack makes it a
    parameter itself), a buffer nothing reads (dead stores) and a buffer allocated inside a
    loop's block stay allocations."""
    widened = scratch_params(_mixed)
    assert [p.name for p in widened.params] == ["a", "w", "b", "copy"]
    allocated = []
    tvm_ffi.structural_walk(widened.body, [(tirx.AllocBuffer, lambda s: allocated.append(s.buffer.name)),
                                           (s_tir.SBlock, lambda blk: allocated.extend(x.name for x in blk.alloc_buffers))])
    assert sorted(allocated) == ["dead", "inner", "kept_device", "staged"]


def test_a_function_with_a_scalar_parameter_or_symbolic_buffers_is_left_as_it_is():
    n = tirx.Var("n", "int32")

    @T.prim_func(s_tir=True)
    def scaled(a: T.Buffer((4,), "int32"), b: T.Buffer((4,), "int32"), k: T.int32):
        t = T.alloc_buffer((4,), "int32")
        for i in range(4):
            with T.sblock("t"):
                vi = T.axis.remap("S", [i])
                t[vi] = a[vi] * k
        for i in range(4):
            with T.sblock("b"):
                vi = T.axis.remap("S", [i])
                b[vi] = t[vi]

    assert scratch_params(scaled).same_as(scaled)
    sym = tvm.te.placeholder((n,), "int32", name="a")
    mid = tvm.te.compute((n,), lambda i: sym[i] + 1, name="mid")
    func = tvm.te.create_prim_func([sym, tvm.te.compute((n,), lambda i: mid[i] * 2, name="b")])
    assert all(tirx.is_buffer_var(p) for p in func.params)
    assert [p.name for p in scratch_params(func).params] == [p.name for p in func.params]
