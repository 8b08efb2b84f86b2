"""Host buffers as a device sees them: a table of slots with bounds-checked views.

Instructions name host memory as ``(slot, element offset)``, never as raw pointers: that
makes bounds checks, decoding and dependency tracking well defined. The table keeps one
flat, zero-copy numpy view per slot. Numpy arrays handed to it are kept alive by the
table; tensors that compiled code passes (borrowed DLTensors, whose memory the caller
owns) are *borrowed* and their slots are released by :meth:`BufferTable.release_borrowed`,
which a session calls at the end of every stream.

>>> import numpy as np
>>> table = BufferTable()
>>> a = np.arange(12, dtype=np.int32)
>>> slot = table.slot(a)
>>> table.view(slot, 4, (2, 3)).tolist()          # rows of 3 from element 4
[[4, 5, 6], [7, 8, 9]]
>>> table.slot(a.reshape(3, 4)) == slot         # the same memory: the same slot
True
>>> table.view(slot, 8, (2, 3))
Traceback (most recent call last):
  ...
tirpat.device.buffers.BoundsError: host buffer slot 0: elements [8, 14) are outside its 12 elements
"""

from __future__ import annotations

import ctypes
import math
from typing import Any, Optional, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided
from tvm_ffi import Tensor as _FFITensor

__all__ = ["BufferTable", "BoundsError", "SlotError", "tensor_view", "strided_view", "is_tensor", "host_span",
           "host_spans", "raw_view", "dtype_entry"]

#: A C-contiguous numpy array, or a ``tvm.runtime.Tensor`` (a DLTensor from compiled code).
HostBuffer = Any


_DTYPES: dict = {}     # a tensor's dtype (as TVM names it) -> (itemsize, numpy's dtype string)


def _dtype_key(dtype) -> tuple[int, str]:
    np_dtype = np.dtype(str(dtype))
    _DTYPES[dtype] = found = (np_dtype.itemsize, np_dtype.str)
    return found


def dtype_entry(name: str) -> Optional[tuple[int, str]]:
    """A dtype as TVM names it (``"int8"``) as :func:`host_spans` records it, ``(itemsize,
    numpy's dtype string)``; None for one numpy has no dtype for (a vector dtype, ``"int8x4"``).

    >>> dtype_entry("int32"), dtype_entry("int8x4")
    ((4, '<i4'), None)
    """
    try:
        return _DTYPES.get(name) or _dtype_key(name)
    except TypeError:
        return None


class BoundsError(IndexError):
    """An access reaches outside the host buffer it names."""


class SlotError(LookupError):
    """A slot that is not (or no longer) in the buffer table."""


def is_tensor(host: Any) -> bool:
    """True for a DLTensor-like object (``tvm.runtime.Tensor``): ``data_ptr``, ``shape``, ``dtype``.

    >>> is_tensor(np.zeros(3)), is_tensor([1, 2])
    (False, False)
    """
    return not isinstance(host, np.ndarray) and all(hasattr(host, a) for a in ("data_ptr", "shape", "dtype"))


def tensor_view(t: Any) -> np.ndarray:
    """A flat, zero-copy numpy view of a compact ``tvm.runtime.Tensor``.

    ``np.from_dlpack`` crashes on tensors passed from compiled code; this reads the data
    pointer instead. A tensor with non-compact strides is refused (a flat view would
    misread it).

    >>> import tvm
    >>> t = tvm.runtime.tensor(np.arange(6, dtype=np.int8).reshape(2, 3))
    >>> tensor_view(t).tolist()
    [0, 1, 2, 3, 4, 5]
    """
    shape = tuple(int(d) for d in t.shape)
    strides = getattr(t, "strides", None)
    if strides is not None and int(np.prod(shape)) > 1:
        expected, acc = [], 1
        for d in reversed(shape):
            expected.append(acc)
            acc *= d
        if tuple(int(s) for s in strides) != tuple(reversed(expected)):
            raise ValueError(f"host tensor {shape} with strides {tuple(strides)} is not compact")
    dtype = np.dtype(str(t.dtype))
    count = int(np.prod(shape))
    if count == 0:
        return np.zeros(0, dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(t.data_ptr())
    return np.frombuffer(raw, dtype=dtype)


def host_span(host: HostBuffer) -> tuple[int, int, str]:
    """The memory a host buffer covers: ``(address, bytes, dtype)``, the dtype as numpy
    spells it (``"|i1"``). A tensor with strides covers from its first element to one past
    its last (its strides must not be negative); a numpy array must be C-contiguous.

    >>> a = np.zeros((2, 3), np.int32)
    >>> host_span(a)[1:], host_span(a)[0] == a.__array_interface__["data"][0]
    ((24, '<i4'), True)
    >>> host_span([1])
    Traceback (most recent call last):
      ...
    TypeError: a host buffer must be a numpy array or a tvm.runtime.Tensor, got list
    """
    return host_spans((host,))[0][:3]


def host_spans(hosts: Sequence[HostBuffer], dtypes: Sequence[Optional[tuple[int, str]]] = ()
               ) -> list[tuple[int, int, str, bool]]:
    """Per host buffer, :func:`host_span` and whether it may be written (a read-only numpy
    array may not): what a session's replay compares, a few hosts a stream, a hundred streams
    a model call (a compact tensor, what compiled code passes, is read inline: its element
    count and contiguity in C, its dtype the one costly read, which ``dtypes`` spares: per host,
    the :func:`dtype_entry` of the dtype a tensor is known to have, or None; a numpy array's
    own is cheap, and always read).

    >>> ro = np.zeros(3, np.int8); ro.flags.writeable = False
    >>> [span[1:] for span in host_spans([np.zeros(2, np.float32), ro])]
    [(8, '<f4', True), (3, '|i1', False)]
    >>> import tvm_ffi
    >>> host_spans([tvm_ffi.from_dlpack(np.zeros(2, np.float32))], [(4, "<i4")])[0][1:]   # taken as given
    (8, '<i4', True)
    """
    spans = []
    known = len(dtypes) == len(hosts)
    for i, host in enumerate(hosts):
        if isinstance(host, _FFITensor) and host.is_contiguous():
            given = dtypes[i] if known else None
            if given is None:
                dtype = host.dtype
                given = _DTYPES.get(dtype) or _dtype_key(dtype)
            size, kind = given
            spans.append((host.data_ptr(), host.numel() * size, kind, True))
        elif isinstance(host, np.ndarray):
            if not host.flags.c_contiguous:
                raise ValueError(f"host buffer {host.shape} {host.dtype} is not C-contiguous")
            spans.append((host.__array_interface__["data"][0], host.nbytes, host.dtype.str, host.flags.writeable))
        else:
            spans.append((*_strided_span(host), True))
    return spans


def _strided_span(host: HostBuffer) -> tuple[int, int, str]:
    """:func:`host_span` of a tensor that is no compact ``tvm_ffi`` tensor."""
    try:
        address, shape, dtype = host.data_ptr(), host.shape, host.dtype
    except AttributeError:
        raise TypeError(f"a host buffer must be a numpy array or a tvm.runtime.Tensor, "
                        f"got {type(host).__name__}") from None
    size, kind = _DTYPES.get(dtype) or _dtype_key(dtype)
    strides = getattr(host, "strides", None)
    if strides is None or 0 in shape:
        return address, math.prod(shape) * size, kind
    if any(s < 0 for s in strides):
        raise ValueError(f"host tensor {tuple(shape)} has negative strides {tuple(strides)}")
    return address, (1 + sum((d - 1) * s for d, s in zip(shape, strides))) * size, kind


def raw_view(address: int, nbytes: int, dtype: str) -> np.ndarray:
    """A flat, writable, zero-copy numpy view of ``nbytes`` bytes of memory at ``address``
    as ``dtype`` (the memory must outlive the view: the caller owns it).

    >>> a = np.arange(4, dtype=np.int16)
    >>> raw_view(a.__array_interface__["data"][0] + 2, 4, "<i2").tolist()
    [1, 2]
    """
    dt = np.dtype(dtype)
    if nbytes == 0:
        return np.zeros(0, dt)
    return np.asarray(_Memory(address, nbytes // dt.itemsize, dt.str))


class _Memory:
    """Memory at an address, as numpy's array interface describes it: a view made from it
    costs under a microsecond (a ctypes array type made per call, about five; replay makes
    one per slot of every stored stream it runs)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address: int, count: int, dtype: str) -> None:
        self.__array_interface__ = {"data": (address, False), "shape": (count,), "typestr": dtype, "version": 3}


def strided_view(flat: np.ndarray, offset: int, shape: Sequence[int], strides: Optional[Sequence[int]] = None,
                 *, what: str = "buffer") -> np.ndarray:
    """A view of ``flat`` at element ``offset`` with ``shape`` and element ``strides``
    (row-major when omitted), after checking that every element it reaches is inside.

    Raises :class:`BoundsError` naming ``what`` and the element range otherwise; strides
    may be zero or negative.

    >>> strided_view(np.arange(10), 1, (2, 2), (4, 1)).tolist()
    [[1, 2], [5, 6]]
    >>> strided_view(np.arange(10), 9, (2,), what="slot 3")
    Traceback (most recent call last):
      ...
    tirpat.device.buffers.BoundsError: slot 3: elements [9, 11) are outside its 10 elements
    """
    shape = tuple(int(e) for e in shape)
    if strides is None:
        strides, acc = [], 1
        for e in reversed(shape):
            strides.append(acc)
            acc *= e
        strides = strides[::-1]
    strides = tuple(int(s) for s in strides)
    if len(strides) != len(shape):
        raise ValueError(f"{what}: {len(shape)} extents but {len(strides)} strides")
    if any(e < 0 for e in shape):
        raise ValueError(f"{what}: negative extent in {shape}")
    if 0 in shape:
        return flat[:0].reshape(shape)
    lo = offset + sum(min(0, s) * (e - 1) for s, e in zip(strides, shape))
    hi = offset + sum(max(0, s) * (e - 1) for s, e in zip(strides, shape)) + 1
    if lo < 0 or hi > flat.size:
        raise BoundsError(f"{what}: elements [{lo}, {hi}) are outside its {flat.size} elements")
    item = flat.itemsize
    return as_strided(flat[offset:], shape=shape, strides=tuple(s * item for s in strides),
                      writeable=flat.flags.writeable)


class BufferTable:
    """Host buffers by slot, each as a flat zero-copy numpy view (see the module doc).

    ``views`` is the list a device's validator and executor index by slot (``None`` for
    a free slot). A slot is found again from the memory it covers, ``(address, bytes,
    dtype)``, so two numpy views of the same memory with different shapes share a slot;
    views that overlap only in part get different slots, and :meth:`byte_range` tells a
    dependency tracker which memory each touches.

    >>> table = BufferTable(); b = np.zeros(4, np.int8)
    >>> table.slot(b), len(table)
    (0, 1)
    """

    def __init__(self) -> None:
        self.views: list[Optional[np.ndarray]] = []
        self._address: list[int] = []
        self._keys: dict[tuple, int] = {}
        self._key_of: dict[int, tuple] = {}
        self._owned: dict[int, np.ndarray] = {}   # slot -> the numpy array it keeps alive
        self._borrowed: list[int] = []
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self.views)

    def slot(self, host: HostBuffer) -> int:
        """The slot of ``host``, registering it on first use.

        ``host`` is a C-contiguous numpy array (kept alive by the table) or a compact
        ``tvm.runtime.Tensor`` (borrowed until :meth:`release_borrowed`). Anything else is a
        ``TypeError`` naming what was given.

        >>> BufferTable().slot([1, 2, 3])
        Traceback (most recent call last):
          ...
        TypeError: a host buffer must be a numpy array or a tvm.runtime.Tensor, got list
        """
        if isinstance(host, np.ndarray):
            address = host.__array_interface__["data"][0]
            key = (address, host.nbytes, host.dtype.str)
            slot = self._keys.get(key)
            if slot is None:
                if not host.flags.c_contiguous:
                    raise ValueError(f"host buffer {host.shape} {host.dtype} is not C-contiguous")
                slot = self._add(key, host.reshape(-1), address)
                self._owned[slot] = host
            return slot
        try:
            # compiled code passes the same tensors call after call, one per instruction:
            # keep this path cheap (numel, not the shape's tuple)
            address, count, dtype = host.data_ptr(), host.numel(), host.dtype
        except AttributeError:
            try:        # a tensor-like with a shape but no numel
                address, count, dtype = host.data_ptr(), math.prod(host.shape), host.dtype
            except AttributeError:
                raise TypeError(f"a host buffer must be a numpy array or a tvm.runtime.Tensor, "
                                f"got {type(host).__name__}") from None
        size, kind = _DTYPES.get(dtype) or _dtype_key(dtype)
        key = (address, count * size, kind)
        slot = self._keys.get(key)
        if slot is None:
            slot = self._add(key, tensor_view(host), address)
            self._borrowed.append(slot)
        return slot

    def _add(self, key: tuple, flat: np.ndarray, address: int) -> int:
        if self._free:
            slot = self._free.pop()
            self.views[slot] = flat
            self._address[slot] = address
        else:
            slot = len(self.views)
            self.views.append(flat)
            self._address.append(address)
        self._keys[key] = slot
        self._key_of[slot] = key
        return slot

    def __getitem__(self, slot: int) -> np.ndarray:
        """The flat view of ``slot``; a :class:`SlotError` for a slot not in the table."""
        flat = self.views[slot] if 0 <= slot < len(self.views) else None
        if flat is None:
            raise SlotError(f"buffer slot {slot} is not in the buffer table ({len(self.views)} slots)")
        return flat

    def view(self, slot: int, offset: int, shape: Sequence[int], strides: Optional[Sequence[int]] = None,
             *, write: bool = False) -> np.ndarray:
        """A bounds-checked view of ``slot`` (see :func:`strided_view`); ``write=True``
        also requires the host buffer to be writable.

        >>> t = BufferTable(); ro = np.zeros(4); ro.flags.writeable = False
        >>> t.view(t.slot(ro), 0, (4,), write=True)
        Traceback (most recent call last):
          ...
        ValueError: host buffer slot 0 is read-only
        """
        flat = self[slot]
        if write and not flat.flags.writeable:
            raise ValueError(f"host buffer slot {slot} is read-only")
        return strided_view(flat, offset, shape, strides, what=f"host buffer slot {slot}")

    def byte_range(self, slot: int, lo: int, hi: int) -> tuple[int, int]:
        """The host addresses ``[start, end)`` of elements ``[lo, hi)`` of ``slot``: what a
        dependency tracker compares, so aliasing slots are ordered by the memory they cover.

        >>> t = BufferTable(); a = np.zeros(8, np.int32)
        >>> s0, s1 = t.slot(a), t.slot(a[4:])
        >>> t.byte_range(s0, 4, 8) == t.byte_range(s1, 0, 4)
        True
        """
        item = self[slot].itemsize
        base = self._address[slot]
        return base + lo * item, base + hi * item

    def release_borrowed(self) -> None:
        """Free the slots of borrowed tensors (their memory may be gone after the call)."""
        if not self._borrowed:      # a replayed stream borrows none
            return
        for slot in self._borrowed:
            del self._keys[self._key_of.pop(slot)]
            self.views[slot] = None
            self._free.append(slot)
        self._borrowed.clear()
        # Lowest slot first: a compiled call that registers its tensors in the same order
        # every time gets the same slots every time (a device can then replay its stream).
        self._free.sort(reverse=True)
