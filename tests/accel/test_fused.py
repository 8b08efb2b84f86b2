"""The batched (fused) execution of a stream does exactly what executing it instruction by
instruction does: host buffers and all three scratchpads, on random streams."""

import functools
import importlib.util
import pathlib
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from accel.hw import fused, kernels
from accel.hw.emitter import Emitter
from accel.hw.instructions import DWMAC, chain_code
from accel.hw.isa import Alu, AluChain, AluOp, Dwmac, Finish, Gemm, Load, Lut, Mem, Store, StoreMode
from accel.hw.sim import Simulator
from accel.hw.tokens import DependencyTracker

_here = pathlib.Path(__file__).parent


def _load(name):
    spec = importlib.util.spec_from_file_location(f"accel_{name}_strategies", _here / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sim_tests, deps_tests = _load("test_sim"), _load("test_deps")


def _auto(program):
    em, deps = Emitter(), DependencyTracker(16)
    for ins in program:
        deps.record(ins, em.emit(deps.order(em, ins)))
    return em.finish()


def _both(stream):
    """(fused plan or None, the fused simulator and host, the reference simulator and host)."""
    sim, ref = Simulator(sim_tests.SMALL), Simulator(sim_tests.SMALL)
    host, want = sim_tests._host(), sim_tests._host()
    for s in (sim, ref):   # scratchpads hold data from before the stream
        s.acc[:] = np.arange(s.acc.size) * 7919
        s.inp[:] = np.arange(s.inp.size) % 255 - 127
    plan = fused.fuse(sim, stream, sim.compile(stream, host).timing.order(), host)
    return plan, (sim, host), (ref, want)


def _runs_alike(plan, stream, fused_side, reference_side) -> None:
    """The plan's run leaves the host buffers and every scratchpad as running ``stream``
    instruction by instruction leaves them."""
    (sim, host), (ref, want) = fused_side, reference_side
    assert plan.run(host, sim)
    ref.run(stream, want)
    sim_tests._assert_same_state(sim, ref, host, want)


@given(st.one_of(sim_tests.programs().map(sim_tests._fenced), deps_tests.interleaved().map(_auto)))
def test_fused_execution_equals_instruction_by_instruction(stream):
    plan, (sim, host), (ref, want) = _both(stream)
    if plan is None:
        return
    _runs_alike(plan, stream, (sim, host), (ref, want))


_STREAMS = st.one_of(sim_tests.programs().map(sim_tests._fenced), deps_tests.interleaved().map(_auto))


@given(_STREAMS, _STREAMS)
def test_plans_sharing_a_simulators_workspace_run_in_turn_like_their_streams(first, second):
    # the plans of one simulator run in the same arrays (its workspace): nothing one run
    # leaves there may reach another plan's run, nor the same plan's next run
    sim, ref = Simulator(sim_tests.SMALL), Simulator(sim_tests.SMALL)
    host, want = sim_tests._host(), sim_tests._host()
    for s in (sim, ref):
        s.acc[:] = np.arange(s.acc.size) * 7919
        s.inp[:] = np.arange(s.inp.size) % 255 - 127
    plans = [fused.fuse(sim, stream, sim.compile(stream, host).timing.order(), host) for stream in (first, second)]
    for k in (0, 1, 0, 1):
        ran = plans[k] is not None and plans[k].run(host, sim)
        if not ran:
            sim.run((first, second)[k], host)
        ref.run((first, second)[k], want)
        sim_tests._assert_same_state(sim, ref, host, want)


def _gemm(**fields):
    return Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16, **fields)


def test_streams_the_fused_plan_does_not_cover_run_one_by_one():
    store = Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=1, cols=16, push_prev=True)
    read_back = Load(mem=Mem.ACC, sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=1,
                     cols=16, pop_next=True)
    assert _both([store, read_back, Finish()])[0] is None          # reads what it stored
    shift = Alu(op=AluOp.SHR, dst_addr=0, use_imm=True, imm=1)
    assert _both([_gemm(), shift, _gemm(), Finish()])[0] is None  # adds to what an ALU made
    plan, (sim, host), (ref, want) = _both([_gemm(reset=True), _gemm(), shift, Finish()])
    assert plan is not None and plan.matmuls == 1


def test_a_plan_takes_a_tuple_of_buffers_it_fits_again_and_checks_every_other():
    """A plan reads every buffer before it writes any, so it refuses buffers where one read
    shares memory with one written (or of other sizes); a tuple it found fitting (a session's
    replay gives the same views call after call) is not checked again, any other one is."""
    load = Load(mem=Mem.ACC, sram_addr=0, sram_ld=16, slot=2, dram_offset=0, dram_ld=16, rows=2, cols=16,
                push_next=True)
    store = Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=16, dram_ld=16, rows=2, cols=16, pop_prev=True)
    stream = [load, store, Finish()]
    plan, (sim, host), (ref, want) = _both(stream)
    views = tuple(host)
    with mock.patch.object(np, "may_share_memory", wraps=np.may_share_memory) as shares:
        _runs_alike(plan, stream, (sim, views), (ref, want))
        assert plan.run(views, sim) and shares.call_count == 1
        aliased = list(host)
        aliased[4] = np.zeros(1024, np.int32)
        aliased[2] = aliased[4][:512]      # what it reads is what it writes, 16 values on
        assert not plan.run(tuple(aliased), sim) and shares.call_count == 2
        assert not plan.run(tuple(host[:4]) + (np.zeros(2048, np.int32),), sim)
        assert plan.run(views, sim) and shares.call_count == 2     # refused ones do not replace it


def test_a_plan_s_copies_call_numpy_s_copy_itself_not_its_dispatcher():
    """A run's copies are bound to numpy's C function itself: its ``__array_function__``
    dispatcher would cost ~0.2 us more at each of a model call's ~170 copies."""
    stream = _product_stream()
    plan, (sim, host), (ref, want) = _both(stream)
    views = tuple(host)
    funcs = [call.func for call in plan.prepare(views, sim) if isinstance(call, functools.partial)]
    assert any(f is np.copyto._implementation for f in funcs) and not any(f is np.copyto for f in funcs)
    _runs_alike(plan, stream, (sim, views), (ref, want))


def _product_stream():
    """INP and WGT tiles from host slots 0 and 1, their product, stored saturated into slot 3
    and as int32 into slot 4: what a stream's host memory makes a run write."""
    return _auto([Load(mem=Mem.INP, sram_addr=0, sram_ld=16, slot=0, dram_offset=32, dram_ld=16, rows=16, cols=16),
                  Load(mem=Mem.WGT, sram_addr=0, sram_ld=16, slot=1, dram_offset=0, dram_ld=16, rows=16, cols=16),
                  _gemm(reset=True), _gemm(),
                  Store(sram_addr=0, sram_ld=16, slot=3, dram_offset=0, dram_ld=16, rows=16, cols=16,
                        mode=StoreMode.SATURATE),
                  Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16, cols=16)])


def _other_host(seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(-128, 128, h.size).astype(h.dtype) for h in sim_tests._host())


def test_a_plan_runs_each_tuple_of_buffers_on_its_own_memory():
    """The calls a plan makes for a tuple of buffers (views over it, made at its first run)
    serve that tuple only: another tuple of the same sizes runs on its own memory, the first
    one again reads its contents as they are now, a list (which may hold other buffers at the
    next run) is never taken again, and a tuple whose read buffer shares memory with a written
    one is refused."""
    stream = _product_stream()
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None
    first, second = _other_host(1), _other_host(2)
    listed = list(_other_host(5))
    for views in (first, second, first, listed, listed):
        expect = [v.copy() for v in views]
        assert plan.run(views, sim)
        ref.run(stream, expect)
        sim_tests._assert_same_state(sim, ref, views, expect)
        first[0][:] = np.random.default_rng(3).integers(-128, 128, first[0].size)    # new contents, same memory
        listed[3] = np.zeros_like(listed[3])    # another buffer in the list's slot
    aliased = list(second)
    aliased[3] = aliased[0]       # the INP rows it reads are the int8 results it writes
    assert not plan.run(tuple(aliased), sim)


def test_a_plan_that_several_groups_share_keeps_the_calls_of_each_group_s_tuple():
    """Groups whose streams are the same share one Program and plan (one of the PaddleOCR
    classifier's runs at 9 places), each replaying its own tuple of views: run in turn, each
    tuple's calls are made once, not remade at every run of the others."""
    stream = _product_stream()
    plan, (sim, host), _ = _both(stream)
    places = [_other_host(seed) for seed in range(9)]
    with mock.patch.object(fused.FusedPlan, "_calls", autospec=True, side_effect=fused.FusedPlan._calls) as made:
        for _ in range(3):
            for views in places:
                assert plan.run(views, sim)
    assert made.call_count == len(places)


@pytest.mark.parametrize("role", ["values", "source", "packed"])
def test_a_plan_s_calls_follow_the_simulator_s_workspace_when_it_is_replaced(role):
    """A plan works in its simulator's workspace (the value and source vectors, the products'
    int16 scratch), whose arrays another plan may replace by larger ones: its calls made for a
    tuple are remade then, over the new arrays (none keeps an old array alive, a product's kernel
    none of its tensors), and still compute what the stream does."""
    import gc
    import weakref

    stream = _product_stream()
    plan, (sim, host), (ref, want) = _both(stream)
    views, expect = _other_host(4), list(_other_host(4))
    for replace in (False, True):
        if replace:
            array = sim.workspace[role]
            old = weakref.ref(array)
            sim.workspace[role] = np.full(array.size * 2, -1, array.dtype)     # as a larger plan does
            del array
        assert plan.run(views, sim)
        ref.run(stream, expect)
        sim_tests._assert_same_state(sim, ref, views, expect)
    gc.collect()
    assert old() is None


def test_a_plan_binds_its_products_once_per_workspace_not_per_tuple_of_buffers():
    """A model's tensors move during its first calls: each new tuple of host buffers makes the
    plan's host copies again, never its products, which work in the workspace alone."""
    stream = _product_stream()
    plan, (sim, host), (ref, want) = _both(stream)
    with mock.patch.object(fused._Product, "call", autospec=True, side_effect=fused._Product.call) as bound:
        for seed in (4, 5, 6):
            views, expect = _other_host(seed), list(_other_host(seed))
            assert plan.run(views, sim)
            ref.run(stream, expect)
            sim_tests._assert_same_state(sim, ref, views, expect)
    assert bound.call_count == len(plan.products) == 1


def test_plans_built_before_the_workspace_grew_are_bound_to_it_when_the_call_ends():
    """A first call builds its plans one by one and the workspace grows for the larger ones:
    at the call's end (``settle``, from ``Session.running``) the earlier plans bind to the
    final arrays, their calls for the tuples of buffers they ran on (or were prepared for)
    made again there, so the next call binds none of a hundred plans; they still compute
    what the stream does."""
    stream = _product_stream()
    plan, (sim, host), (ref, want) = _both(stream)
    views, expect = _other_host(4), list(_other_host(4))
    assert plan.run(views, sim)
    import gc
    import weakref

    old = []
    for role in ("values", "source", "packed"):        # as a larger plan does
        old.append(weakref.ref(sim.workspace[role]))
        sim.workspace[role] = np.full(sim.workspace[role].size * 2, -1, sim.workspace[role].dtype)
    fused.settle(sim)
    with mock.patch.object(fused, "_alu_steps", side_effect=fused._alu_steps) as rebound, \
            mock.patch.object(fused.FusedPlan, "_calls", autospec=True, side_effect=fused.FusedPlan._calls) as made:
        assert plan.run(views, sim)
    assert rebound.call_count == 0 and made.call_count == 0
    gc.collect()
    assert all(ref() is None for ref in old)     # no call made for ``views`` before still works in them
    with mock.patch.object(fused.FusedPlan, "_bind") as looked:     # a later call's end: nothing replaced
        fused.settle(sim)
    assert looked.call_count == 0
    ref.run(stream, expect)
    ref.run(stream, expect)
    sim_tests._assert_same_state(sim, ref, views, expect)
    from accel.hw.runtime import Session
    session = Session()
    with mock.patch.object(fused, "settle") as settled:
        with session.running():
            pass
    settled.assert_called_once_with(session.simulator)


def test_a_blocked_product_is_one_matrix_multiplication():
    """Four accumulator tiles, each the sum of two products, meet as one 32x32x32 product."""
    stream = [Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=32, inp_ld=16, wgt_ld=16, reset=True,
                   ext_out=2, ext_in=2, acc_stride_out=16 * 32, acc_stride_in=16)]
    for m in range(2):
        stream.append(Gemm(acc_addr=m * 16 * 32, inp_addr=m * 16 * 32, wgt_addr=0, acc_ld=32, inp_ld=32,
                           wgt_ld=32, ext_out=2, ext_in=2, acc_stride_out=16, wgt_stride_out=16 * 32,
                           inp_stride_in=16, wgt_stride_in=16))
    plan, (sim, host), (ref, want) = _both(stream + [Finish()])
    assert plan.matmuls == 1 and isinstance(plan.products[0].grid, fused._Span)   # adds into a view
    assert plan.products[0].assign and plan.zero == []      # the reset tiles: written, never zeroed
    assert plan.run(host, sim)
    ref.run(stream + [Finish()], want)
    np.testing.assert_array_equal(sim.acc, ref.acc)



_INT32 = st.integers(-2**31, 2**31 - 1)
_NUMPY = {AluOp.ADD: np.add, AluOp.MUL: np.multiply, AluOp.MAX: np.maximum, AluOp.MIN: np.minimum,
          AluOp.SHR: lambda a, s: a >> np.clip(s, 0, 31)}


@given(st.lists(st.tuples(st.sampled_from(list(AluOp)), st.one_of(st.none(), _INT32)), min_size=1, max_size=6),
       st.sampled_from([1, 7919, 2**16 + 1, 2**31 - 1]))
def test_fused_epilogues_wrap_int32_like_the_reference(steps, scale):
    """A GEMM into accumulators that held values before, times ``scale``, then an epilogue of
    ALU steps with any int32 immediate or a bias row (None) as operand, so sums and products
    wrap and shifts go past [0, 31]: the fused plan, the reference simulator and int64
    numpy reduced modulo 2**32 after every step give the same accumulators and stores."""
    steps = [(AluOp.MUL, scale)] + steps
    tile = dict(dst_addr=0, ext_out=16, dst_stride_out=16, src_addr=1024)     # src: one row, broadcast
    stream = [_gemm()] + [Alu(op=op, use_imm=imm is not None, imm=imm or 0, push_next=n == len(steps) - 1, **tile)
                          for n, (op, imm) in enumerate(steps)]
    stream += [Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16, cols=16, pop_prev=True),
               Finish()]
    plan, (sim, host), (ref, want) = _both(stream)
    for s in (sim, ref):
        s.memory(Mem.WGT)[:256] = np.arange(256) % 251 - 125
        s.acc[1024:1040] = np.linspace(-2**31, 2**31 - 1, 16).astype(np.int64).astype(np.int32)
    start = sim.acc.astype(np.int64)
    x, w = (sim.memory(m)[:256].astype(np.int64).reshape(16, 16) for m in (Mem.INP, Mem.WGT))
    assert plan is not None and plan.run(host, sim)
    # each ALU step writes its results as one view (the values are numbered for it), and reads
    # the step before's the same way
    assert all(isinstance(new, fused._Span) and isinstance(old, fused._Span) for _, new, old, _ in plan.alus)
    ref.run(stream, want)
    np.testing.assert_array_equal(sim.acc, ref.acc)
    np.testing.assert_array_equal(host[4], want[4])
    acc = sim_tests.wrap32(start[:256].reshape(16, 16) + x @ w.T)
    for op, imm in steps:
        acc = sim_tests.wrap32(_NUMPY[op](acc, start[1024:1040] if imm is None else np.int64(imm)))
    np.testing.assert_array_equal(ref.acc[:256].reshape(16, 16), acc)
    np.testing.assert_array_equal(host[4][:256].reshape(16, 16), acc)


@given(st.lists(st.tuples(st.sampled_from([AluOp.MAX, AluOp.MIN]), _INT32 | st.integers(-200, 200)), min_size=1,
                max_size=5))
def test_a_chain_of_clamps_is_one_compiled_pass_like_the_reference(clamps):
    """MAX and MIN by immediates in turn, in place (a requantisation's clamp), bounds in any
    order (a MIN below the MAX before it), after a multiply that wraps: one compiled pass over
    the values (the chain kernel), the reference's result."""
    steps = [(AluOp.MUL, 7919), *clamps]
    tile = dict(dst_addr=0, ext_out=16, dst_stride_out=16)
    stream = [_gemm()] + [Alu(op=op, use_imm=True, imm=imm, push_next=n == len(steps) - 1, **tile)
                          for n, (op, imm) in enumerate(steps)]
    stream += [Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16, cols=16, pop_prev=True),
               Finish()]
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None and plan.run(host, sim)
    assert len(plan._alu_steps) == 1        # the multiply and the clamps: one chain
    ref.run(stream, want)
    np.testing.assert_array_equal(sim.acc, ref.acc)
    np.testing.assert_array_equal(host[4], want[4])


@given(st.integers(1, 15), st.integers(1, 16), st.booleans(), st.integers(-2**31, 2**31 - 1), st.booleans())
def test_lanes_no_store_reads_read_any_value_unless_acc_ends_with_them(channels, rows, overwritten, scale, chained):
    """A layer of fewer than 16 channels: its epilogue adds a bias row loaded into ``channels``
    lanes of ACC (the other lanes hold what ACC held before the stream) and the STORE writes
    ``channels`` columns of ``rows`` rows. Where ACC is reset afterwards (the next tile), the
    other lanes' and rows' results reach nothing: the bias is read as a broadcast view of
    whole rows, and the chain (ALU instructions, or one ALU chain instruction) still works in
    place on runs. Where ACC ends with them, they must be exact. Host memory and every
    scratchpad as the reference."""
    tile = dict(dst_addr=0, ext_out=16, dst_stride_out=16)
    pad = dict(pad_right=16 - channels, pad_value=0, sram_ld=16, sram_addr=0, dram_offset=0, dram_ld=channels,
               cols=channels)
    steps = [(AluOp.ADD, None), (AluOp.MUL, scale), (AluOp.SHR, 9), (AluOp.MAX, -128), (AluOp.MIN, 127)]
    epilogue = [AluChain(src_addr=512, src_stride_out=0, **tile, **chain_code(steps))] if chained else \
        [Alu(op=op, use_imm=True, imm=imm, **tile) if imm is not None else
         Alu(op=op, use_imm=False, src_addr=512, **tile) for op, imm in steps]
    program = [Load(mem=Mem.INP, slot=0, rows=16, **pad), Load(mem=Mem.WGT, slot=1, rows=16, **pad),
               _gemm(reset=True), _gemm(),
               Load(mem=Mem.ACC, sram_addr=512, sram_ld=16, slot=2, dram_offset=0, dram_ld=0, rows=1, cols=channels),
               *epilogue, Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=rows, cols=channels)]
    if overwritten:
        program.append(_gemm(reset=True))
    stream = _auto(program)
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None
    bias = plan.alus[0][3]
    if overwritten and scale:
        # (a product by the immediate 0 reads nothing before it: the plan may then read the
        # bias any way, and does, by a gather)
        assert isinstance(bias, fused._View) and bias.strides == (0, 1)
    assert all(isinstance(old, fused._Span) for _, _, old, _ in plan.alus)     # no gathers
    _runs_alike(plan, stream, (sim, host), (ref, want))


@given(st.integers(0, 7), st.integers(1, 4), st.booleans())
def test_products_added_into_accumulators_from_before_the_stream_stay_there(acc_tile, k_tiles, stored):
    """A GEMM without a reset adds into what ACC held before the stream (nothing gives the
    tile a new value): the plan writes back only the ACC elements that changed, and those
    include it, so the scratchpad ends as instruction-by-instruction execution leaves it."""
    stream = [Gemm(acc_addr=acc_tile * 256, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16,
                   ext_out=k_tiles, inp_stride_out=256, wgt_stride_out=256, push_next=stored)]
    if stored:
        stream.append(Store(sram_addr=acc_tile * 256, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16,
                            cols=16, pop_prev=True))
    plan, (sim, host), (ref, want) = _both(stream + [Finish()])
    assert plan is not None and plan.run(host, sim)
    ref.run(stream + [Finish()], want)
    assert plan.acc_final[0].size == 256            # the one tile, not all of ACC
    sim_tests._assert_same_state(sim, ref, host, want)


@st.composite
def dwmacs(draw):
    """A DWMAC that fits the small scratchpads; one time in two its steps all add into one
    tile (a depthwise kernel's taps, acc strides 0), else anywhere, overlapping or not."""
    ext = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    fields = {"ext_out": ext[0], "ext_in": ext[1]}
    taps = draw(st.booleans())
    for p, mem, ld in (("acc", Mem.ACC, draw(st.sampled_from([16, 32]))), ("inp", Mem.INP, draw(st.sampled_from([16, 32]))),
                       ("wgt", Mem.WGT, 0)):
        strides = [0, 0] if p == "acc" and taps else [draw(sim_tests.aligned(3)), draw(sim_tests.aligned(3))]
        addr = sim_tests._fit(draw, sim_tests.SIZES[mem], ext, strides, ld)
        if addr is None:
            strides, addr = [0, 0], 0
        fields.update({f"{p}_addr": addr, f"{p}_stride_out": strides[0], f"{p}_stride_in": strides[1]})
        if ld:
            fields[f"{p}_ld"] = ld
    return Dwmac(**fields)


@st.composite
def depthwise_programs(draw):
    """Rounds of loads (padded), then GEMM resets, DWMACs, ALU steps and ACC loads, then stores."""
    rounds = []
    for _ in range(draw(st.integers(1, 3))):
        loads = draw(st.lists(st.sampled_from([Mem.INP, Mem.WGT]).flatmap(sim_tests.dma), max_size=3))
        compute = draw(st.lists(st.one_of(dwmacs(), dwmacs(), sim_tests.gemms(), sim_tests.alus(),
                                          sim_tests.dma(Mem.ACC)), min_size=1, max_size=6))
        stores = draw(st.lists(sim_tests.dma("store"), max_size=2))
        rounds.append((loads, compute, stores))
    return sim_tests._fenced(rounds)


@given(depthwise_programs(), st.sampled_from([0, 2**31 - 1, -2**31]))
def test_fused_dwmacs_equal_instruction_by_instruction(stream, edge):
    """DWMACs (the taps of one tile summed at once, or spread over tiles), with GEMMs, ALU
    steps and stores around them, on accumulators that start near the int32 limits so the
    sums wrap: the fused plan leaves host buffers and scratchpads bit for bit as the
    instruction-by-instruction simulator does."""
    plan, (sim, host), (ref, want) = _both(stream)
    for s in (sim, ref):
        # within a few thousand of an int32 limit (both signs of products reach past it), or spread
        near = edge - np.sign(edge) * (np.arange(s.acc.size, dtype=np.int64) * 7 % 4096)
        s.acc[:] = near if edge else np.arange(s.acc.size) * 7919
        s.wgt[:] = (np.arange(s.wgt.size) * 37) % 256 - 128        # -128 too: the largest product
    if plan is None:
        return
    _runs_alike(plan, stream, (sim, host), (ref, want))


def test_a_depthwise_kernel_is_one_sum_over_its_taps():
    """Two tiles of a 3x3 depthwise kernel, each one DWMAC of 9 steps into one tile: one
    batched tap sum, into a view of the accumulator values, equal to the declared program."""
    stream = [Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16, reset=True, ext_out=2,
                   acc_stride_out=256)]
    stream += [Dwmac(acc_addr=256 * k, inp_addr=256 * k, wgt_addr=16 * k, acc_ld=16, inp_ld=16, ext_out=3, ext_in=3,
                     inp_stride_out=64, inp_stride_in=16, wgt_stride_out=48, wgt_stride_in=16) for k in range(2)]
    plan, (sim, host), (ref, want) = _both(stream + [Finish()])
    taps = [p for p in plan.products if isinstance(p, fused._TapSum)]
    assert len(taps) == 1 and taps[0].x.shape == (2, 9, 16, 16) and isinstance(taps[0].targets, fused._Span)
    for s in (sim, ref):
        s.wgt[:] = (np.arange(s.wgt.size) * 37) % 256 - 128
    inp, wgt = sim.inp.copy(), sim.wgt.copy()
    assert plan.run(host, sim)
    ref.run(stream + [Finish()], want)
    np.testing.assert_array_equal(sim.acc, ref.acc)
    for k, d in enumerate(stream[1:]):     # each tile as the declared program computes it from zero
        scalars = {f: getattr(d, f) for f in ("acc_ld", "inp_ld", "ext_out", "ext_in", "acc_stride_out",
                                              "acc_stride_in", "inp_stride_out", "inp_stride_in",
                                              "wgt_stride_out", "wgt_stride_in")}
        declared = DWMAC.reference(acc_addr=np.zeros(256, np.int32), inp_addr=inp[d.inp_addr:].astype(np.int8),
                                   wgt_addr=wgt[d.wgt_addr:].astype(np.int8), **scalars, tile=16)["acc_addr"]
        np.testing.assert_array_equal(sim.acc[d.acc_addr:d.acc_addr + 256], declared)


@given(st.integers(1, 15), st.integers(0, 4), st.booleans())
def test_inputs_that_only_meet_zero_padded_weights_are_read_as_runs(channels, gap, depthwise):
    """A layer of fewer than 16 channels: inputs and weights padded with zeros to 16 lanes.
    The input's rows are read from host memory as runs of 16 (their pad lanes read the host
    data after them, which only ever multiplies a weight's zero pad), no padded copies made
    (the weights' rows still are: one operand's zeros must be exact), and the results are
    the reference's."""
    ld = min(16, channels + gap)
    pad = dict(pad_right=16 - channels, pad_value=0, sram_ld=16, cols=channels, dram_ld=ld, sram_addr=0)
    program = [Load(mem=Mem.INP, slot=0, dram_offset=0, rows=64 if depthwise else 16, **pad),
               Load(mem=Mem.WGT, slot=1, dram_offset=3, rows=9 if depthwise else 16, **pad),
               _gemm(reset=True)]
    if depthwise:
        program.append(Dwmac(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, ext_out=3, ext_in=3,
                             inp_stride_out=64, inp_stride_in=16, wgt_stride_out=48, wgt_stride_in=16))
    else:
        program.append(_gemm())
    program.append(Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16, cols=16))
    stream = _auto(program)
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None and (plan.products[-1].x.starts < plan.f_base).all()     # no input row copied
    _runs_alike(plan, stream, (sim, host), (ref, want))


@given(st.lists(st.lists(st.integers(-3, 40), min_size=4, max_size=4), min_size=1, max_size=6),
       st.lists(st.sampled_from(["run", "pad", "as drawn"]), min_size=6, max_size=6))
def test_tap_input_rows_kept_as_starts_give_back_their_codes(rows, kinds):
    """A tap sum's input codes are kept as the first code of each row when every row is a run
    or one pad, and the codes come back whole from those starts; any other row keeps them all."""
    codes = np.array([[r[0] + k for k in range(4)] if kind == "run" and r[0] >= 0 else
                      [min(r[0], -1)] * 4 if kind == "pad" else r for r, kind in zip(rows, kinds)])
    first, whole = fused._rows_of(codes)
    assert whole == all((r == r[0] + np.arange(4)).all() if r[0] >= 0 else (r == r[0]).all() for r in codes)
    assert first.shape == (codes.shape[:-1] if whole else codes.shape)
    np.testing.assert_array_equal(fused._codes((first, whole), 4), codes)


def test_a_tap_sum_over_loaded_padded_and_untouched_rows_reads_them_as_rows():
    """Taps over a padded LOAD's rows (host data and pad rows) and INP rows no LOAD touched:
    the plan reads every row from its start (no index array of the codes) and equals the
    instruction-by-instruction simulator; a tap over rows split between two LOADs reads them
    from copies made at each run, as before."""
    # a whole first tile of padding, host rows, a pad row, then rows no LOAD touched
    load = Load(mem=Mem.INP, sram_addr=0, sram_ld=16, slot=0, dram_offset=5, dram_ld=16, rows=8, cols=16,
                pad_top=18, pad_bottom=1, pad_value=-3)
    taps = Dwmac(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, ext_out=8, ext_in=2,
                 inp_stride_out=32, inp_stride_in=16, wgt_stride_out=32, wgt_stride_in=16)
    halves = [Load(mem=Mem.INP, sram_addr=512 + 8 * k, sram_ld=16, slot=1, dram_offset=100 * k, dram_ld=8, rows=16,
                   cols=8) for k in range(2)]
    split = Dwmac(acc_addr=256, inp_addr=512, wgt_addr=0, acc_ld=16, inp_ld=16, ext_out=2, inp_stride_out=256)
    reset = Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16, reset=True, ext_out=2,
                 acc_stride_out=256)
    for stream, rows in (([load, reset, taps, Finish()], True), ([load, *halves, reset, taps, split, Finish()], False)):
        plan, (sim, host), (ref, want) = _both(stream)
        tap_sums = [p for p in plan.products if isinstance(p, fused._TapSum)]
        assert tap_sums and all(t.x.by_rows for t in tap_sums)
        assert all(t.x.index is None and t.x.rows_at is None for t in tap_sums)
        assert (plan.f_extra is None) == rows       # a split row is copied whole at each run
        for s in (sim, ref):
            s.wgt[:] = (np.arange(s.wgt.size) * 37) % 256 - 128
        assert plan.run(host, sim)
        ref.run(stream, want)
        sim_tests._assert_same_state(sim, ref)


def test_more_taps_than_float32_sums_exactly_are_summed_in_float64_and_wrap():
    """A DWMAC of 33 x 34 steps into one tile (past the 1024 products float32 sums exactly):
    the tap sum is taken in float64 and added into accumulators near -2**31 modulo 2**32."""
    d = Dwmac(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, ext_out=33, ext_in=34)
    plan, (sim, host), (ref, want) = _both([d, Finish()])
    for s in (sim, ref):
        s.inp[:256] = np.where(np.arange(256) % 3, -127, -128)
        s.wgt[:16] = 127
        s.acc[:256] = -2**31 + np.arange(256)
    taps = [p for p in plan.products if isinstance(p, fused._TapSum)]
    assert len(taps) == 1 and taps[0].ftype is np.float64
    assert plan.run(host, sim)
    ref.run([d, Finish()], want)
    np.testing.assert_array_equal(sim.acc, ref.acc)
    exact = -2**31 + np.arange(256) + 33 * 34 * 127 * np.where(np.arange(256) % 3, -127, -128)
    np.testing.assert_array_equal(sim.acc[:256], sim_tests.wrap32(exact))


def test_products_of_more_terms_than_float32_sums_exactly_stay_exact_and_wrap():
    """A GEMM of 33 x 34 steps into one tile (1056 x 16 terms per value, past the 1024 products
    float32 sums exactly, -128 * 127 or -127 * 127 each): one product of the compiled int8 GEMM,
    added into accumulators near -2**31 modulo 2**32, as instruction by instruction."""
    g = Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16, ext_out=33, ext_in=34)
    plan, (sim, host), (ref, want) = _both([g, Finish()])
    for s in (sim, ref):
        s.inp[:256] = np.where(np.arange(256) % 3, -127, -128)
        s.wgt[:256] = 127
        s.acc[:256] = -2**31 + np.arange(256)
    assert plan.matmuls == 1 and plan.products[0].x.shape == (16, 33 * 34 * 16)
    assert plan.run(host, sim)
    ref.run([g, Finish()], want)
    np.testing.assert_array_equal(sim.acc, ref.acc)
    rows = np.where(np.arange(256) % 3, -127, -128).reshape(16, 16).astype(np.int64)
    exact = -2**31 + np.arange(256).reshape(16, 16) + 33 * 34 * rows.sum(1, keepdims=True) * 127
    np.testing.assert_array_equal(sim.acc[:256].reshape(16, 16), sim_tests.wrap32(exact))


@st.composite
def gathers(draw):
    """An index array into a vector of ``size`` elements: runs of consecutive elements (some a
    tile row, some crossing rows) and single elements, in a shape whose last axis may or may
    not be a multiple of the tile."""
    tile, size = draw(st.sampled_from([2, 4, 16])), draw(st.integers(1, 300))
    parts = draw(st.lists(st.one_of(st.tuples(st.just("run"), st.integers(0, size - 1), st.integers(1, 3 * tile)),
                                    st.tuples(st.just("one"), st.integers(0, size - 1), st.just(1))),
                          min_size=1, max_size=12))
    flat = np.concatenate([np.arange(a, min(a + n, size)) if kind == "run" else np.array([a]) for kind, a, n in parts])
    rows = draw(st.sampled_from([d for d in (1, 2, 3) if flat.size % d == 0]))
    return tile, size, flat.reshape(rows, -1)


@given(gathers(), st.integers(0, 3))
def test_gathers_read_what_take_reads(drawn, pads):
    """A gather reads its index array as np.take does: by whole tile rows where they are runs
    and element by element elsewhere, or (given the vector's sources) every chunk as a row,
    the chunks that are no run (pads among host elements, a short last chunk) from copies
    appended to the vector, as each run of a plan appends them."""
    tile, size, index = drawn
    data = (np.arange(size, dtype=np.float32) * 7919) % 251 - 125
    np.testing.assert_array_equal(fused._Gather(index, tile).read(fused._Vector(data, tile)), np.take(data, index))
    sources = fused._Sources(0, [data], tile)
    codes = sources.host(0) + index
    flat = codes.reshape(-1)
    flat[np.arange(0, flat.size, 5)[:pads]] = [sources.pad(-1 - k % 2) for k in range(min(pads, -(-flat.size // 5)))]
    value_of = {code: value for value, code in sources.pads.items()}
    want = np.array([data[c] if c >= 0 else value_of[c] for c in flat], np.float32).reshape(index.shape)
    g = sources.gather(codes)
    vector = np.concatenate([data, sources.pad_values(np.float32)])
    assert vector.size == sources.base
    if sources.extra:
        vector = np.concatenate([vector, vector[np.concatenate(sources.extra)]])
    assert g.index is None and g.rows_at is None        # every chunk a row of the vector
    np.testing.assert_array_equal(g.read(fused._Vector(vector, tile)), want)


@given(st.booleans(), st.sampled_from([0, 2**31 - 1, -2**31]))
def test_dwmacs_that_add_each_value_once_add_their_products_as_they_come(reset, edge):
    """A DWMAC over four tiles with one weight element (the element-wise core's widening by a
    ones weight): each accumulator value gets one product, which the plan adds (or, into
    tiles a reset zeroed, writes) as it comes, bit for bit as the simulator, near the int32
    limits so the sums wrap."""
    ones = Load(mem=Mem.WGT, sram_addr=0, sram_ld=16, slot=1, dram_offset=0, dram_ld=16, rows=0, cols=0,
                pad_top=1, pad_left=16, pad_value=-128)          # a row of one pad value: the largest products
    stream = [ones]
    if reset:
        stream.append(Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16, reset=True,
                           ext_out=4, acc_stride_out=256))
    stream = _auto(stream + [Dwmac(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, ext_out=4,
                                   acc_stride_out=256, inp_stride_out=256)])
    plan, (sim, host), (ref, want) = _both(stream)
    for s in (sim, ref):
        if edge:
            s.acc[:] = edge - np.sign(edge) * (np.arange(s.acc.size, dtype=np.int64) % 4096)
    (dw,) = plan.products
    assert isinstance(dw, fused._PerChannel) and dw.inverse is None and isinstance(dw.w, int)
    assert dw.assign == reset
    assert plan.run(host, sim)
    ref.run(stream, want)
    sim_tests._assert_same_state(sim, ref)


@given(depthwise_programs(), st.sampled_from([0, 2**31 - 1, -2**31]))
def test_tap_sums_read_a_tile_at_a_time_like_all_at_once(stream, edge):
    """With room for one tile's taps at a time, the tap sums gather and sum tile by tile and
    still leave everything as instruction-by-instruction execution does."""
    with mock.patch.object(fused, "_TAPS_AT_ONCE", 1):
        test_fused_dwmacs_equal_instruction_by_instruction.hypothesis.inner_test(stream, edge)


@st.composite
def affine_indices(draw):
    """A multi-index layout: shape, strides (zero and negative too) and a start that keeps
    every index in ``[0, 400)``, and the flat index array it makes."""
    dims = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=dims, max_size=dims)))
    strides = tuple(draw(st.lists(st.integers(-40, 40), min_size=dims, max_size=dims)))
    offsets = np.zeros(shape, np.int64)
    for axis, (extent, stride) in enumerate(zip(shape, strides)):
        offsets = offsets + (np.arange(extent) * stride).reshape([extent if k == axis else 1 for k in range(dims)])
    return shape, strides, (offsets - offsets.min() + draw(st.integers(0, 40))).reshape(-1)


@given(affine_indices(), st.integers(0, 3))
def test_affine_indices_are_read_and_written_as_views(drawn, shift):
    """An index array affine in a multi-index reads as a strided view what fancy indexing
    reads (one found for every layout whose axes do not interleave, each outer stride
    beyond the span of the inner ones), and two arrays share a shape when they are affine
    in a common one: a block order away from a run (the tiles of a product's rows)."""
    shape, strides, index = drawn
    values = np.arange(1000) * 7919 % 1009
    found = fused._views(index)
    span, nested = 1, True
    for extent, stride in sorted(((e, abs(s)) for e, s in zip(shape, strides) if e > 1), key=lambda es: es[1]):
        nested &= stride >= span
        span += (extent - 1) * stride
    if nested and len(shape) <= fused._VIEW_DIMS:
        assert found is not None
    if found is not None:
        np.testing.assert_array_equal(found[0].of(values).reshape(-1), values[index])
    run = shift + np.arange(index.size)
    pair = fused._views(run, index)
    if pair is not None:
        assert pair[0].shape == pair[1].shape and isinstance(pair[0], fused._Span)
        np.testing.assert_array_equal(pair[1].of(values), values[index].reshape(pair[1].shape))
        np.testing.assert_array_equal(pair[0].of(values), values[run].reshape(pair[0].shape))
    tiles = np.arange(4 * 16 * 16).reshape(2, 16, 2, 16).transpose(0, 2, 1, 3).reshape(-1)    # 2x2 tiles, tile order
    views = fused._views(np.arange(tiles.size), tiles)
    assert views is not None and isinstance(views[1], fused._View)


def test_alu_chains_work_in_place_and_equal_instruction_by_instruction():
    """A requantisation chain on reset accumulators (multiply, shift, add, clamps, then a
    STORE): each ALU step after the first writes over the values it reads (nothing else reads
    them), so a chain works on one stretch of memory; the results are the reference's."""
    tile = dict(dst_addr=0, ext_out=16, dst_stride_out=16)
    chain = [(AluOp.MUL, 1 << 20), (AluOp.SHR, 9), (AluOp.ADD, -3), (AluOp.MAX, -128), (AluOp.MIN, 127)]
    stream = [_gemm(reset=True), _gemm()] + [
        Alu(op=op, use_imm=True, imm=imm, push_next=n == len(chain) - 1, **tile) for n, (op, imm) in enumerate(chain)]
    stream += [Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16, cols=16, pop_prev=True),
               Finish()]
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None and len(plan.alus) == len(chain)
    assert all(new.start == old.start for _, new, old, _ in plan.alus)     # in place, all of them
    assert plan.run(host, sim) and plan.run(host, sim)      # twice: a run leaves nothing the next one reads
    ref.run(stream, want)
    np.testing.assert_array_equal(host[4], want[4])
    np.testing.assert_array_equal(sim.acc, ref.acc)


@pytest.mark.parametrize("reader", ["alu", "store"])
def test_an_alu_step_whose_operand_is_read_elsewhere_does_not_work_in_place(reader):
    """A chain's multiply reads accumulators another ALU adds from (as its source), or a
    STORE copies out, in between: the multiply must not write over them, and the results are
    the reference's; the shift after it, whose operand nothing else reads, still works in place."""
    a, b = dict(dst_addr=0, ext_out=16, dst_stride_out=16), dict(dst_addr=256, ext_out=16, dst_stride_out=16)
    other = (Alu(op=AluOp.ADD, src_addr=0, src_stride_out=16, **b) if reader == "alu" else
             Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16, cols=16))
    stream = _auto([_gemm(reset=True), _gemm(), other, Alu(op=AluOp.MUL, use_imm=True, imm=3, **a),
                    Alu(op=AluOp.SHR, use_imm=True, imm=1, **a),
                    Store(sram_addr=256, sram_ld=16, slot=4, dram_offset=256, dram_ld=16, rows=16, cols=16)])
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None
    by_op = {op: (new, old) for ((_, op, _),), new, old, _ in plan.alus}
    new, old = by_op[AluOp.MUL]
    assert not (isinstance(old, fused._Span) and new.start == old.start)        # not over what is read again
    new, old = by_op[AluOp.SHR]
    assert isinstance(old, fused._Span) and new.start == old.start               # in place
    assert plan.run(host, sim)
    ref.run(stream, want)
    np.testing.assert_array_equal(host[4], want[4])
    np.testing.assert_array_equal(sim.acc, ref.acc)


@given(st.integers(2, 3 * fused._PREFIX), st.integers(-3, 3), st.data())
def test_a_leading_run_is_found_past_the_prefix_too(n, step, data):
    """The leading run of constant steps is the first break's position wherever it is (in
    the prefix looked at first, beyond it, or none), for the arrays together."""
    flats = [np.arange(n) * step + 5, np.full(n, 2)]
    breaks = data.draw(st.lists(st.tuples(st.integers(0, 1), st.integers(1, n - 1)), max_size=3))
    for which, at in breaks:
        flats[which][at:] += 1
    broken = np.zeros(n - 1, bool)
    for f, s in zip(flats, (step, 0)):
        broken |= np.diff(f) != s
    expected = int(np.flatnonzero(broken)[0]) + 1 if broken.any() else n
    assert fused._leading_run(flats, [step, 0], n) == expected


@given(st.lists(st.lists(st.integers(0, 60), max_size=8), max_size=5), st.integers(0, 64))
def test_the_range_below_a_bound_is_that_of_all_arrays_together(arrays, bound):
    indices = [np.array(a, np.intp) for a in arrays]
    together = np.concatenate([np.zeros(0, np.intp), *indices])
    below = together[together < bound]
    assert fused._range_below(indices, bound) == ((int(below.min()), int(below.max()) + 1) if below.size else (0, 0))


def test_the_builder_holds_the_chains_it_worked_out_so_no_other_takes_their_ids():
    """The builder works out a chain's steps once per instruction object, by id, and holds
    the object: a chain the caller lets go cannot hand its id to another chain, whose steps
    would be mistaken for its."""
    from accel.hw.instructions import chain_code
    from accel.hw.isa import AluChain

    sim = Simulator(sim_tests.SMALL)
    builder = fused._Builder(sim, sim_tests._host())
    ids = set()
    for op, imm in [(AluOp.ADD, 3), (AluOp.MUL, 5), (AluOp.SHR, 2), (AluOp.MAX, -7)] * 8:
        chain = AluChain(dst_addr=0, ext_out=2, dst_stride_out=16, **chain_code([(op, imm)]))
        ids.add(id(chain))
        assert builder.add(chain) and builder.alus[-1][1] == ((op, imm),)
        del chain
    assert len(ids) == 32


@st.composite
def run_indices(draw):
    """An index array of runs of consecutive elements in any order, overlapping runs too (a
    later write wins), into a target of ``size`` elements."""
    size = draw(st.integers(1, 200))
    runs = draw(st.lists(st.tuples(st.integers(0, size - 1), st.integers(1, 60)), min_size=1, max_size=6))
    return size, np.concatenate([np.arange(a, min(a + n, size)) for a, n in runs])


@given(run_indices(), st.sampled_from([np.int32, np.int8]), st.booleans(), st.data())
def test_copies_by_runs_equal_a_scatter(drawn, dtype, saturate, data):
    """Index arrays of runs (overlapping too: a later write wins) read from runs, repeats or
    anywhere: copied run by run by the compiled pass, what a gather, a clip and a scatter write,
    int32 cast into an int8 host buffer as a scatter casts it."""
    size, index = drawn
    source = (np.arange(300, dtype=np.int64) * 7919 - 2**31).astype(np.int32)
    source[::7] %= 300      # (some in int8's range, some not)
    src = data.draw(st.one_of(st.just(np.arange(index.size)), st.just(np.zeros(index.size, np.int64) + 5),
                              st.lists(st.integers(0, 299), min_size=index.size, max_size=index.size).map(np.array)))
    want, got = np.zeros(size, dtype), np.zeros(size, dtype)
    values = np.clip(source[src], -128, 127) if saturate else source[src]
    want[index] = values.astype(dtype)
    fused._Copies(index, src, 16).bound(source, got, saturate)()
    np.testing.assert_array_equal(got, want)


@given(_STREAMS)
def test_streams_copied_with_another_host_step_alike(stream):
    """With each copy's host step taken from its first two elements (not the most common of
    its steps), the plan still leaves host buffers and scratchpads as instruction-by-
    instruction execution does."""
    with mock.patch.object(fused, "_STEP_SAMPLE", 1):
        test_fused_execution_equals_instruction_by_instruction.hypothesis.inner_test(stream)


@given(st.sampled_from([2, 4, 16]), st.integers(1, 5), st.integers(1, 3), st.integers(0, 40), st.integers(0, 20),
       st.booleans(), st.data())
def test_rows_a_stride_apart_are_read_as_a_view_like_a_gather(tile, rows, runs, start, gap, perturb, data):
    """A gather whose rows are runs a fixed stride apart (a matrix the host laid out) reads a
    strided view of the vector instead of copying, the same elements as np.take; a row moved
    off the stride, or rows that overlap, are gathered."""
    k = runs * tile
    ld = k + gap - (data.draw(st.integers(0, k - 1)) if gap == 0 and k > 1 and data.draw(st.booleans()) else 0)
    index = start + np.arange(rows)[:, None] * ld + np.arange(k)
    perturb = perturb and rows > 2     # (two rows are a stride apart whatever it is)
    if perturb:
        index[-1] += 1
    vector = fused._Vector(np.arange(int(index.max()) + 1, dtype=np.float32) * 3, tile)
    g = fused._Gather(index, tile)
    strided = (ld >= k or rows == 1) and not perturb      # (one row overlaps nothing)
    assert (g.strided is not None) == strided
    np.testing.assert_array_equal(g.read(vector), np.take(vector.data, index))
    if strided:
        assert np.shares_memory(g.read(vector), vector.data)


_BLOCK = 16 * 16      # an ACC block: 16 rows of 16 lanes


@st.composite
def epilogues(draw):
    """Requantisation-like epilogues on a few ACC blocks that GEMMs or ACC LOADs made: ALU
    chains (every op, immediates at the int32 extremes, a vector operand from any block, this
    one too), table lookups and single ALUs, in place or into other blocks, reading what others
    wrote, and STOREs between and after them."""
    acc_blocks = sim_tests.SIZES[Mem.ACC] // _BLOCK
    block = st.integers(0, acc_blocks - 1).map(lambda b: b * _BLOCK)
    imm = st.one_of(st.none(), st.integers(-40, 40), st.sampled_from([-2**31, -2**31 + 1, -129, 127, 2**31 - 1]),
                    st.integers(-2**31, 2**31 - 1))
    # a table at WGT 0 (and a GEMM's weights), a run of the host buffer (the chains read it in place
    # in the source vector) or rows of it apart (gathered at each run)
    program = [Load(mem=Mem.WGT, sram_addr=0, sram_ld=16, slot=1, dram_offset=draw(st.integers(0, 512)),
                    dram_ld=draw(st.sampled_from([16, 20])), rows=16, cols=16)]
    for b in draw(st.lists(block, min_size=1, max_size=4, unique=True)):
        if draw(st.booleans()):
            tile = dict(acc_addr=b, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16)
            program += [Gemm(reset=True, **tile), Gemm(**tile)]
        else:
            program.append(Load(mem=Mem.ACC, sram_addr=b, sram_ld=16, slot=2, dram_offset=draw(st.integers(0, 256)),
                                dram_ld=16, rows=16, cols=16))

    def store():
        saturate = draw(st.booleans())
        return Store(mode=StoreMode.SATURATE if saturate else StoreMode.INT32, sram_addr=draw(block), sram_ld=16,
                     slot=3 if saturate else 4, dram_offset=draw(st.integers(0, 768)), dram_ld=16, rows=16, cols=16)
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["chain", "chain", "lut", "alu", "store"]))
        rows = draw(st.sampled_from([4, 16]))
        operands = dict(dst_addr=draw(block), ext_out=rows, dst_stride_out=16)
        if kind == "store":
            program.append(store())
        elif kind == "lut":
            program.append(Lut(lut_addr=0, **operands))
        else:
            operands.update(src_addr=draw(block), src_stride_out=16)
            steps = draw(st.lists(st.tuples(st.sampled_from(list(AluOp)), imm), min_size=1, max_size=8)
                         .filter(lambda s: sum(i is not None for _, i in s) <= 6))
            if kind == "chain":
                program.append(AluChain(**operands, **chain_code(steps)))
            else:
                (op, value), = steps[:1]
                program.append(Alu(op=op, use_imm=value is not None, imm=value or 0, **operands))
    program += [store() for _ in range(draw(st.integers(1, 3)))]
    return _auto(program)


@given(epilogues())
def test_alu_chains_in_the_plan_equal_instruction_by_instruction(stream):
    """The plan's ALU and LUT batches, chained into compiled passes where each works in place
    on what the one before made, run in an order that gives each what it reads: the host
    buffers and scratchpads end as instruction-by-instruction execution leaves them."""
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None
    _runs_alike(plan, stream, (sim, host), (ref, want))
    batches = len(plan.alus)
    assert len(plan._alu_steps) <= batches
    # a second run on the same workspace (the replay of a later call) again
    (sim2, host2), (ref2, want2) = _both(stream)[1:]
    _runs_alike(plan, stream, (sim2, host2), (ref2, want2))


def test_a_requantisation_s_chains_over_the_same_rows_are_one_pass():
    """A clamp of the accumulators, a block made from them (a zero point's), then the scaled
    accumulators plus that block into new values: three chains over the same rows, each
    reading what the ones before wrote as the same rows, run as one kernel call, block of rows
    by block, and leave what the reference leaves."""
    a, b = (dict(dst_addr=d, ext_out=16, dst_stride_out=16) for d in (0, 256))
    stream = _auto([_gemm(reset=True), Gemm(acc_addr=256, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16,
                                            reset=True),
                    AluChain(**a, **chain_code([(AluOp.MAX, -50), (AluOp.MIN, 50)])),
                    AluChain(**b, src_addr=0, src_stride_out=16, **chain_code([(AluOp.ADD, None), (AluOp.MUL, 3)])),
                    AluChain(**a, src_addr=256, src_stride_out=16,
                             **chain_code([(AluOp.MUL, 5), (AluOp.SHR, 2), (AluOp.ADD, None), (AluOp.MAX, 0)])),
                    *(Store(sram_addr=d, sram_ld=16, slot=4, dram_offset=d, dram_ld=16, rows=16, cols=16)
                      for d in (0, 256))])
    plan, (sim, host), (ref, want) = _both(stream)
    _runs_alike(plan, stream, (sim, host), (ref, want))
    assert len(plan.alus) == 3 and len(plan._alu_steps) == 1


def test_a_chain_follows_one_whose_rows_miss_what_it_writes_though_their_hull_holds_it():
    """A first chain adds rows read far apart (a bias row, and a row copied past the plan's
    values): a second one writing between them, from what the first wrote, shares its pass;
    one writing over one of those rows does not."""
    first = fused._Chain((kernels.RUN, 20, (20, 28)), (20, 28), 4)
    first.add(int(AluOp.ADD), (kernels.ROWS, np.array([0, 100]), (0, 104)))
    for writes, follows in (((40, 48), True), ((98, 106), False)):
        second = fused._Chain((kernels.RUN, 20, (20, 28)), writes, 4)
        assert second.follows([first]) is follows


# (at most 4 immediates: two more steps with one may go around them in a chain of 6)
_STEPS = st.lists(st.tuples(st.sampled_from(list(AluOp)), st.one_of(st.none(), st.just(0), st.integers(-40, 40))),
                  min_size=1, max_size=5).filter(lambda steps: sum(imm is not None for _, imm in steps) <= 4)


def _values_of(steps) -> int:
    """The runs of new values (of a block each) a plan numbers for a chain of ``steps``: its
    result, and the zeros the steps after its last product by the immediate 0 start from."""
    zero = [k for k, (op, imm) in enumerate(steps) if op is AluOp.MUL and imm == 0]
    return 2 if zero and zero[-1] < len(steps) - 1 else 1


@given(st.lists(_STEPS, min_size=1, max_size=4), st.sampled_from([0, 256]))
def test_a_chain_is_numbered_as_one_run_of_values_not_a_run_per_step(chains, src):
    """Chains one after the other over one block of accumulators (reading the block, or another
    one, as ``src``), then a STORE: each chain makes one run of new values (its result; the zeros
    its steps start from too, after a product by 0), whatever its steps, and the plan runs it
    in one batch of all its steps (with other chains of its level and steps), the reference's
    results."""
    tile = dict(dst_addr=0, ext_out=16, dst_stride_out=16, src_addr=src, src_stride_out=16)
    stream = _auto([_gemm(reset=True), _gemm(), *(AluChain(**tile, **chain_code(steps)) for steps in chains),
                    Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16, cols=16)])
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None
    assert plan.values == sim.acc.size + _BLOCK * (1 + sum(_values_of(steps) for steps in chains))
    live = [steps for steps in chains if _values_of(steps) == 2 or not any(op is AluOp.MUL and imm == 0
                                                                          for op, imm in steps)]
    # (batches by level and steps: two chains may share one)
    assert sum(new.size for _, new, _, _ in plan.alus) == _BLOCK * len(live)
    assert {len(program) for program, *_ in plan.alus} <= {len(fused._Program.of(steps).steps) for steps in live}
    _runs_alike(plan, stream, (sim, host), (ref, want))


@given(_STEPS, _STEPS, _STEPS, st.booleans())
def test_temporaries_a_chain_zeroes_or_copies_equal_instruction_by_instruction(before, copied, after, accumulate):
    """Chains as an epilogue's temporaries are made: ``before`` then a product by the immediate
    0 zeroes a block that a GEMM may then add into (a zeroed temporary is no ALU result), a
    copy ``[MUL 0, ADD src]`` of the accumulators followed by ``copied`` into another block,
    then ``after`` on the accumulators themselves (which the copy read: not in place over what
    it reads), each block stored: host buffers and scratchpads as the reference leaves them."""
    acc, zeroed, temporary = (dict(dst_addr=b, ext_out=16, dst_stride_out=16) for b in (0, 256, 512))
    program = [_gemm(reset=True), _gemm(), AluChain(**zeroed, **chain_code([*before, (AluOp.MUL, 0)]))]
    if accumulate:
        program.append(Gemm(acc_addr=256, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16))
    program += [AluChain(**temporary, src_addr=0, src_stride_out=16,
                         **chain_code([(AluOp.MUL, 0), (AluOp.ADD, None), *copied])),
                AluChain(**acc, src_addr=512, src_stride_out=16, **chain_code(after))]
    program += [Store(sram_addr=b, sram_ld=16, slot=4, dram_offset=b, dram_ld=16, rows=16, cols=16)
                for b in (0, 256, 512)]
    stream = _auto(program)
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None
    _runs_alike(plan, stream, (sim, host), (ref, want))


def _weighted_stream():
    """An input tile times a weight tile (slot 1) plus biases (slot 2: eight rows, padded to a
    tile: read by a gather), stored to slot 4."""
    return _auto([Load(mem=Mem.INP, sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=16, rows=16, cols=16),
                  Load(mem=Mem.WGT, sram_addr=0, sram_ld=16, slot=1, dram_offset=0, dram_ld=16, rows=16, cols=16),
                  Load(mem=Mem.ACC, sram_addr=0, sram_ld=16, slot=2, dram_offset=0, dram_ld=16, rows=8, cols=16,
                       pad_bottom=8, pad_value=5),
                  _gemm(), Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16, cols=16)])


def test_a_product_adds_onto_the_values_an_acc_load_brought():
    """A bias loaded into ACC, then a GEMM accumulating onto it: the product is added to the
    bias, not written over it (the plan writes a product over values that start at zero only)."""
    stream = _weighted_stream()
    plan, (sim, host), (ref, want) = _both(stream)
    assert not plan.products[0].assign
    _runs_alike(plan, stream, (sim, host), (ref, want))


def test_an_acc_load_of_zero_pads_alone_makes_zeros_as_a_reset_does():
    """Two tiles an ACC LOAD fills with zero pads alone (how a stream clears accumulators), one
    of them a GEMM's then, and a tile of the pad 5: the zeros are values that start at zero, as a
    reset's (a fill, or the product that alone adds into them writing them), with no code per
    element among the int32 sources, which hold the pad 5 alone; the run is the reference's."""
    def pads(addr, value):
        return Load(mem=Mem.ACC, sram_addr=addr, sram_ld=16, slot=2, dram_offset=0, dram_ld=16, rows=0, cols=0,
                    pad_top=32 if value == 0 else 16, pad_left=16, pad_value=value)
    stream = _auto([Load(mem=Mem.INP, sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=16, rows=16, cols=16),
                    Load(mem=Mem.WGT, sram_addr=0, sram_ld=16, slot=1, dram_offset=0, dram_ld=16, rows=16, cols=16),
                    pads(0, 0), pads(512, 5), _gemm()]
                   + [Store(sram_addr=b, sram_ld=16, slot=4, dram_offset=b, dram_ld=16, rows=16, cols=16)
                      for b in (0, 256, 512)])
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan.i_pads.tolist() == [5] * 16
    assert plan.products[0].assign
    _runs_alike(plan, stream, (sim, host), (ref, want))


@given(st.permutations(range(8)), st.sampled_from([0, 1, 2]))
def test_stores_of_tile_rows_in_another_order_write_row_by_row_like_the_reference(places, mode):
    """STOREs that put an accumulator tile's rows at scattered host rows (an output in another
    layout than the tiles'): written a row at a time, what instruction-by-instruction
    execution writes (int8 saturated or wrapped, int32)."""
    slot = 4 if mode == 0 else 3
    program = [Load(mem=Mem.INP, sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=16, rows=16, cols=16),
               Load(mem=Mem.WGT, sram_addr=0, sram_ld=16, slot=1, dram_offset=0, dram_ld=16, rows=16, cols=16),
               _gemm(reset=True), _gemm()]
    program += [Store(sram_addr=16 * r, sram_ld=16, slot=slot, dram_offset=32 * p + 3, dram_ld=16, rows=1, cols=16,
                      mode=mode) for r, p in enumerate(places)]
    stream = _auto(program)
    plan, (sim, host), (ref, want) = _both(stream)
    in_a_row = fused._affine([np.array(places)]) is not None      # (then one strided view)
    assert isinstance(plan.stores[0][2], fused._Copies) != in_a_row
    _runs_alike(plan, stream, (sim, host), (ref, want))


@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from([4, 8, 16, 24])), min_size=1, max_size=12,
                unique_by=lambda r: r[0]), st.sampled_from([np.int8, np.int32]))
def test_writes_by_rows_equal_a_scatter(runs, dtype):
    """Runs of a few lengths (tile rows of 16, 8 at a row's end, two rows that abut) in any
    order: copied run by run as a scatter writes them."""
    index = np.concatenate([start * 24 + np.arange(length) for start, length in runs])
    data = np.random.default_rng(len(runs)).integers(-2**31, 2**31, index.size).astype(np.int32)
    want, got = np.zeros(42 * 24, dtype), np.zeros(42 * 24, dtype)
    want[index] = data.astype(dtype)        # (abutting runs: later elements win, as below)
    fused._Copies(index, np.arange(index.size), 16).bound(data, got)()
    np.testing.assert_array_equal(got, want)


@st.composite
def spilled_batches(draw):
    """Value rows of ``tile`` and two ALU batches: an add (or a lookup) in place over the first
    rows whose other operand is no rows of the vector (rows gathered element by element among
    whole rows, a view of rows half a tile wide, elements all gathered), then a batch that writes
    over what that operand read (so the first one's chain must have read it before)."""
    tile, rows = 4, draw(st.integers(1, 6))
    n = rows * tile
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = rng.integers(-2**31, 2**31, 3 * n, dtype=np.int64).astype(np.int32)
    kind = draw(st.sampled_from(["mixed", "view", "elements"]))
    if kind == "view":
        operand = fused._View(n, (2 * rows, tile // 2), (tile // 2, 1))
        index = n + np.arange(n)
    else:
        index = n + rng.permutation(2 * n)[:n]
        if kind == "mixed":     # every other row a whole row
            index.reshape(rows, tile)[::2] = n + tile * rng.integers(0, 2 * rows - 1, (rows + 1) // 2)[:, None] + \
                np.arange(tile)
        operand = fused._Gather(index, tile)
    lookup = draw(st.booleans())
    table = rng.integers(-128, 128, 256).astype(np.int8)
    first = (((None, None, np.arange(256)),), fused._Span(0, (n,)), operand, None) if lookup else \
        (((np.add, AluOp.ADD, None),), fused._Span(0, (n,)), fused._Span(0, (n,)), operand)
    then = (((np.multiply, AluOp.MUL, 3),), fused._Span(n, (2 * n,)), fused._Span(n, (2 * n,)), None)
    return tile, values, index, lookup, table, [first, then]


@given(spilled_batches())
def test_chain_operands_that_are_no_rows_are_copied_into_rows_before_their_chain(drawn):
    """An ALU operand the chain kernel cannot read as rows is copied into whole rows past the
    plan's values just before its chain runs: every batch a compiled chain, the results those of
    numpy step by step (the copy made before a later batch writes what it read)."""
    tile, values, index, lookup, table, alus = drawn
    n = index.size
    want = values.copy()
    if lookup:
        want[:n] = table[np.clip(want[index], -128, 127) + 128]
    else:
        want[:n] = want[:n] + want[index]
    want[n:] *= 3
    need = fused._Spill.need(alus, tile)
    vector = fused._Vector(np.concatenate([values, np.full(need, 99, np.int32)]), tile)
    source = fused._Vector(table, tile)
    with mock.patch.object(fused, "_alu_step", side_effect=AssertionError("a numpy batch")):
        steps, _ = fused._alu_steps(vector, source, alus, fused._Spill(values.size, need))
    assert len(steps) == 2
    for step in steps:
        step()
    np.testing.assert_array_equal(vector.data[:values.size], want)


@given(st.lists(st.tuples(st.sampled_from(list(AluOp)), st.one_of(st.none(), _INT32, st.integers(-40, 40))),
                min_size=1, max_size=8), st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_a_batch_of_steps_run_by_numpy_or_the_kernel_computes_them_in_turn(steps, run, kernel, seed):
    """A batch of several steps (an ALU chain's) reading ``old`` and ``src`` gathered element by
    element: as numpy calls (:func:`fused._alu_calls`, its results a run or scattered) or as the
    compiled chain (its operands copied into rows first), each step in turn on what the one
    before made, int32 wrapping and shifts clipped, as numpy step by step in int64."""
    tile, n = 4, 12
    rng = np.random.default_rng(seed)
    values = rng.integers(-2**31, 2**31, 4 * n, dtype=np.int64).astype(np.int32)
    old, src = rng.permutation(2 * n)[:n], 2 * n + rng.permutation(n)      # read before the results' run
    new = 3 * n + (np.arange(n) if run or kernel else rng.permutation(n))
    program = tuple((fused.ALU_UFUNCS[op], op, None if imm is None else fused.alu_operand(op, imm))
                    for op, imm in steps)
    want = values.astype(np.int64)
    result = want[old]
    for op, imm in steps:
        operand = want[src] if imm is None else np.int64(imm)
        result = sim_tests.wrap32(_NUMPY[op](result, operand))
    want[new] = result
    batch = (program, fused._Span(3 * n, (n,)) if run or kernel else new, fused._Gather(old, tile),
             fused._Gather(src, tile) if any(imm is None for _, imm in steps) else None)
    need = fused._Spill.need([batch], tile) if kernel else 0
    vector = fused._Vector(np.concatenate([values, np.zeros(need, np.int32)]), tile)
    calls = fused._alu_steps(vector, fused._Vector(np.zeros(256, np.int8), tile), [batch],
                             fused._Spill(values.size, need))[0] if kernel else \
        fused._alu_calls(vector, fused._Vector(np.zeros(256, np.int8), tile), *batch)
    assert len(calls) == (1 if kernel else len(steps))
    for call in calls:
        call()
    np.testing.assert_array_equal(vector.data[:values.size], want.astype(np.int32))


def test_an_acc_load_of_one_int32_buffer_reads_each_tuple_s_buffer_where_it_is():
    """ACC LOADs from one int32 host buffer, no pads (a bias, a residual), read that buffer in
    place instead of a copy in the workspace: each tuple its own buffer, its contents as they
    are at each run, and the workspace's int32 vector (which other plans fill) never read."""
    stream = _auto([Load(mem=Mem.ACC, sram_addr=0, sram_ld=16, slot=2, dram_offset=16, dram_ld=32, rows=16, cols=16),
                    Load(mem=Mem.INP, sram_addr=0, sram_ld=16, slot=0, dram_offset=0, dram_ld=16, rows=16, cols=16),
                    Load(mem=Mem.WGT, sram_addr=0, sram_ld=16, slot=1, dram_offset=0, dram_ld=16, rows=16, cols=16),
                    _gemm(), Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16, cols=16)])
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None and plan.acc_loads is not None and len(plan.i_slots) == 1 and not plan.i_pads.size
    first, second = _other_host(1), _other_host(2)
    for k, views in enumerate((first, second, first, second)):
        if "ints" in sim.workspace:
            sim.workspace["ints"][:] = -7   # what another plan left there
        expect = [v.copy() for v in views]
        assert plan.run(views, sim)
        ref.run(stream, expect)
        sim_tests._assert_same_state(sim, ref, views, expect)
        views[2][:] = np.random.default_rng(k).integers(-2**31, 2**31, views[2].size, dtype=np.int64)  # new contents


@st.composite
def scattered_loads(draw):
    """A few LOADs into INP and WGT anywhere in them (far apart, padded or not), then FINISH."""
    stream = []
    for _ in range(draw(st.integers(1, 4))):
        mem = draw(st.sampled_from([Mem.INP, Mem.WGT]))
        rows, cols = draw(st.integers(1, 3)), draw(st.integers(1, 16))
        left, right, top = draw(st.integers(0, 2)), draw(st.integers(0, 2)), draw(st.integers(0, 1))
        height, width = top + rows, left + cols + right
        ld = width + draw(st.integers(0, 4))
        addr = draw(st.integers(0, sim_tests.SIZES[mem] - ((height - 1) * ld + width)))
        stream.append(Load(mem=mem, sram_addr=addr, sram_ld=ld, slot=draw(st.integers(0, 1)),
                           dram_offset=draw(st.integers(0, 900)), dram_ld=cols + draw(st.integers(0, 8)), rows=rows,
                           cols=cols, pad_top=top, pad_left=left, pad_right=right, pad_value=draw(st.integers(-3, 3))))
    return stream + [Finish()]


@given(scattered_loads())
def test_scratchpads_loaded_far_apart_end_as_instruction_by_instruction(stream):
    """What INP and WGT end with is looked for only between the first and the last element
    the LOADs wrote: loads at both ends of a scratchpad, the elements between untouched, end
    as the reference's, and so does everything around them."""
    plan, fused_side, reference_side = _both(stream)
    _runs_alike(plan, stream, fused_side, reference_side)


def test_inp_and_wgt_are_read_and_written_in_one_call_each():
    """A product of INP and WGT from before the stream, then of rows LOADs brought with pad rows
    (no views): the simulator has both scratchpads in one array, so the plan takes what it
    keeps of both in one call and copies what both end with in one; they end as the reference's."""
    loads = [Load(mem=m, sram_addr=256, sram_ld=16, slot=slot, dram_offset=0, dram_ld=16, rows=8, cols=16,
                  pad_bottom=8, pad_value=3) for m, slot in ((Mem.INP, 0), (Mem.WGT, 1))]
    stream = _auto([*loads, _gemm(), Gemm(acc_addr=0, inp_addr=256, wgt_addr=256, acc_ld=16, inp_ld=16, wgt_ld=16),
                    Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=16, cols=16)])
    plan, (sim, host), (ref, want) = _both(stream)
    _runs_alike(plan, stream, (sim, host), (ref, want))
    calls = [getattr(call, "func", None) for call in plan.prepare(host, sim)]
    assert plan.inp_kept.size and plan.wgt_kept.size and sum(getattr(f, "__name__", "") == "take" for f in calls) == 1
    assert calls.count(kernels.copy_runs(16, "int8", "float32")) == 1


class _Adds:
    """What _first_writes reads of a product: the values it adds into, and whether it may set them."""

    def __init__(self, at):
        self.grid, self.targets, self.assign = None, at, False


@given(st.integers(0, 8), st.integers(0, 24), st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.integers(1, 12)),
                                                        max_size=5), st.lists(st.integers(0, 40), max_size=6))
def test_products_alone_on_zeroed_values_set_them_and_the_rest_is_zeroed(acc_n, extent, adds, loaded):
    """A product whose run of values lies in ``[acc_n, zeroed)`` and that nothing else adds
    into nor loads sets them; the values there that no such product sets are zeroed, as
    ranges. Counted value by value here over every value, products and loads beyond
    ``zeroed`` too (_first_writes looks at ``[acc_n, zeroed)`` only)."""
    zeroed = acc_n + extent
    products = [_Adds(fused._Span(start, (size,)) if run else np.arange(start, start + size) * 2 % 50)
                for run, start, size in adds]
    loaded = np.array(loaded, np.intp)
    ranges = fused._first_writes(products, acc_n, zeroed, loaded)
    hits = np.zeros(64, int)
    hits[loaded] = 1
    for p in products:
        t = p.targets
        np.add.at(hits, np.arange(t.start, t.stop) if isinstance(t, fused._Span) else t, 1)
    zero = np.zeros(64, bool)
    zero[acc_n:zeroed] = True
    for p in products:
        t = p.targets
        alone = isinstance(t, fused._Span) and acc_n <= t.start and t.stop <= zeroed and \
            bool((hits[t.start:t.stop] == 1).all())
        assert p.assign == alone
        if alone:
            zero[t.start:t.stop] = False
    assert [v for lo, hi in ranges for v in range(lo, hi)] == np.flatnonzero(zero).tolist()
    assert all(hi < lo2 for (_, hi), (lo2, _) in zip(ranges, ranges[1:]))      # maximal ranges


def _requantised(first, second):
    """Two chains over a product's accumulators (``first`` then ``second``, each its steps) and a STORE."""
    tile = dict(dst_addr=0, ext_out=16, dst_stride_out=16)
    return _auto([_gemm(reset=True), _gemm(), AluChain(**tile, **chain_code(first)),
                  AluChain(dst_addr=256, ext_out=16, dst_stride_out=16, src_addr=0, src_stride_out=16,
                           **chain_code(second)),
                  *(Store(sram_addr=d, sram_ld=16, slot=4, dram_offset=d, dram_ld=16, rows=16, cols=16)
                    for d in (0, 256))])


def _shared_plans(first, second):
    """The plans of two streams compiled and fused in turn on one simulator, how many were copies,
    and whether the second's schedule is the first's."""
    sim, host = Simulator(sim_tests.SMALL), sim_tests._host()
    programs = [sim.compile(s, host) for s in (first, second)]
    with mock.patch.object(fused.FusedPlan, "with_operands", autospec=True,
                           side_effect=fused.FusedPlan.with_operands) as copied:
        plans = [fused.fuse(sim, s, p.timing.order(), host, p.shape) for s, p in zip((first, second), programs)]
    return plans, copied.call_count, programs[0].timing is programs[1].timing


@pytest.mark.parametrize("shifts", [(40, 9), (31, 31)])
def test_a_stream_equal_to_one_fused_before_but_for_its_immediates_gets_a_copy_of_its_plan(shifts):
    """The second stream's steps by immediates are equal wherever the first's are (a shift of 40
    is one of 31; the first's two shifts are one batch each, the second's may be one): its
    schedule is the first's, its plan the first's with its own operands, which runs as its own
    plan and the instructions one by one do."""
    first = _requantised([(AluOp.MUL, 1 << 20), (AluOp.SHR, 9), (AluOp.ADD, -3), (AluOp.MAX, -128)],
                         [(AluOp.MUL, 0), (AluOp.ADD, None), (AluOp.SHR, 8), (AluOp.MAX, -128)])
    second = _requantised([(AluOp.MUL, 3 << 17), (AluOp.SHR, shifts[0]), (AluOp.ADD, 5), (AluOp.MAX, -7)],
                          [(AluOp.MUL, 0), (AluOp.ADD, None), (AluOp.SHR, shifts[1]), (AluOp.MAX, -7)])
    (_, plan), copies, scheduled_once = _shared_plans(first, second)
    assert copies == 1 and scheduled_once       # (the cycle model reads no immediate)
    own, (sim, host), (ref, want) = _both(second)
    _runs_alike(plan, second, (sim, host), (ref, want))
    _, (sim, host), _ = _both(second)
    assert own.run(host, sim)
    np.testing.assert_array_equal(host[4], want[4])
    np.testing.assert_array_equal(sim.acc, ref.acc)


@pytest.mark.parametrize("first", [[(AluOp.MUL, 0), (AluOp.ADD, 1), (AluOp.SHR, 2)],
                                   [(AluOp.MUL, 3), (AluOp.ADD, 1), (AluOp.SHR, 40)]])
def test_immediates_that_change_a_plan_s_structure_are_no_ranks_of_its_shape(first):
    """A product by 0 drops the steps before it (and starts from zeros), and a shift of 40 is one of
    31 (one batch with another shift of 31): a stream where such immediates are others (two batches)
    gets its own plan."""
    then = [(AluOp.SHR, 31), (AluOp.ADD, None)]
    second = _requantised([(AluOp.MUL, 3), (AluOp.ADD, 1), (AluOp.SHR, 2)], then)
    (_, plan), copies, _ = _shared_plans(_requantised(first, then), second)
    assert copies == 0
    _runs_alike(plan, second, *_both(second)[1:])


@pytest.mark.parametrize("rows", [1, 6])
@settings(max_examples=3)
@given(st.integers(1, 3), st.booleans(), st.integers(-128, 127))
def test_a_products_repeated_pad_rows_are_multiplied_once(rows, k_tiles, reset, pad_value):
    """A matrix product at a few images (a classifier's last layer): an input LOAD of ``rows``
    host rows whose other rows of the tile are its pad value. The kernels multiply each
    distinct row once (the host rows and one pad row: the weight read in place by the tap sum's
    kernel for a few, the compiled product's for more), yet every row of ACC ends with its
    product, set (after a reset) or added into what ACC held before the stream."""
    inp = [Load(mem=Mem.INP, slot=0, sram_addr=256 * j, sram_ld=16, dram_offset=16 * j, dram_ld=64, rows=rows,
                cols=16, pad_bottom=16 - rows, pad_value=pad_value) for j in range(k_tiles)]
    wgt = Load(mem=Mem.WGT, slot=1, sram_addr=0, sram_ld=16, dram_offset=0, dram_ld=16,
               rows=16 * k_tiles, cols=16)
    gemm = _gemm(ext_out=k_tiles, inp_stride_out=256, wgt_stride_out=256)
    program = [*inp, wgt, *([_gemm(reset=True)] if reset else []), gemm,
               Store(sram_addr=0, sram_ld=16, slot=4, dram_offset=0, dram_ld=16, rows=rows, cols=16,
                     mode=StoreMode.INT32)]
    stream = _auto(program)
    plan, (sim, host), (ref, want) = _both(stream)
    assert plan is not None and plan.matmuls == 1
    multiplied = []
    binds = {kind: kind.bind for kind in (kernels._Gemm, kernels._Keeping)}

    def counted(self, source, xs, *rest):
        multiplied.append(len(xs) if xs.ndim == 2 else xs.shape[2])      # (a tap sum's rows: its last axis)
        return binds[type(self)](self, source, xs, *rest)
    # (spared at any size: a real model's layers spare a million products and more, these a few thousand)
    with mock.patch.object(kernels._Gemm, "bind", counted), mock.patch.object(kernels._Keeping, "bind", counted), \
            mock.patch.object(fused, "_SPREAD_MACS", 0):
        _runs_alike(plan, stream, (sim, host), (ref, want))
    assert multiplied == [rows + 1]
    multiplied.clear()
    with mock.patch.object(kernels._Gemm, "bind", counted):     # too small to spare: every row multiplied
        fused.fuse(sim, stream, sim.compile(stream, host).timing.order(), host).run(host, sim)
    assert multiplied == [16]
