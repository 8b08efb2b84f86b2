"""The driver: sessions, the host buffer table, and the ``accel.*`` TVM global functions.

Compiled PrimFuncs call ``T.call_packed("accel.load", A, ...)`` etc.; each call appends
one instruction to the current session's stream, and ``accel.sync`` runs the stream on the
simulator. Host buffers are used in place: the table holds zero-copy numpy views of them,
addressed by slot. accel/ISA.md lists every function and argument.

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

import ctypes
import threading
from typing import Any, Optional, Union

import numpy as np

from accel.hw.config import Config
from accel.hw.tokens import DependencyTracker
from accel.hw.emitter import Emitter
from accel.hw.isa import (
    Alu, AluOp, Gemm, Instruction, Load, Mem, Queue, Store, StoreMode, disassemble, encode, make,
)
from accel.hw.sim import Simulator
from accel.hw.stats import Stats

__all__ = [
    "Session", "current_session", "default_session", "POP_PREV", "POP_NEXT", "PUSH_PREV",
    "PUSH_NEXT", "AUTO", "GLOBAL_FUNCTIONS", "take_error",
]

# The ``deps`` bit mask of every accel.* instruction call (the header's bits 4-7), or AUTO:
# let the driver's dependency tracker add the tokens (what compiled code uses).
POP_PREV, POP_NEXT, PUSH_PREV, PUSH_NEXT = 1, 2, 4, 8
AUTO = -1

HostBuffer = Any  # a C-contiguous numpy array or a tvm.runtime.Tensor (DLTensor)


# Field order of the ``values`` tuples the runtime builds (the ABI's argument order).
_ARGS = {
    Load: ("mem", "sram_addr", "sram_ld", "slot", "dram_offset", "dram_ld", "rows", "cols",
           "pad_top", "pad_bottom", "pad_left", "pad_right", "pad_value"),
    Store: ("sram_addr", "sram_ld", "slot", "dram_offset", "dram_ld", "rows", "cols", "mode"),
    Gemm: ("reset", "acc_addr", "inp_addr", "wgt_addr", "acc_ld", "inp_ld", "wgt_ld", "ext_out",
           "ext_in", "acc_stride_out", "acc_stride_in", "inp_stride_out", "inp_stride_in",
           "wgt_stride_out", "wgt_stride_in"),
    Alu: ("op", "use_imm", "dst_addr", "src_addr", "imm", "ext_out", "ext_in", "dst_stride_out",
          "dst_stride_in", "src_stride_out", "src_stride_in"),
}
_CACHE_LIMIT = 1 << 16

_FLAGS = [{"pop_prev": bool(d & 1), "pop_next": bool(d & 2), "push_prev": bool(d & 4),
           "push_next": bool(d & 8)} for d in range(16)]


def _flags(deps: int) -> dict[str, bool]:
    if 0 <= deps <= 15:
        return _FLAGS[deps]
    raise ValueError(f"deps must be a 4-bit mask of POP_PREV|POP_NEXT|PUSH_PREV|PUSH_NEXT, got {deps}")


class Session:
    """One simulated core: scratchpads, buffer table, the stream being built, and stats.

    As a context manager it becomes the session that ``accel.*`` calls use, and syncs any
    unfinished stream on a clean exit (an exception discards it). Host buffers must stay
    alive until the sync that runs the instructions using them.

    >>> with Session(Config(acc_bytes=64 * 1024)) as s:
    ...     s.config.acc_elements
    16384
    """

    def __init__(self, config: Optional[Config] = None, *, record: bool = True) -> None:
        self.config = config or Config()
        self.simulator = Simulator(self.config)
        self.emitter = Emitter(self._validate)
        self.deps = DependencyTracker(self.config.tile)
        self.stats = Stats(self.config)
        self.record = record
        self._recorded: list[Instruction] = []
        self._table: list[Optional[np.ndarray]] = []
        self._owned: dict[int, Any] = {}  # slot -> the numpy array it keeps alive
        self._slots: dict[tuple, int] = {}
        self._borrowed: list[tuple] = []  # keys of DLTensor views, dropped at sync
        self._free: list[int] = []
        self._cache: dict[tuple, Instruction] = {}

    def _validate(self, index: int, ins: Instruction) -> None:
        self.simulator.check(index, ins, self._table)

    # ------------------------------------------------------------------ buffer table
    def buffer(self, host: HostBuffer) -> int:
        """The buffer-table slot of a host buffer, registering it on first use.

        Numpy arrays are kept alive by the session; DLTensors passed by compiled code are
        viewed in place and their slots are released at the next sync.

        >>> s = Session(); a = np.zeros((4, 4), np.int8)
        >>> s.buffer(a) == s.buffer(a)
        True
        """
        if isinstance(host, np.ndarray):
            key = (host.__array_interface__["data"][0], host.shape, host.dtype.str)
            slot = self._slots.get(key)
            if slot is None:
                if not host.flags.c_contiguous:
                    raise ValueError(f"host buffer {host.shape} {host.dtype} is not C-contiguous")
                slot = self._add(key, host.reshape(-1))
                self._owned[slot] = host
            return slot
        key = (host.data_ptr(), tuple(host.shape), str(host.dtype))
        slot = self._slots.get(key)
        if slot is None:
            slot = self._add(key, _view_tensor(host))
            self._borrowed.append(key)
        return slot

    def _add(self, key: tuple, flat: np.ndarray) -> int:
        if self._free:
            slot = self._free.pop()
            self._table[slot] = flat
        else:
            slot = len(self._table)
            self._table.append(flat)
        self._slots[key] = slot
        return slot

    # ------------------------------------------------------------------ instructions
    def _emit(self, cls: type[Instruction], values: tuple, deps: int) -> int:
        """Emit ``cls`` built from ``values`` (its fields in ``_ARGS[cls]`` order) and flags.

        Compiled loops repeat the same calls, so validated instructions are cached by their
        fields until the next sync (when slots may be reassigned); a hit allocates nothing.
        """
        key = (cls, deps, values)
        ins = self._cache.get(key)
        validated = ins is not None
        if ins is None:
            fields = dict(zip(_ARGS[cls], values))
            fields.update(_flags(0 if deps == AUTO else deps))
            ins = make(cls, fields)
        if deps == AUTO:
            if not validated:
                self._validate(len(self.emitter), ins)
            index = self.emitter.emit(self.deps.order(self.emitter, ins), validated=True)
            self.deps.record(ins, index)
        else:
            index = self.emitter.emit(ins, validated=validated)
        if not validated:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = ins
        return index

    def load(self, host: HostBuffer, elem_offset: int, mem: Union[Mem, int], sram_addr: int,
             sram_ld: int, *, rows: int, cols: int, dram_ld: int, pad_top: int = 0,
             pad_bottom: int = 0, pad_left: int = 0, pad_right: int = 0, pad_value: int = 0,
             deps: int = 0) -> int:
        """Emit a LOAD of ``host`` (see :class:`accel.hw.isa.Load`); returns the stream index."""
        return self._emit(Load, (mem, sram_addr, sram_ld, self.buffer(host), elem_offset, dram_ld,
                                 rows, cols, pad_top, pad_bottom, pad_left, pad_right,
                                 pad_value), deps)

    def store(self, host: HostBuffer, elem_offset: int, sram_addr: int, sram_ld: int, *,
              rows: int, cols: int, dram_ld: int, mode: Union[StoreMode, int] = StoreMode.INT32,
              deps: int = 0) -> int:
        """Emit a STORE into ``host`` (see :class:`accel.hw.isa.Store`); returns the stream index."""
        return self._emit(Store, (sram_addr, sram_ld, self.buffer(host), elem_offset, dram_ld,
                                  rows, cols, mode), deps)

    def gemm(self, acc_addr: int, inp_addr: int, wgt_addr: int, acc_ld: int, inp_ld: int,
             wgt_ld: int, *, reset: bool = False, ext_out: int = 1, ext_in: int = 1,
             acc_stride_out: int = 0, acc_stride_in: int = 0, inp_stride_out: int = 0,
             inp_stride_in: int = 0, wgt_stride_out: int = 0, wgt_stride_in: int = 0,
             deps: int = 0) -> int:
        """Emit a GEMM (see :class:`accel.hw.isa.Gemm`); returns the stream index."""
        return self._emit(Gemm, (reset, acc_addr, inp_addr, wgt_addr, acc_ld, inp_ld, wgt_ld,
                                 ext_out, ext_in, acc_stride_out, acc_stride_in, inp_stride_out,
                                 inp_stride_in, wgt_stride_out, wgt_stride_in), deps)

    def alu(self, op: Union[AluOp, int], dst_addr: int, *, src_addr: int = 0, imm: int = 0,
            use_imm: bool = False, ext_out: int = 1, ext_in: int = 1, dst_stride_out: int = 0,
            dst_stride_in: int = 0, src_stride_out: int = 0, src_stride_in: int = 0,
            deps: int = 0) -> int:
        """Emit an ALU instruction (see :class:`accel.hw.isa.Alu`); returns the stream index."""
        return self._emit(Alu, (op, use_imm, dst_addr, src_addr, imm, ext_out, ext_in,
                                dst_stride_out, dst_stride_in, src_stride_out, src_stride_in), deps)

    def dep_push(self, src: Union[Queue, int], dst: Union[Queue, int]) -> None:
        """See :meth:`accel.hw.emitter.Emitter.dep_push`."""
        self.emitter.dep_push(Queue(src), Queue(dst))

    def dep_pop(self, src: Union[Queue, int], dst: Union[Queue, int]) -> None:
        """See :meth:`accel.hw.emitter.Emitter.dep_pop`."""
        self.emitter.dep_pop(Queue(src), Queue(dst))

    def sync(self) -> Stats:
        """Close the pending stream with FINISH, run it, and return the cumulative stats.

        Borrowed (DLTensor) buffer slots are released afterwards, whether or not the
        stream was valid; an invalid stream raises and is discarded unexecuted.

        >>> Session().sync().instructions["FINISH"]
        1
        """
        try:
            stream = self.emitter.finish()
            self.simulator.run(stream, self._table, self.stats, verified=True)
            if self.record:
                self._recorded.extend(stream)
        finally:
            self._cache.clear()
            self.deps.reset()
            for key in self._borrowed:
                slot = self._slots.pop(key)
                self._table[slot] = None
                self._free.append(slot)
            self._borrowed.clear()
        return self.stats

    def discard(self) -> None:
        """Drop the pending (unsynced) instructions."""
        self.emitter = Emitter(self._validate)
        self.deps.reset()
        self._cache.clear()

    # ------------------------------------------------------------------ inspection
    def stream(self) -> bytes:
        """The encoded instructions of every synced stream so far (each ends in FINISH)."""
        return encode(self._recorded)

    def disassembly(self) -> str:
        """:meth:`stream` as text, one instruction per line."""
        return disassemble(self._recorded)

    def scratchpad(self, mem: Union[Mem, int]) -> np.ndarray:
        """A copy of a scratchpad's contents in its architectural dtype (int8 / int32).

        >>> Session().scratchpad(Mem.INP).dtype
        dtype('int8')
        """
        mem = Mem(mem)
        data = self.simulator.memory(mem)
        return data.astype(np.int32 if mem is Mem.ACC else np.int8)

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "Session":
        _local_stack().append(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        stack = _local_stack()
        stack.remove(self)
        if exc_type is not None:
            self.discard()
        elif len(self.emitter):
            self.sync()


def _view_tensor(t: Any) -> np.ndarray:
    """A flat zero-copy numpy view of a borrowed DLTensor (``np.from_dlpack`` crashes on those)."""
    strides = t.strides
    shape = tuple(int(d) for d in t.shape)
    if strides is not None:
        expected, acc = [], 1
        for d in reversed(shape):
            expected.append(acc)
            acc *= d
        if tuple(strides) != tuple(reversed(expected)) and int(np.prod(shape)) > 1:
            raise ValueError(f"host tensor {shape} with strides {tuple(strides)} is not compact")
    dtype = np.dtype(str(t.dtype))
    count = int(np.prod(shape))
    if count == 0:
        return np.zeros(0, dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(t.data_ptr())
    return np.frombuffer(raw, dtype=dtype)


_state = threading.local()
_default: Optional[Session] = None


def _local_stack() -> list[Session]:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    return stack


def default_session() -> Session:
    """The session used by ``accel.*`` calls made outside any ``with Session()``.

    >>> default_session() is default_session()
    True
    """
    global _default
    if _default is None:
        _default = Session()
    return _default


def current_session() -> Session:
    """The innermost active ``with Session()`` of this thread, else the default session."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else default_session()


# ---------------------------------------------------------------------- TVM global functions
# Positional twins of the Session methods: what compiled code calls through T.call_packed.

def _abi_load(host, elem_offset, mem, sram_addr, sram_ld, rows, cols, dram_ld, pad_top,
              pad_bottom, pad_left, pad_right, pad_value, deps):
    s = current_session()
    s._emit(Load, (mem, sram_addr, sram_ld, s.buffer(host), elem_offset, dram_ld, rows, cols,
                   pad_top, pad_bottom, pad_left, pad_right, pad_value), deps)


def _abi_store(host, elem_offset, sram_addr, sram_ld, rows, cols, dram_ld, mode, deps):
    s = current_session()
    s._emit(Store, (sram_addr, sram_ld, s.buffer(host), elem_offset, dram_ld, rows, cols, mode),
            deps)


def _abi_gemm(reset, acc_addr, inp_addr, wgt_addr, acc_ld, inp_ld, wgt_ld, ext_out, ext_in,
              acc_stride_out, acc_stride_in, inp_stride_out, inp_stride_in, wgt_stride_out,
              wgt_stride_in, deps):
    current_session()._emit(Gemm, (reset, acc_addr, inp_addr, wgt_addr, acc_ld, inp_ld, wgt_ld,
                                   ext_out, ext_in, acc_stride_out, acc_stride_in,
                                   inp_stride_out, inp_stride_in, wgt_stride_out,
                                   wgt_stride_in), deps)


def _abi_alu(op, use_imm, dst_addr, src_addr, imm, ext_out, ext_in, dst_stride_out,
             dst_stride_in, src_stride_out, src_stride_in, deps):
    current_session()._emit(Alu, (op, use_imm, dst_addr, src_addr, imm, ext_out, ext_in,
                                  dst_stride_out, dst_stride_in, src_stride_out, src_stride_in),
                            deps)


def _abi_dep_push(src, dst):
    current_session().dep_push(src, dst)


def _abi_dep_pop(src, dst):
    current_session().dep_pop(src, dst)


def _abi_sync():
    current_session().sync()


def _keep_error(fn):
    """Remember an exception raised inside an ``accel.*`` call: crossing TVM's FFI turns it
    into a RuntimeError, and :func:`take_error` lets the caller re-raise the original."""

    def call(*args):
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - re-raised unchanged
            _state.error = err
            raise

    call.__name__ = fn.__name__
    return call


def take_error() -> Optional[BaseException]:
    """The exception the last failing ``accel.*`` call of this thread raised (then forgotten)."""
    err = getattr(_state, "error", None)
    _state.error = None
    return err


GLOBAL_FUNCTIONS = {
    "accel.load": _abi_load, "accel.store": _abi_store, "accel.gemm": _abi_gemm,
    "accel.alu": _abi_alu, "accel.dep_push": _abi_dep_push, "accel.dep_pop": _abi_dep_pop,
    "accel.sync": _abi_sync,
}


def _register() -> None:
    import tvm

    for name, fn in GLOBAL_FUNCTIONS.items():
        tvm.register_global_func(name, _keep_error(fn), override=True)


_register()
