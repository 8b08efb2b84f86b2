"""Emitter: token insertion, FINISH, and the deadlock / balance verifier."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import accel
from accel.hw.emitter import Emitter, nop, verify
from accel.hw.isa import AluOp, Finish, Mem, Queue
from accel.hw.sim import Simulator

LOAD, COMPUTE, STORE = Queue.LOAD, Queue.COMPUTE, Queue.STORE
EDGES = [(LOAD, COMPUTE), (COMPUTE, LOAD), (COMPUTE, STORE), (STORE, COMPUTE)]


def _op(em, queue):
    if queue is LOAD:
        em.load(Mem.INP, 0, 16, slot=0, dram_offset=0, dram_ld=16, rows=1, cols=16)
    elif queue is COMPUTE:
        em.alu(AluOp.ADD, 0, imm=1, use_imm=True)
    else:
        em.store(0, 16, slot=0, dram_offset=0, dram_ld=16, rows=1, cols=16)


# A program: a list of steps, each an instruction on a queue or a push/pop pair of an edge.
programs = st.lists(st.one_of(st.sampled_from(list(Queue)).map(lambda q: ("op", q)),
                              st.sampled_from(EDGES).map(lambda e: ("dep", e))), max_size=30)


def _build(program):
    em = Emitter()
    for kind, arg in program:
        if kind == "op":
            _op(em, arg)
        else:
            em.dep_push(*arg)
            em.dep_pop(*arg)
    return em.finish()


@given(programs)
def test_paired_push_pop_streams_verify(program):
    stream = _build(program)
    assert stream[-1] == Finish().with_flags(**{f: getattr(stream[-1], f) for f in
                                                ("pop_prev", "pop_next")})
    verify(stream)


def _one_flag_removed(stream, data):
    """``stream`` with one token flag (drawn) cleared, and the flag; None when it has none."""
    flagged = [(i, f) for i, ins in enumerate(stream)
               for f in ("pop_prev", "pop_next", "push_prev", "push_next") if getattr(ins, f)]
    if not flagged:
        return None
    index, flag = data.draw(st.sampled_from(flagged))
    broken = list(stream)
    broken[index] = broken[index].with_flags(**{flag: False})
    return broken, flag


@given(programs, st.data())
def test_removing_one_token_flag_is_rejected(program, data):
    stream = _build(program)
    broken = _one_flag_removed(stream, data)
    if broken is None:
        return
    broken, flag = broken
    with pytest.raises(accel.TokenError) as info:
        verify(broken)
    assert f"instruction #{info.value.index} `" in str(info.value)
    if flag.startswith("pop"):  # a push is left over: named by index
        assert "unbalanced" in str(info.value)
    else:  # the pop that lost its push can never run
        assert isinstance(info.value, accel.DeadlockError)


@given(programs, st.data())
def test_compiling_a_broken_stream_raises_verifys_error(program, data):
    """A session's stream is verified once, by the schedule Simulator.compile makes (the
    emitter leaves its check to it): a stream with a token flag removed is rejected there
    with the very error verify gives it; a sound stream compiles."""
    stream = _build(program)
    Simulator().compile(stream, [], checked=True)
    broken = _one_flag_removed(stream, data)
    if broken is None:
        return
    broken, _ = broken
    with pytest.raises(accel.TokenError) as want:
        verify(broken)
    with pytest.raises(accel.TokenError) as got:
        Simulator().compile(broken, [], checked=True)
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


def test_a_session_stream_that_deadlocks_is_refused_at_sync_unrun():
    out = np.zeros(16, np.int32)
    with pytest.raises(accel.DeadlockError, match=r"instruction #0 `ALU .*waits for a token from the LOAD queue"):
        with accel.Session() as s:
            s.alu(AluOp.ADD, 0, imm=1, use_imm=True, deps=1)        # pop_prev, never pushed
            s.store(out, 0, 0, 16, rows=1, cols=16, dram_ld=16, deps=0)
    assert s.pending == 0 and not out.any()


def test_dep_push_with_nothing_to_carry_it_emits_a_nop():
    em = Emitter()
    em.dep_push(LOAD, COMPUTE)
    em.dep_pop(LOAD, COMPUTE)
    stream = em.finish()
    assert stream == [nop(LOAD).with_flags(push_next=True), Finish(pop_prev=True)]


def test_two_pops_on_one_instruction_split_onto_a_nop():
    em = Emitter()
    em.dep_push(LOAD, COMPUTE)
    em.dep_push(LOAD, COMPUTE)
    em.dep_pop(LOAD, COMPUTE)
    em.dep_pop(LOAD, COMPUTE)
    em.alu(AluOp.ADD, 0, imm=1, use_imm=True)
    stream = em.finish()
    assert [i.pop_prev for i in stream] == [False, False, True, True, False]
    verify(stream)


def test_cyclic_wait_is_a_deadlock_naming_the_first_stuck_instruction():
    em = Emitter()
    em.load(Mem.INP, 0, 16, slot=0, dram_offset=0, dram_ld=16, rows=1, cols=16, pop_next=True,
            push_next=True)
    em.alu(AluOp.ADD, 0, imm=1, use_imm=True, pop_prev=True, push_prev=True)
    with pytest.raises(accel.DeadlockError, match=r"instruction #0 `LOAD .*waits for a token "
                                                  r"from the COMPUTE queue"):
        em.finish()
    assert len(em) == 0  # the emitter starts afresh


def test_stream_must_end_with_a_single_finish():
    with pytest.raises(accel.InstructionError, match="must end with FINISH"):
        verify([nop(LOAD)])
    with pytest.raises(accel.InstructionError, match="FINISH must be the last"):
        verify([Finish(), Finish()])
    with pytest.raises(ValueError, match="neighbouring"):
        Emitter().dep_push(LOAD, STORE)


def test_validator_runs_on_every_instruction_with_its_index():
    seen = []
    em = Emitter(lambda i, ins: seen.append((i, ins.opcode.name)))
    _op(em, LOAD)
    em.dep_push(LOAD, COMPUTE)
    em.dep_pop(LOAD, COMPUTE)
    _op(em, STORE)
    em.finish()
    assert seen == [(0, "LOAD"), (1, "STORE"), (2, "FINISH")]


@pytest.mark.parametrize("tokens", [True, False])
@pytest.mark.parametrize("queue, flag, message", [
    (LOAD, "pop_prev", "pop_prev is not valid on the LOAD queue"),
    (LOAD, "push_prev", "push_prev is not valid on the LOAD queue"),
    (STORE, "pop_next", "pop_next is not valid on the STORE queue"),
    (STORE, "push_next", "push_next is not valid on the STORE queue"),
])
def test_the_form_check_alone_rejects_what_the_full_verify_does(tokens, queue, flag, message):
    """verify(tokens=False), the check a session's streams get (the cycle model runs their
    tokens), names a flag without a neighbour and a FINISH before the end as verify() does;
    a stream of valid flags passes it."""
    bad = nop(queue).with_flags(**{flag: True})
    with pytest.raises(accel.InstructionError, match=f"instruction #1 .*{message}"):
        verify([nop(COMPUTE), bad, Finish()], tokens=tokens)
    with pytest.raises(accel.InstructionError, match="instruction #0 .*FINISH must be the last"):
        verify([Finish(), nop(LOAD), Finish()], tokens=tokens)
    pushed = nop(COMPUTE).with_flags(push_prev=True, push_next=True)
    verify([pushed, nop(LOAD).with_flags(pop_next=True), nop(STORE).with_flags(pop_prev=True), Finish()],
           tokens=tokens)
