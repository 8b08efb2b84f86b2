"""From a session's calls to a runnable :class:`~accel.hw.sim.Program`, built once per stream.

A session receives its stream one call at a time: instructions (with explicit dependency
flags or ``AUTO``) and ``dep_push``/``dep_pop``. Building a stream costs a few tens of
microseconds per instruction (range checks, dependency tracking, token verification, the
cycle model); a compiled function emits *the same calls* every time it runs. So a
:class:`StreamBuilder` remembers the calls of the streams it built, and while a new
stream repeats one of them call for call it only compares each call with the recorded
one; at the end it hands back the recorded Program, which re-checks the buffer table in
O(slots) before it runs. At the first call that differs, the calls so far are built the
ordinary way and building goes on from there, so the result is always the stream the
calls describe.

What a recorded stream depends on besides its calls is the buffer table: the dtype, size
and writability of each slot (the Program's signature) and which slots share memory (the
automatic tokens order aliasing slots by address). The latter is part of the recording.

>>> import numpy as np
>>> from accel.hw.sim import Simulator
>>> from accel.hw.tokens import DependencyTracker
>>> from accel.hw.isa import Alu, AluOp
>>> sim = Simulator(); host = []
>>> fields = {Alu: ("op", "use_imm", "imm", "dst_addr", "src_addr", "ext_out", "ext_in",
...                 "dst_stride_out", "dst_stride_in", "src_stride_out", "src_stride_in")}
>>> b = StreamBuilder(sim, DependencyTracker(16), lambda: host, fields)
>>> for run in range(3):
...     index = b.instruction(Alu, (AluOp.ADD, True, 1, 0, 0, 1, 1, 0, 0, 0, 0), AUTO)
...     _ = b.finish().run(host)
>>> b.replays, int(sim.acc[0])          # built once, replayed twice; ran three times
(2, 3)
"""

from __future__ import annotations

import operator
from typing import Callable, Optional, Sequence

import numpy as np

from accel.hw.emitter import Emitter
from accel.hw.instructions import AUTO
from accel.hw.isa import Instruction, Queue, make, queue_of
from accel.hw.sim import Program, Simulator
from accel.hw.tokens import DependencyTracker, footprint, on_host

__all__ = ["StreamBuilder", "AUTO"]

#: ``deps`` value asking the dependency tracker for the tokens (what compiled code uses).

_FLAGS = [{"pop_prev": bool(d & 1), "pop_next": bool(d & 2), "push_prev": bool(d & 4),
           "push_next": bool(d & 8)} for d in range(16)]
_INSTRUCTION_CACHE_LIMIT = 1 << 16

Buffers = Sequence[Optional[np.ndarray]]


class _Recording:
    """One built stream: its calls, what each returned, the Program, and the aliasing of
    the buffer table it was built against."""

    __slots__ = ("calls", "results", "program", "aliasing")

    def __init__(self, calls: list, results: list, program: Program, aliasing: tuple) -> None:
        self.calls, self.results, self.program, self.aliasing = calls, results, program, aliasing


class StreamBuilder:
    """Builds a session's streams from its calls and replays the ones it has built before.

    ``simulator`` checks instructions and compiles the finished stream, ``tracker`` adds
    the ``AUTO`` tokens, ``buffers()`` returns the buffer table's current views (by slot),
    ``fields[cls]`` names the fields of the ``values`` tuples :meth:`instruction` takes for
    ``cls`` (all but the flags, in the runtime ABI's order). Up to ``keep`` recorded
    streams are kept, most recently used first (a model with several offloaded functions
    alternates between their streams).
    """

    def __init__(self, simulator: Simulator, tracker: DependencyTracker,
                 buffers: Callable[[], Buffers], fields: dict[type, tuple[str, ...]], *,
                 keep: int = 8) -> None:
        self.simulator = simulator
        self.tracker = tracker
        self.buffers = buffers
        self.fields = fields
        self.keep = keep
        self.emitter = Emitter(self._validate)
        self.replays = 0                      # streams served from a recording
        self._recordings: list[_Recording] = []
        # Instructions made and checked in any stream, by call: other streams repeat calls
        # too (layers of one shape). Each as (its place in _kept, its queue's number, its
        # footprint in element ranges, the facts of its host slot it was checked against or
        # None): the check reads nothing else of the buffer table (_slot_facts), so a stream
        # whose slot has the same facts needs no check, and the footprint holds in any
        # stream once its host ranges are placed (tokens.on_host). Numbers, strings and
        # tuples of them, which the garbage collector stops tracking (an entry holding the
        # instruction would be one more tracked object per call, up to a million)
        self._made: dict[tuple, tuple[int, int, tuple, Optional[tuple]]] = {}
        self._kept: list[Instruction] = []
        # the place of the host slot in a call (class number, deps, values...), by class number
        self._slot_at = tuple(2 + names.index("slot") if "slot" in names else None for names in fields.values())
        # a call names its class by number: a call of ints only is a tuple the cyclic garbage
        # collector stops tracking, and a first model call records up to a million of them
        # (each collection of the oldest generation would walk them all again)
        self._classes = tuple(fields)
        self._number = {cls: k for k, cls in enumerate(self._classes)}
        self._start()

    def _start(self) -> None:
        # Instructions made and checked in this stream, by call: compiled loops repeat
        # calls, and a repeat allocates and checks nothing: (place in _kept, queue, footprint)
        self._instructions: dict[tuple, tuple[int, int, Optional[tuple]]] = {}
        self._following: Optional[_Recording] = None   # the recording this stream repeats so far
        self._at = 0                                    # ... up to this call
        self._calls: list = []
        self._results: list = []
        self._fresh = True                              # no call yet in this stream
        self._facts: dict[int, tuple] = {}              # per host slot used, see _slot_facts
        # an instruction with explicit flags was built: they may name a queue's missing
        # neighbour, which the stream's form check (verify) finds; AUTO's tokens and the
        # emitter's pushes and pops never do
        self._explicit = False

    def __len__(self) -> int:
        """Calls received in this stream (instructions, pushes and pops)."""
        return self._at if self._following is not None else len(self._calls)

    def _validate(self, index: int, ins: Instruction) -> None:
        self.simulator.check(index, ins, self.buffers())

    # ------------------------------------------------------------------ calls
    def instruction(self, cls: type[Instruction], values: tuple, deps: int) -> int:
        """Add an instruction of ``cls`` with these field ``values`` (ordered as
        ``fields[cls]``) and ``deps`` (a 4-bit flag mask or :data:`AUTO`); returns its
        index in the stream. Raises the check's error for an invalid instruction."""
        # one flat tuple (class number, deps, values...), kept by the recording: a nested one
        # would keep two objects per instruction, and each kept object brings the next
        # garbage collection nearer (a full one walks every object the model keeps)
        call = (self._number[cls], deps) + values
        rec = self._following
        if rec is not None:     # the common case of a replay, spelt out: one comparison
            at = self._at
            if at < len(rec.calls) and rec.calls[at] == call:
                self._at = at + 1
                return rec.results[at]
            return self._call(call)
        if self._fresh:
            return self._call(call)
        # and of a first call: built at once (what _call would come to)
        result = self._build_instruction(call)
        self._calls.append(call)
        self._results.append(result)
        return result

    def dep_push(self, src: Queue, dst: Queue) -> None:
        """See :meth:`accel.hw.emitter.Emitter.dep_push`."""
        self._call(("push", int(src), int(dst)))

    def dep_pop(self, src: Queue, dst: Queue) -> None:
        """See :meth:`accel.hw.emitter.Emitter.dep_pop`."""
        self._call(("pop", int(src), int(dst)))

    def _call(self, call: tuple):
        rec = self._following
        if rec is not None:
            at = self._at
            if at < len(rec.calls) and rec.calls[at] == call:
                self._at = at + 1
                return rec.results[at]
            rec = self._diverge(call)
            if rec is not None:
                self._at = at + 1
                return rec.results[at]
        elif self._fresh:
            self._fresh = False
            for rec in self._recordings:
                if rec.calls[0] == call:
                    self._following, self._at = rec, 1
                    return rec.results[0]
        result = self._build(call)
        self._calls.append(call)
        self._results.append(result)
        return result

    def _diverge(self, call: tuple) -> Optional[_Recording]:
        """The stream stops repeating the recording it followed: follow (and return)
        another one with the same calls so far and ``call`` next, if there is one; else
        build the calls so far the ordinary way (and return None)."""
        rec, at = self._following, self._at
        for other in self._recordings:
            if other is not rec and len(other.calls) > at and other.calls[at] == call \
                    and other.calls[:at] == rec.calls[:at]:
                self._following = other
                return other
        self._following = None
        self._build_prefix(rec, at)
        return None

    def _build_prefix(self, rec: _Recording, at: int) -> None:
        for done in rec.calls[:at]:
            self._calls.append(done)
            self._results.append(self._build(done))

    def _build(self, call: tuple):
        kind = call[0]
        if kind == "push":
            self.emitter.dep_push(Queue(call[1]), Queue(call[2]))
            return None
        if kind == "pop":
            self.emitter.dep_pop(Queue(call[1]), Queue(call[2]))
            return None
        return self._build_instruction(call)

    def _build_instruction(self, call: tuple) -> int:
        made = self._instructions.get(call)
        if made is not None:        # a repeat in this stream: checked, its footprint known
            place, queue, accesses = made
            if call[1] == AUTO:
                return self.tracker.emit(self.emitter, self._kept[place], queue, accesses)
            return self.emitter.emit(self._kept[place], validated=True)
        number, deps = call[0], call[1]
        at = self._slot_at[number]
        facts = None if at is None else self._slot_facts(call[at])
        made = self._made.get(call)
        if made is None:
            if len(self._kept) >= _INSTRUCTION_CACHE_LIMIT:
                self._made.clear()
                self._kept.clear()
                self._instructions.clear()
            cls = self._classes[number]
            fields = dict(zip(self.fields[cls], call[2:]))
            fields.update(_flags(0 if deps == AUTO else deps))
            ins = make(cls, fields)
            place, queue, accesses, checked = len(self._kept), int(queue_of(ins)), None, None
            self._kept.append(ins)
        else:
            # made in another stream: checked there, and valid here if its slot has the facts
            # it was checked against
            place, queue, accesses, checked = made
            ins = self._kept[place]
        if deps == AUTO:
            if checked != facts or made is None:
                self._validate(len(self.emitter), ins)
            if accesses is None:
                accesses = footprint(ins, self.tracker.tile)
            placed = accesses if at is None or self.tracker.host is None else on_host(accesses, self.tracker.host)
            index = self.tracker.emit(self.emitter, ins, queue, placed)
        else:
            self._explicit = True
            index = self.emitter.emit(ins, validated=made is not None and checked == facts)
            placed = None       # (no tokens added: a repeat in this stream is emitted as it is)
        self._instructions[call] = (place, queue, placed)
        self._made[call] = (place, queue, accesses, facts)
        return index

    def _slot_facts(self, slot: int) -> tuple:
        """What the checks read of host ``slot`` in this stream's buffer table: its dtype, size
        and writability (``()`` for a slot not in the table)."""
        facts = self._facts.get(slot)
        if facts is None:
            buffers = self.buffers()
            flat = buffers[slot] if slot < len(buffers) else None
            facts = self._facts[slot] = () if flat is None else (flat.dtype.str, flat.size, flat.flags.writeable)
        return facts

    # ------------------------------------------------------------------ stream ends
    def finish(self) -> Program:
        """Close the stream (FINISH, tokens verified) and return its checked, scheduled
        Program: the recorded one when the calls repeat a recording call for call and
        the buffer table aliases the same way. The builder starts a new stream either way."""
        try:
            rec = self._following
            buffers = self.buffers()
            if rec is not None:
                if self._at == len(rec.calls) and rec.aliasing == _aliasing(rec.program, buffers):
                    self._recordings.remove(rec)
                    self._recordings.insert(0, rec)
                    self.replays += 1
                    return rec.program
                self._following = None
                self._build_prefix(rec, self._at)
            # the tokens are checked once, by the schedule compile() makes
            stream = self.emitter.finish(check_tokens=False)
            program = self.simulator.compile(stream, buffers, checked=True, verified=not self._explicit)
            if self._calls:
                self._recordings.insert(0, _Recording(self._calls, self._results, program,
                                                      _aliasing(program, buffers)))
                del self._recordings[self.keep:]
            return program
        finally:
            self.drop()

    def drop(self) -> None:
        """Forget the calls of the stream being built (nothing of it runs)."""
        self.emitter = Emitter(self._validate)
        self.tracker.reset()
        self._start()


def _flags(deps) -> dict[str, bool]:
    try:
        mask = operator.index(deps)
    except TypeError:
        raise TypeError(f"deps must be AUTO (-1) or a 4-bit mask of POP_PREV|POP_NEXT|PUSH_PREV|PUSH_NEXT, "
                        f"got {deps!r}") from None
    if 0 <= mask <= 15:
        return _FLAGS[mask]
    raise ValueError(f"deps must be AUTO (-1) or a 4-bit mask of POP_PREV|POP_NEXT|PUSH_PREV|PUSH_NEXT, "
                     f"got {deps}")


def _aliasing(program: Program, buffers: Buffers) -> tuple:
    """Which host slots of the program share memory, and at what byte distance: the only
    facts about addresses the automatic tokens depend on."""
    spans = []
    for slot in sorted(program.signature):
        flat = buffers[slot] if slot < len(buffers) else None
        if flat is None:
            return ("missing", slot)    # the Program's own check names it
        start = flat.__array_interface__["data"][0]
        spans.append((start, start + flat.nbytes, slot))
    spans.sort()
    shared = []
    count = len(spans)
    for k, (start, end, slot) in enumerate(spans):
        # by index: slicing the tail for each span would copy it, quadratic in the slots
        j = k + 1
        while j < count and spans[j][0] < end:
            other_start, _, other = spans[j]
            shared.append((slot, other, other_start - start))
            j += 1
    return tuple(sorted(shared))
