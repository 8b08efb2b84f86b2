"""Automatic dependency tokens: any interleaving of queues behaves as program order."""

import importlib.util
import pathlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from accel.hw import tokens
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

    sim_tests._assert_program_order(program, sim, host)


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


class _Scan:
    """The tracker's range index written as a plain scan of every range: the reference."""

    def __init__(self):
        self.values = {}

    def values_overlapping(self, lo, hi):
        return [v for (a, b), v in self.values.items() if a < hi and lo < b]

    def get(self, lo, hi):
        return self.values.get((lo, hi))

    def put(self, lo, hi, value):
        self.values[(lo, hi)] = value

    def remove_inside(self, lo, hi):
        for key in [k for k in self.values if lo <= k[0] and k[1] <= hi]:
            del self.values[key]

    def overwrite(self, lo, hi, value):
        self.remove_inside(lo, hi)
        self.put(lo, hi, value)


@given(interleaved(), st.booleans())
def test_the_range_index_finds_what_a_scan_of_every_range_finds(program, aliased):
    """Same tokens, instruction for instruction, as with a linear scan of the ranges (host
    slots as their own spaces, or all in one address space where slots 0 and 1 overlap)."""
    host = (lambda slot, lo, hi: (lo + 100 * (slot > 1), hi + 100 * (slot > 1))) if aliased else None
    streams = []
    for ranges in (tokens._Ranges, _Scan):
        tokens_ranges, tokens._Ranges = tokens._Ranges, ranges
        try:
            em, deps = Emitter(), DependencyTracker(16, host)
            for ins in program:
                deps.record(ins, em.emit(deps.order(em, ins)))
            streams.append(em.finish())
        finally:
            tokens._Ranges = tokens_ranges
    assert streams[0] == streams[1]


_range = st.tuples(st.integers(0, 6), st.integers(1, 4)).map(lambda r: (r[0], r[0] + r[1]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "overwrite", "remove_inside"]), _range), max_size=30), _range)
def test_the_range_index_keeps_the_ranges_a_scan_keeps(operations, query):
    """Operation by operation, the index holds the ranges and values the reference does, sorted,
    and finds the same overlaps (its shortcuts for a lone range and a range written again)."""
    index, scan = tokens._Ranges(), _Scan()
    for step, (operation, (lo, hi)) in enumerate(operations):
        for ranges in (index, scan):
            if operation == "remove_inside":
                ranges.remove_inside(lo, hi)
            else:
                getattr(ranges, operation)(lo, hi, step)
        assert index.values == scan.values and index.keys == sorted(scan.values)
        assert sorted(index.values_overlapping(*query)) == sorted(scan.values_overlapping(*query))
