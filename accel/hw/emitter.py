"""Building instruction streams: per-queue dependency tokens and the deadlock verifier.

Tokens follow VTA's runtime: ``dep_push(a, b)`` makes the latest instruction of queue
``a`` send a token to neighbour ``b`` when it completes, ``dep_pop(a, b)`` makes the next
instruction of queue ``b`` wait for one. Where a flag is already taken a NOP (an empty
LOAD, GEMM or STORE) carries it.

>>> from accel.hw.isa import Mem, Queue
>>> em = Emitter()
>>> _ = em.load(Mem.INP, 0, 16, slot=0, dram_offset=0, dram_ld=16, rows=16, cols=16)
>>> em.dep_push(Queue.LOAD, Queue.COMPUTE); em.dep_pop(Queue.LOAD, Queue.COMPUTE)
>>> _ = em.gemm(0, 0, 0, 16, 16, 16)
>>> print(disassemble(em.finish()))
0000  LOAD INP[0 ld=16] <- slot0[0 ld=16] 16x16 [push_next]
0001  GEMM ACC[0 ld=16] += INP[0 ld=16] x WGT[0 ld=16]^T [pop_prev]
0002  FINISH
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from accel.hw.errors import DeadlockError, InstructionError, TokenError
from accel.hw.instructions import chain_code
from accel.hw.isa import (
    ALLOWED_FLAGS, Alu, AluChain, AluOp, Finish, Gemm, Instruction, Load, Mem, Opcode, Queue, Store,
    StoreMode, disassemble, queue_of,
)

__all__ = ["Emitter", "verify", "nop", "CHANNELS", "POPS", "PUSHES"]

Validator = Callable[[int, Instruction], None]


def nop(queue: Queue) -> Instruction:
    """An instruction of ``queue`` that does nothing but can carry dependency flags.

    >>> disassemble(nop(Queue.STORE))
    'STORE slot0[0 ld=0] <- ACC[0 ld=0] 0x0 INT32'
    """
    if queue is Queue.LOAD:
        return Load(mem=Mem.INP, sram_addr=0, sram_ld=0, slot=0, dram_offset=0, dram_ld=0,
                    rows=0, cols=0)
    if queue is Queue.STORE:
        return Store(sram_addr=0, sram_ld=0, slot=0, dram_offset=0, dram_ld=0, rows=0, cols=0)
    return Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=0, inp_ld=0, wgt_ld=0, ext_out=0)


def _direction(src: Queue, dst: Queue) -> tuple[str, str]:
    """(push flag on src, pop flag on dst) for tokens from src to its neighbour dst."""
    src, dst = Queue(src), Queue(dst)
    if dst == src + 1:
        return "push_next", "pop_prev"
    if dst == src - 1:
        return "push_prev", "pop_next"
    raise ValueError(f"tokens only flow between neighbouring queues, not {src.name} -> {dst.name}")


class Emitter:
    """Accumulates one instruction stream, validating each instruction as it is added.

    ``validate(index, instruction)`` (e.g. :meth:`accel.hw.sim.Simulator.check`) runs on
    every emitted instruction so that errors surface at the call that caused them.

    >>> em = Emitter()
    >>> em.alu(AluOp.ADD, dst_addr=0, imm=1, use_imm=True)
    0
    >>> len(em)
    1
    """

    def __init__(self, validate: Optional[Validator] = None) -> None:
        self._validate = validate
        self.instructions: list[Instruction] = []
        #: the queue of each instruction, by index (what a dependency tracker looks up in its scans)
        self.queues: list[int] = []
        self._last: dict[Queue, int] = {}
        self._pending: dict[Queue, set[str]] = {q: set() for q in Queue}

    def __len__(self) -> int:
        return len(self.instructions)

    def emit(self, ins: Instruction, validated: bool = False, queue: Optional[int] = None) -> int:
        """Append ``ins`` (plus any pending pops of its queue); returns its index.

        ``validated=True`` skips the validator for an instruction already checked against
        the same Config and buffer table (the runtime's instruction cache); ``queue``, if
        given, is the number of its queue (:func:`~accel.hw.isa.queue_of`), which a caller
        that keeps it need not have found again.

        >>> Emitter().emit(nop(Queue.LOAD)), Emitter().emit(nop(Queue.LOAD), queue=0)
        (0, 0)
        """
        if queue is None:
            queue = queue_of(ins)
        pending = self._pending[queue]
        if pending:
            clash = [f for f in pending if getattr(ins, f)]
            if clash:  # the instruction already pops there itself: a NOP takes the pending pop
                self._append(nop(Queue(queue)).with_flags(**{f: True for f in clash}), queue)
                pending.difference_update(clash)
            if pending:
                ins = ins.with_flags(**{f: True for f in pending})
                pending.clear()
        return self._append(ins, queue, validated)

    def _append(self, ins: Instruction, queue: Queue, validated: bool = False) -> int:
        index = len(self.instructions)
        if self._validate is not None and not validated:
            self._validate(index, ins)
        self.instructions.append(ins)
        self.queues.append(queue)
        self._last[queue] = index
        return index

    def load(self, mem: Mem, sram_addr: int, sram_ld: int, *, slot: int, dram_offset: int,
             dram_ld: int, rows: int, cols: int, pad_top: int = 0, pad_bottom: int = 0,
             pad_left: int = 0, pad_right: int = 0, pad_value: int = 0, **flags: bool) -> int:
        """Emit a LOAD (see :class:`accel.hw.isa.Load`); returns its index."""
        return self.emit(Load(mem=mem, sram_addr=sram_addr, sram_ld=sram_ld, slot=slot,
                              dram_offset=dram_offset, dram_ld=dram_ld, rows=rows, cols=cols,
                              pad_top=pad_top, pad_bottom=pad_bottom, pad_left=pad_left,
                              pad_right=pad_right, pad_value=pad_value, **flags))

    def store(self, sram_addr: int, sram_ld: int, *, slot: int, dram_offset: int, dram_ld: int,
              rows: int, cols: int, mode: StoreMode = StoreMode.INT32, dram_step: int = 1, **flags: bool) -> int:
        """Emit a STORE (see :class:`accel.hw.isa.Store`); returns its index."""
        return self.emit(Store(sram_addr=sram_addr, sram_ld=sram_ld, slot=slot,
                               dram_offset=dram_offset, dram_ld=dram_ld, rows=rows, cols=cols,
                               dram_step=dram_step, mode=mode, **flags))

    def gemm(self, acc_addr: int, inp_addr: int, wgt_addr: int, acc_ld: int, inp_ld: int,
             wgt_ld: int, **fields: int) -> int:
        """Emit a GEMM (see :class:`accel.hw.isa.Gemm`); loop fields and flags by keyword."""
        return self.emit(Gemm(acc_addr=acc_addr, inp_addr=inp_addr, wgt_addr=wgt_addr,
                              acc_ld=acc_ld, inp_ld=inp_ld, wgt_ld=wgt_ld, **fields))

    def alu(self, op: AluOp, dst_addr: int, **fields: int) -> int:
        """Emit an ALU instruction (see :class:`accel.hw.isa.Alu`); returns its index."""
        return self.emit(Alu(op=op, dst_addr=dst_addr, **fields))

    def alu_chain(self, steps: list, dst_addr: int, **fields: int) -> int:
        """Emit an ALU chain of ``steps`` ``(op, imm, None for src, or a
        :class:`~accel.hw.instructions.ChainVector`)`` (see :class:`accel.hw.isa.AluChain`);
        returns its index.

        >>> em = Emitter()
        >>> em.alu_chain([(AluOp.MUL, 3), (AluOp.ADD, None)], 0, src_addr=16, ext_out=2, dst_stride_out=32)
        0
        >>> em.instructions[0].steps
        [(<AluOp.MUL: 4>, 3), (<AluOp.ADD: 0>, None)]
        """
        return self.emit(AluChain(dst_addr=dst_addr, **chain_code(steps), **fields))

    def dep_push(self, src: Queue, dst: Queue) -> None:
        """The latest instruction of ``src`` sends a token to neighbour ``dst`` on completion.

        >>> em = Emitter(); em.dep_push(Queue.STORE, Queue.COMPUTE)
        >>> em.instructions[0].push_prev   # no store yet: a NOP carries the token
        True
        """
        src = Queue(src)
        push, _ = _direction(src, dst)
        last = self._last.get(src)
        if last is not None and not getattr(self.instructions[last], push):
            self.instructions[last] = self.instructions[last].with_flags(**{push: True})
        else:
            self._append(nop(src).with_flags(**{push: True}), src)

    def dep_pop(self, src: Queue, dst: Queue) -> None:
        """The next instruction of ``dst`` waits for a token from neighbour ``src``.

        >>> em = Emitter(); em.dep_pop(Queue.LOAD, Queue.COMPUTE); em.dep_pop(Queue.LOAD, Queue.COMPUTE)
        >>> [i.pop_prev for i in em.instructions]   # the first pop went onto a NOP
        [True]
        """
        dst = Queue(dst)
        _, pop = _direction(src, dst)
        pending = self._pending[dst]
        if pop in pending:
            self._append(nop(dst).with_flags(**{pop: True}), dst)
        pending.add(pop)

    def finish(self, check_tokens: bool = True) -> list[Instruction]:
        """Close the stream with FINISH, verify its tokens and return it; the emitter is emptied.

        Raises :class:`accel.hw.errors.TokenError` / :class:`DeadlockError` for a stream that
        would hang; the emitter is emptied either way. ``check_tokens=False`` leaves the
        check to the caller (:meth:`accel.hw.sim.Simulator.compile`, whose cycle model runs
        the tokens anyway, makes it).
        """
        for queue in (Queue.LOAD, Queue.STORE):
            if self._pending[queue]:
                self.emit(nop(queue))
        pending = self._pending[Queue.COMPUTE]
        self._append(Finish().with_flags(**{f: True for f in pending}), Queue.COMPUTE)
        stream = self.instructions
        self.instructions = []
        self.queues = []
        self._last = {}
        self._pending = {q: set() for q in Queue}
        if check_tokens:
            verify(stream)
        return stream


# Token channels, (source queue, destination queue): 0 load->compute, 1 compute->load,
# 2 compute->store, 3 store->compute.
CHANNELS = ((Queue.LOAD, Queue.COMPUTE), (Queue.COMPUTE, Queue.LOAD),
            (Queue.COMPUTE, Queue.STORE), (Queue.STORE, Queue.COMPUTE))
_FLAG_STEP = (("pop_prev", -1), ("pop_next", +1), ("push_prev", -1), ("push_next", +1))


def _channel_table(queue: Queue, pop: bool) -> tuple[tuple[int, ...], ...]:
    """Per value of ``Instruction.flags``: the channels an instruction of ``queue`` takes
    a token from (``pop``) or gives one to; a flag without a neighbour maps to nothing."""
    table = []
    for flags in range(16):
        chans = []
        for bit, (flag, step) in enumerate(_FLAG_STEP):
            other = queue + step
            if flags >> bit & 1 and flag.startswith("pop" if pop else "push") and 0 <= other <= 2:
                chans.append(CHANNELS.index((other, queue) if pop else (queue, other)))
        table.append(tuple(chans))
    return tuple(table)


#: POPS[queue][flags] / PUSHES[queue][flags]: the token channels (indices into CHANNELS)
#: an instruction with those flags pops from / pushes to.
POPS = tuple(_channel_table(q, True) for q in Queue)
PUSHES = tuple(_channel_table(q, False) for q in Queue)


def _check_flags(index: int, ins: Instruction, queue: Queue, flags: int) -> None:
    """Raise for a dependency flag ``queue`` has no neighbour for."""
    if flags & ~ALLOWED_FLAGS[queue]:
        flag = next(f for bit, (f, step) in enumerate(_FLAG_STEP)
                    if flags >> bit & 1 and not 0 <= queue + step <= 2)
        raise InstructionError(index, ins, f"{flag} is not valid on the "
                                           f"{queue.name} queue (no neighbour there)")


def verify(stream: Sequence[Instruction], *, tokens: bool = True) -> None:
    """Reject a stream that is not FINISH-terminated, deadlocks, or leaves tokens unbalanced
    (``tokens=False``: only the first, and flags a queue does not have: the stream's form,
    for a caller that runs the tokens itself, as :func:`accel.hw.cycles.schedule` does).

    Runs the three queues abstractly: a head may issue once its pops have tokens (and
    FINISH once the other queues are empty). Queues only ever enable each other, so if
    this greedy run gets stuck, every schedule does.

    >>> verify([Gemm(acc_addr=0, inp_addr=0, wgt_addr=0, acc_ld=16, inp_ld=16, wgt_ld=16,
    ...              pop_prev=True), Finish()])
    Traceback (most recent call last):
      ...
    accel.hw.errors.DeadlockError: deadlock: instruction #0 `GEMM ACC[0 ld=16] += INP[0 ld=16] x WGT[0 ld=16]^T [pop_prev]` waits for a token from the LOAD queue that is never pushed
    """
    if not stream or stream[-1].opcode is not Opcode.FINISH:
        index = len(stream) - 1
        raise InstructionError(index, stream[-1] if stream else None,
                               "the stream must end with FINISH")
    last = len(stream) - 1
    finish = Opcode.FINISH
    if not tokens:      # the form alone (a session's streams, up to a million instructions)
        for index, ins in enumerate(stream):
            if ins.opcode is finish and index != last:
                raise InstructionError(index, ins, "FINISH must be the last instruction")
            flags = ins.flags
            if flags:
                _check_flags(index, ins, queue_of(ins), flags)
        return
    queues: tuple[list[int], ...] = ([], [], [])
    pops, pushes = [()] * len(stream), [()] * len(stream)
    for index, ins in enumerate(stream):
        if ins.opcode is finish and index != last:
            raise InstructionError(index, ins, "FINISH must be the last instruction")
        queue = queue_of(ins)
        flags = ins.flags
        _check_flags(index, ins, queue, flags)
        pops[index] = POPS[queue][flags]
        pushes[index] = PUSHES[queue][flags]
        queues[queue].append(index)
    # pushed[ch] lists the instructions that pushed on channel ch, in order; popped counts.
    pushed: tuple[list[int], ...] = ([], [], [], [])
    popped = [0, 0, 0, 0]
    pos = [0, 0, 0]
    size = [len(q) for q in queues]
    progress = True
    while progress:
        progress = False
        for queue in (0, 1, 2):
            members = queues[queue]
            while pos[queue] < size[queue]:
                index = members[pos[queue]]
                if index == last and (pos[0] < size[0] or pos[2] < size[2]):
                    break   # FINISH waits for the load and store queues
                if any(len(pushed[ch]) <= popped[ch] for ch in pops[index]):
                    break
                for ch in pops[index]:
                    popped[ch] += 1
                for ch in pushes[index]:
                    pushed[ch].append(index)
                pos[queue] += 1
                progress = True
    stuck = [queues[q][pos[q]] for q in (0, 1, 2) if pos[q] < size[q]]
    if stuck:
        index = min(i for i in stuck if i != last) if len(stuck) > 1 else stuck[0]
        missing = [CHANNELS[ch][0] for ch in pops[index] if len(pushed[ch]) <= popped[ch]]
        what = (" and ".join(f"a token from the {src.name} queue" for src in missing)
                + " that is never pushed") if missing else "queues that never drain"
        raise DeadlockError(index, f"deadlock: instruction #{index} `{disassemble(stream[index])}` "
                                   f"waits for {what}")
    for ch, (src, dst) in enumerate(CHANNELS):
        left = pushed[ch][popped[ch]:]
        if left:
            raise TokenError(left[0], (
                f"unbalanced tokens: {len(left)} token(s) from the {src.name} to the {dst.name} "
                f"queue are never popped, the first pushed by instruction #{left[0]} "
                f"`{disassemble(stream[left[0]])}`"))
