"""A device memory, declared once: its storage scope, element type, capacity, alignment and
buffering policy, and the one allocation rule every layer asks (Exo's ``Memory``).

The scratchpad planner lays buffers out by :meth:`Memory.footprint`, and a scheduler that
sizes its blocks to fit asks the same method, so the two cannot disagree: a buffer takes
its elements rounded up to ``align``, twice when the loops around its allocation run more
than once and the memory double-buffers (the next tile's transfer then overlaps the
current tile's compute).

``capacity`` and ``align`` may depend on a backend's options: an int, the name of an
option, or a callable ``options -> int``; :meth:`Memory.bind` resolves them.

>>> VRF = Memory("VRF", "local.doc_vrf", "int8", capacity=lambda o: o["regs"] * o["lanes"], align="lanes",
...              double_buffer=False)
>>> VRF.bind({"regs": 4, "lanes": 16}).capacity, VRF.footprint(20, repeated=True, options={"lanes": 16})
(64, 32)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
from tvm import tirx

__all__ = ["Memory", "Size"]

#: A size in elements: a number, the name of a backend option, or ``options -> number``.
Size = Union[int, str, Callable[[Mapping[str, Any]], int]]


@dataclass(frozen=True)
class Memory:
    """An on-chip memory holding the buffers of one storage ``scope`` (see the module doc).

    ``name`` is what messages call it; ``capacity`` and ``align`` (every buffer starts at a
    multiple of it) count elements of ``dtype``; ``double_buffer`` gives a buffer allocated
    in a loop that runs more than once two copies used on alternate iterations.

    >>> ACC = Memory("ACC", "local.doc_acc", "int32", capacity=32768, align=16)
    >>> ACC.itemsize, ACC.footprint((3, 5), repeated=False), ACC.footprint((3, 5), repeated=True)
    (4, 16, 32)
    """

    name: str
    scope: str
    dtype: str = "int8"
    capacity: Size = 0
    align: Size = 1
    double_buffer: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Memory: the name must be a non-empty string, got {self.name!r}")
        kind, _, tag = self.scope.partition(".") if isinstance(self.scope, str) else ("", "", "")
        if kind not in ("local", "global") or not tag:
            # TVM accepts only "local.<tag>" and "global.<tag>" for a storage scope of its own
            raise ValueError(f"Memory {self.name}: the scope must be 'local.<tag>' or 'global.<tag>', "
                             f"got {self.scope!r}")
        np.dtype(self.dtype)      # a clear TypeError for a dtype numpy does not know
        for field, value in (("capacity", self.capacity), ("align", self.align)):
            if not (isinstance(value, (int, str)) or callable(value)) or isinstance(value, bool):
                raise TypeError(f"Memory {self.name}: {field} must be an int, an option name or a callable "
                                f"options -> int, got {value!r}")

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return np.dtype(self.dtype).itemsize

    def _resolve(self, field: str, options: Optional[Mapping[str, Any]]) -> int:
        value = getattr(self, field)
        if isinstance(value, int):
            return value
        if options is None:
            raise ValueError(f"Memory {self.name}: its {field} depends on the backend's options; pass options=")
        if isinstance(value, str):
            if value not in options:
                raise KeyError(f"Memory {self.name}: its {field} is the option {value!r}, which the options "
                               f"{sorted(options)} do not have")
            value = options[value]
        else:
            value = value(options)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < (field == "align"):
            raise ValueError(f"Memory {self.name}: {field} resolves to {value!r}; it must be an int "
                             f"{'>= 1' if field == 'align' else '>= 0'}")
        return int(value)

    def capacity_of(self, options: Optional[Mapping[str, Any]] = None) -> int:
        """The capacity in elements for the backend ``options``.

        >>> Memory("INP", "local.doc_inp", capacity="inp_elements").capacity_of({"inp_elements": 4096})
        4096
        """
        return self._resolve("capacity", options)

    def align_of(self, options: Optional[Mapping[str, Any]] = None) -> int:
        """The allocation granule in elements for the backend ``options``."""
        return self._resolve("align", options)

    def bind(self, options: Optional[Mapping[str, Any]]) -> "Memory":
        """This memory with ``capacity`` and ``align`` resolved for ``options`` (plain ints)."""
        return replace(self, capacity=self.capacity_of(options), align=self.align_of(options))

    def copies(self, *, repeated: bool) -> int:
        """How many copies of a buffer this memory holds: 2 for one allocated in a loop that
        runs more than once when it double-buffers, else 1."""
        return 2 if repeated and self.double_buffer else 1

    def footprint(self, size: Union[int, Sequence[int]], *, repeated: bool,
                  options: Optional[Mapping[str, Any]] = None) -> int:
        """The elements a buffer of ``size`` elements (or of that shape) occupies here: rounded
        up to the alignment, times :meth:`copies`. ``repeated``: the loops around its
        allocation run more than once. The planner allocates exactly this."""
        n = size if isinstance(size, (int, np.integer)) else int(np.prod(list(size), dtype=np.int64))
        if n < 0:
            raise ValueError(f"Memory {self.name}: a buffer of {n} elements")
        align = self.align_of(options)
        return self.copies(repeated=repeated) * (-(-int(n) // align) * align)

    def buffer(self, shape: Sequence[int], name: str = "buf", strides: Optional[Sequence[int]] = None) -> tirx.Buffer:
        """A TIR buffer of ``shape`` in this memory's scope and dtype.

        >>> Memory("VRF", "local.doc_vrf2").buffer((16,), "r").scope()
        'local.doc_vrf2'
        """
        return tirx.decl_buffer(tuple(shape), self.dtype, name, strides=strides, scope=self.scope)
