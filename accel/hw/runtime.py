"""The driver: accel's session and its ``accel.*`` runtime functions, on tirpat's device kit.

Compiled PrimFuncs call ``T.call_packed("accel.load", A, ...)`` etc.; each call appends
one instruction to the current session's stream, and ``accel.sync`` runs the stream on the
simulator. Code the planner made asks ``accel.replay`` first, for each static run of calls: the
session runs the Program it stored for that run on the call's host buffers, in that one callback
(:meth:`tirpat.device.Session.replay`). The instructions and their arguments are declared once, in
:mod:`accel.hw.instructions`, and each function takes the arguments in their declared order;
sessions, the host buffer table, error relay and atomic calls come from
:mod:`tirpat.device`. accel/ISA.md section 7 describes the ABI.

>>> import numpy as np
>>> a = np.arange(256, dtype=np.int32); out = np.zeros(256, np.int32)
>>> with Session() as s:
...     _ = s.load(a, 0, Mem.ACC, 0, 16, rows=16, cols=16, dram_ld=16)
...     _ = s.alu(AluOp.MUL, 0, imm=2, use_imm=True, ext_out=16, dst_stride_out=16)
...     s.dep_push(Queue.COMPUTE, Queue.STORE); s.dep_pop(Queue.COMPUTE, Queue.STORE)
...     _ = s.store(out, 0, 0, 16, rows=16, cols=16, dram_ld=16)
>>> bool((out == 2 * a).all())
True
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import numpy as np

from tirpat import device
from accel.hw import fused, instructions
from accel.hw.config import Config
from accel.hw.emitter import Emitter
from accel.hw.errors import AccelError
from accel.hw.isa import (
    Alu, AluChain, AluOp, Dwmac, Gemm, Instruction, Load, Lut, Mem, Queue, Store, StoreMode, disassemble, encode,
)
from accel.hw.sim import Simulator, one_blas_thread
from accel.hw.stream import AUTO, StreamBuilder
from accel.hw.stats import Stats
from accel.hw.tokens import DependencyTracker

__all__ = [
    "Session", "current_session", "default_session", "POP_PREV", "POP_NEXT", "PUSH_PREV",
    "PUSH_NEXT", "AUTO", "RUNTIME", "ConfigMismatchError", "session_for",
]

#: Streams a session's builder remembers to replay: a call of a compiled model syncs once per
#: offloaded partition call, and a model that keeps its session replays them all next call.
KEPT_STREAMS = 1024

# The ``deps`` bit mask of every accel.* instruction call (the header's bits 4-7), or AUTO:
# let the driver's dependency tracker add the tokens (what compiled code uses).
POP_PREV, POP_NEXT, PUSH_PREV, PUSH_NEXT = 1, 2, 4, 8

HostBuffer = device.buffers.HostBuffer

#: The instruction class each ``accel.<name>`` function emits, by ``<name>``.
_CLASSES = {cls.opcode.name.lower(): cls for cls in (Load, Store, Gemm, Alu, Dwmac, Lut, AluChain)}
_FLAGS = frozenset(("pop_prev", "pop_next", "push_prev", "push_next"))


def _fields(name: str) -> tuple:
    """The fields of the instruction ``accel.<name>`` emits, in its arguments' declared order
    (all but ``deps``, which sets the flags); checked against the instruction class, so the
    operand list is written once."""
    cls, arguments = _CLASSES[name], instructions.FUNCTIONS[f"accel.{name}"][0].arguments
    if arguments[-1] != "deps":
        raise TypeError(f"accel.{name}: deps must be the last argument, got {arguments}")
    fields = tuple(instructions.FIELD_OF.get(a, a) for a in arguments[:-1])
    want = {f.name for f in dataclasses.fields(cls)} - _FLAGS
    if set(fields) != want or len(fields) != len(want):
        raise TypeError(f"accel.{name}'s declared arguments set the fields {sorted(fields)}, but {cls.__name__} "
                        f"has {sorted(want)}")
    return fields


# Instruction class -> the fields its ``values`` tuples hold, in the declared argument order.
_FIELDS = {_CLASSES[name]: _fields(name) for name in _CLASSES}


class ConfigMismatchError(AccelError, ValueError):
    """Code compiled for one :class:`Config` run in a session of another."""


class Session(device.Session):
    """One simulated core: scratchpads, buffer table, the stream being built, and stats.

    As a context manager it becomes the session that ``accel.*`` calls on this thread use,
    and syncs any unfinished stream on a clean exit (an exception discards it). Host
    buffers must stay alive until the sync that runs the instructions using them.
    ``record`` keeps the synced streams for :meth:`stream`: all of them (True), none
    (False), or the last ``n`` (an int; the default sessions keep the last one).

    >>> with Session(Config(acc_bytes=64 * 1024)) as s:
    ...     s.config.acc_elements
    16384
    """

    def __init__(self, config: Optional[Config] = None, *, record: Union[bool, int] = True,
                 timing_only: bool = False) -> None:
        super().__init__()
        if not isinstance(config, (Config, type(None))):
            raise TypeError(f"Session takes an accel.Config, got {type(config).__name__}")
        self.config = config or Config()
        self.simulator = Simulator(self.config)
        self.builder = StreamBuilder(self.simulator,
                                     DependencyTracker(self.config.tile, self.buffers.byte_range),
                                     lambda: self.buffers.views, _FIELDS, keep=KEPT_STREAMS)
        self.timing_only = timing_only
        self.stats = Stats(self.config)
        self._ran = None        # the Program the last sync ran, for stored_stream
        self._options: tuple = (None, None)     # (the Config, its options)
        if record is True or record is False:
            self._streams = deque() if record else None
        elif isinstance(record, int) and record >= 0:
            self._streams = deque(maxlen=record)
        else:
            raise TypeError(f"record must be True, False or a number of streams, got {record!r}")

    def begin_run(self) -> None:
        """A new call of a compiled model that keeps this session: its statistics start from
        zero and the streams recorded for :meth:`stream` are forgotten; the streams the
        builder recorded stay, so that the call's streams are replayed, not built again."""
        self.stats = Stats(self.config)
        if self._streams is not None:
            self._streams.clear()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Held around each call of a compiled model on this session: BLAS on one thread for
        all of the call's streams (:func:`accel.hw.sim.one_blas_thread`), set once and the
        caller's setting restored at its end, instead of set and restored by each stream;
        and what every device session holds (:meth:`tirpat.device.Session.running`: full
        garbage collections deferred while a first call records its streams). At its end the
        simulator lets go of what building plans kept (:func:`accel.hw.fused.drop_building`)
        and binds its plans to their workspace as the call left it (:func:`accel.hw.fused.settle`).

        >>> with Session().running():
        ...     pass
        """
        try:
            with super().running(), one_blas_thread():
                yield
        finally:
            # what building the call's plans kept from stream to stream (a first call's), and
            # the plans built before the workspace last grew bound to its final arrays
            fused.drop_building(self.simulator.workspace)
            fused.settle(self.simulator)

    def buffer(self, host: HostBuffer) -> int:
        """The buffer-table slot of a host buffer, registering it on first use.

        Numpy arrays are kept alive by the session; DLTensors passed by compiled code are
        viewed in place and their slots are released at the end of the stream.

        >>> s = Session(); a = np.zeros((4, 4), np.int8)
        >>> s.buffer(a) == s.buffer(a.reshape(16))      # one slot per memory range
        True
        """
        return self.buffers.slot(host)

    @property
    def options(self) -> Mapping[str, Any]:
        """The backend options this session runs code for: its Config's fields, read-only (code
        that tirpat built for other ones refuses to run here, see
        :meth:`tirpat.device.Runtime.begin`, which asks at the start of every offloaded call:
        they are derived once per Config).

        >>> Session(Config(tile=32)).options["tile"]
        32
        """
        config, options = self._options
        if config is not self.config:
            self._options = config, options = self.config, MappingProxyType(dataclasses.asdict(self.config))
        return options

    # ------------------------------------------------------------------ instructions
    def _emit(self, cls: type[Instruction], values: tuple, deps: int) -> int:
        """Emit ``cls`` built from ``values`` (its fields in ABI order) and flags; the
        :class:`~accel.hw.stream.StreamBuilder` replays a stream it has built before. The
        caller has claimed the stream (a runtime function's wrapper, or the methods below:
        compiled code makes this call once per instruction, so it is not claimed twice)."""
        return self.builder.instruction(cls, values, deps)

    def load(self, host: HostBuffer, elem_offset: int, mem: Union[Mem, int], sram_addr: int,
             sram_ld: int, *, rows: int, cols: int, dram_ld: int, pad_top: int = 0,
             pad_bottom: int = 0, pad_left: int = 0, pad_right: int = 0, pad_value: int = 0,
             deps: int = 0) -> int:
        """Emit a LOAD of ``host`` (see :class:`accel.hw.isa.Load`); returns the stream index."""
        self.claim()
        return _EMIT["load"](self, *_in_order("load", locals()))

    def store(self, host: HostBuffer, elem_offset: int, sram_addr: int, sram_ld: int, *,
              rows: int, cols: int, dram_ld: int, dram_step: int = 1,
              mode: Union[StoreMode, int] = StoreMode.INT32, deps: int = 0) -> int:
        """Emit a STORE into ``host`` (see :class:`accel.hw.isa.Store`); returns the stream index."""
        self.claim()
        return _EMIT["store"](self, *_in_order("store", locals()))

    def gemm(self, acc_addr: int, inp_addr: int, wgt_addr: int, acc_ld: int, inp_ld: int,
             wgt_ld: int, *, reset: bool = False, ext_out: int = 1, ext_in: int = 1,
             acc_stride_out: int = 0, acc_stride_in: int = 0, inp_stride_out: int = 0,
             inp_stride_in: int = 0, wgt_stride_out: int = 0, wgt_stride_in: int = 0,
             deps: int = 0) -> int:
        """Emit a GEMM (see :class:`accel.hw.isa.Gemm`); returns the stream index."""
        self.claim()
        return _EMIT["gemm"](self, *_in_order("gemm", locals()))

    def alu(self, op: Union[AluOp, int], dst_addr: int, *, src_addr: int = 0, imm: int = 0,
            use_imm: bool = False, ext_out: int = 1, ext_in: int = 1, dst_stride_out: int = 0,
            dst_stride_in: int = 0, src_stride_out: int = 0, src_stride_in: int = 0,
            deps: int = 0) -> int:
        """Emit an ALU instruction (see :class:`accel.hw.isa.Alu`); returns the stream index."""
        self.claim()
        return _EMIT["alu"](self, *_in_order("alu", locals()))

    def dwmac(self, acc_addr: int, inp_addr: int, wgt_addr: int, acc_ld: int, inp_ld: int, *,
              ext_out: int = 1, ext_in: int = 1, acc_stride_out: int = 0, acc_stride_in: int = 0,
              inp_stride_out: int = 0, inp_stride_in: int = 0, wgt_stride_out: int = 0,
              wgt_stride_in: int = 0, deps: int = 0) -> int:
        """Emit a DWMAC (see :class:`accel.hw.isa.Dwmac`); returns the stream index."""
        return _EMIT["dwmac"](self, *_in_order("dwmac", locals()))

    def lut(self, dst_addr: int, lut_addr: int, *, ext_out: int = 1, ext_in: int = 1, dst_stride_out: int = 0,
            dst_stride_in: int = 0, deps: int = 0) -> int:
        """Emit a LUT (see :class:`accel.hw.isa.Lut`); returns the stream index."""
        return _EMIT["lut"](self, *_in_order("lut", locals()))

    def alu_chain(self, length: int, code: int, dst_addr: int, *, src_addr: int = 0, imm0: int = 0, imm1: int = 0,
                  imm2: int = 0, imm3: int = 0, imm4: int = 0, imm5: int = 0, ext_out: int = 1, ext_in: int = 1,
                  dst_stride_out: int = 0, dst_stride_in: int = 0, src_stride_out: int = 0,
                  src_stride_in: int = 0, vectors: int = 0, deps: int = 0) -> int:
        """Emit an ALU chain (see :class:`accel.hw.isa.AluChain`; ``**chain_code(steps)`` gives
        ``length``, ``code``, the immediates and ``vectors``); returns the stream index."""
        self.claim()
        return _EMIT["alu_chain"](self, *_in_order("alu_chain", locals()))

    def dep_push(self, src: Union[Queue, int], dst: Union[Queue, int]) -> None:
        """See :meth:`accel.hw.emitter.Emitter.dep_push`."""
        self.claim()
        self.builder.dep_push(Queue(src), Queue(dst))

    def dep_pop(self, src: Union[Queue, int], dst: Union[Queue, int]) -> None:
        """See :meth:`accel.hw.emitter.Emitter.dep_pop`."""
        self.claim()
        self.builder.dep_pop(Queue(src), Queue(dst))

    # ------------------------------------------------------------------ the stream
    @property
    def pending(self) -> int:
        """Calls (instructions, token pushes and pops) made since the last sync."""
        return len(self.builder)

    @property
    def emitter(self) -> Emitter:
        """The emitter of the stream being built (empty while a recorded stream is replayed)."""
        return self.builder.emitter

    def sync(self) -> Stats:
        """Close the pending stream with FINISH, run it, and return the cumulative stats.

        Borrowed (DLTensor) buffer slots are released afterwards, whether or not the
        stream was valid; an invalid stream raises and is discarded unexecuted.

        >>> Session().sync().instructions["FINISH"]
        1
        """
        return super().sync()

    def execute(self) -> Stats:
        """Run the pending stream (called by :meth:`sync`); a timing-only session runs
        the cycle model alone."""
        self._ran = None
        program = self.builder.finish()
        # a stream a static group stores runs again at every later call: its batched plan
        # is made now, so the second call already runs it
        self._run(program, self.buffers.views, self.capturing)
        self._ran = program
        return self.stats

    def stored_stream(self) -> Optional[tuple]:
        """The Program the last sync ran and the host slots it uses: what
        :meth:`~tirpat.device.Session.replay` keeps for a static group of compiled code.

        >>> s = Session(); _ = s.sync()
        >>> program, slots = s.stored_stream(); slots, s.stored_stream()
        ([], None)
        """
        program, self._ran = self._ran, None
        return None if program is None else (program, sorted(program.signature))

    def run_stored(self, program, views) -> Stats:
        """Run ``program`` on the host ``views`` (by slot), as a sync does: its cycles are
        counted in :attr:`stats` and its stream recorded for :meth:`stream`.

        >>> s = Session(); _ = s.sync(); program, _ = s.stored_stream()
        >>> s.run_stored(program, []).instructions["FINISH"], s.disassembly().count("FINISH")
        (2, 2)
        """
        return self._run(program, views, True)

    def prepare_stored(self, program, views: tuple) -> None:
        """``program``'s batched plan bound to ``views`` now, at the call that stores it: the
        next call, its hosts where they were, replays at once (:meth:`accel.hw.sim.Program.prepare`)."""
        program.prepare(views)

    def _run(self, program, views, again: bool) -> Stats:
        program.run(views, self.stats, execute=not self.timing_only, again=again)
        if self._streams is not None:
            self._streams.append(program.stream)
        return self.stats

    def drop(self) -> None:
        """Forget the pending stream (called by :meth:`discard`)."""
        self.builder.drop()

    # ------------------------------------------------------------------ inspection
    def stream(self) -> bytes:
        """The encoded instructions of the recorded synced streams (each ends in FINISH)."""
        return encode(self._recorded())

    def disassembly(self) -> str:
        """:meth:`stream` as text, one instruction per line."""
        return disassemble(self._recorded())

    def _recorded(self) -> list[Instruction]:
        return [ins for stream in self._streams or () for ins in stream]

    def scratchpad(self, mem: Union[Mem, int]) -> np.ndarray:
        """A copy of a scratchpad's contents in its architectural dtype (int8 / int32).

        >>> Session().scratchpad(Mem.INP).dtype
        dtype('int8')
        """
        mem = Mem(mem)
        data = self.simulator.memory(mem)
        return data.astype(np.int32 if mem is Mem.ACC else np.int8)


# ---------------------------------------------------------------------- runtime functions
def _in_order(name: str, given: dict) -> tuple:
    """The arguments of a Session method, in the declared order of ``accel.<name>``'s (its
    parameters are named as the declared arguments: a test checks it)."""
    return tuple(given[a] for a in instructions.FUNCTIONS[f"accel.{name}"][0].arguments)


def _instruction_call(name: str) -> Callable:
    """``run(session, *args)``: emit ``accel.<name>``'s instruction from its arguments, in
    their declared order (the host buffer first, if any, ``deps`` last)."""
    forms = instructions.FUNCTIONS[f"accel.{name}"]
    cls, kinds = _CLASSES[name], {o.name: o.kind for o in forms[0].operands}
    hosts = [k for k, a in enumerate(forms[0].arguments) if kinds.get(a) == "host"]
    host = bool(hosts)
    if hosts not in ([], [0]):
        raise ValueError(f"accel.{name}: the host buffer must be the first argument")

    def run(session: Session, *args) -> int:
        if not host:
            return session._emit(cls, args[:-1], args[-1])
        return session._emit(cls, (session.buffers.slot(args[0]),) + args[1:-1], args[-1])

    run.__name__ = name
    return run


def _default(config: Optional[Config]) -> Session:
    return Session(config, record=1)


#: accel's runtime: the ``accel.*`` TVM global functions and the per-thread sessions.
RUNTIME = device.Runtime("accel", Session, default=_default)
_EMIT: dict = {}
for _name in _CLASSES:
    _EMIT[_name] = _instruction_call(_name)
    RUNTIME.implement(*instructions.FUNCTIONS[f"accel.{_name}"])(_EMIT[_name])
RUNTIME.function(lambda s, src, dst: s.dep_push(src, dst), name="dep_push")
RUNTIME.function(lambda s, src, dst: s.dep_pop(src, dst), name="dep_pop")


def default_session(config: Optional[Config] = None) -> Session:
    """This thread's session for ``accel.*`` calls made outside any ``with Session()``
    (one per Config; each keeps only its last stream for :meth:`Session.stream`).

    >>> default_session() is default_session(Config())
    True
    """
    return RUNTIME.default(None if config is None or config == Config() else config)


def current_session() -> Session:
    """The innermost ``with Session()`` of this thread, else its default session."""
    return RUNTIME.current()


def session_for(config: Config) -> Session:
    """The session code compiled for ``config`` runs in on this thread: the innermost
    ``with Session()`` (which must have that Config), else the default session of ``config``.

    >>> session_for(Config(tile=32)).config.tile
    32
    """
    entered = RUNTIME.entered()
    if entered is None:
        return default_session(config)
    if entered.config != config:
        diff = [f.name for f in dataclasses.fields(Config) if getattr(config, f.name) != getattr(entered.config, f.name)]
        built = ", ".join(f"{n}={getattr(config, n)}" for n in diff)
        here = ", ".join(f"{n}={getattr(entered.config, n)}" for n in diff)
        raise ConfigMismatchError(
            f"this code was compiled for a Config with {built}, but the current session has {here}; "
            f"run it in a Session of its own Config (or outside any session)")
    return entered
