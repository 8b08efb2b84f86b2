"""The device kit: what every backend's runtime needs, with nothing of any one backend.

- :mod:`~tirpat.device.buffers`: the host buffer table (slots, zero-copy views,
  bounds-checked strided views, byte ranges for aliasing), ``tensor_view``;
- :mod:`~tirpat.device.session`: sessions (per-thread current and default sessions,
  one owner per pending stream), runtime functions registered under a backend's prefix
  with error relay, and atomic calls (:func:`invoke`);
- :mod:`~tirpat.device.planner`: scratchpad-address planning for a backend's storage
  scopes, with double buffering and sync insertion.

>>> from tirpat import device
>>> sorted(device.__all__)[:4]
['BoundsError', 'BufferTable', 'PlanError', 'Runtime']
"""

from .buffers import BoundsError, BufferTable, SlotError, is_tensor, strided_view, tensor_view
from .planner import PlanError, Scratchpad, ScratchpadOverflow, ScratchpadPlanner
from .session import Runtime, Session, invoke, runtimes

__all__ = [
    "BoundsError", "BufferTable", "PlanError", "Runtime", "Scratchpad", "ScratchpadOverflow",
    "ScratchpadPlanner", "Session", "SlotError", "invoke", "is_tensor", "runtimes", "strided_view",
    "tensor_view",
]
