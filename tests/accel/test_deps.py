"""Automatic dependency tokens: any interleaving of queues behaves as program order."""

import importlib.util
import pathlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from accel.hw.tokens import DependencyTracker
from accel.hw.emitter import Emitter
from accel.hw.isa import Mem, Queue
from accel.hw.sim import Simulator

_spec = importlib.util.spec_from_file_location("accel_sim_strategies", pathlib.Path(__file__).with_name("test_sim.py"))
sim_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sim_tests)


@st.composite
def interleaved(draw):
    """Loads, compute and stores in any order, with no tokens of their own."""
    kinds = st.one_of(st.sampled_from([Mem.INP, Mem.WGT]).flatmap(sim_tests.dma), sim_tests.gemms(),
                      sim_tests.alus(), sim_tests.dma(Mem.ACC), sim_tests.dma("store"))
    return draw(st.lists(kinds, min_size=1, max_size=12))


@given(interleaved())
def test_auto_tokens_make_any_stream_run_in_program_order(program):
    host = sim_tests._host()
    sim = Simulator(sim_tests.SMALL)
    em = Emitter(lambda i, ins: sim.check(i, ins, host))
    deps = DependencyTracker(16)
    for ins in program:
        index = em.emit(deps.order(em, ins))
        deps.record(ins, index)
    sim.run(em.finish(), host)   # verify() inside: no deadlock, no unbalanced token

    model, expect = sim_tests.Model(), [h.astype(np.int64) for h in sim_tests._host()]
    for ins in program:
        model.run(ins, expect)
    for got, want in zip(host, expect):
        np.testing.assert_array_equal(got, want)
    for mem in Mem:
        np.testing.assert_array_equal(sim.memory(mem).astype(np.int64), model.mem[mem])


def test_double_buffered_loads_wait_for_the_gemm_two_steps_back():
    from accel.hw.isa import Gemm, Load

    em, deps = Emitter(), DependencyTracker(16)

    def emit(ins):
        index = em.emit(deps.order(em, ins))
        deps.record(ins, index)
        return index

    gemms = []
    for step in range(4):
        slot = (step % 2) * 256
        emit(Load(mem=Mem.INP, sram_addr=slot, sram_ld=16, slot=0, dram_offset=0, dram_ld=16, rows=16, cols=16))
        gemms.append(emit(Gemm(acc_addr=0, inp_addr=slot, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16)))
    stream = em.instructions
    # GEMM 0 frees slot 0 for LOAD 2, GEMM 1 frees slot 1 for LOAD 3: no waiting on the latest.
    loads = [i for i, ins in enumerate(stream) if isinstance(ins, Load)]
    assert not stream[loads[1]].pop_next      # slot 1 was never read before
    assert stream[loads[2]].pop_next          # slot 0: after GEMM 0
    pushers = [i for i, ins in enumerate(stream) if isinstance(ins, Gemm) and ins.push_prev]
    assert pushers == gemms[:2]
