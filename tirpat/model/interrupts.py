"""An interrupt (Ctrl-C) during a compile stays an interrupt.

Much of a build runs as Python called back from TVM's C++ (its passes, a backend's schedule):
a ``KeyboardInterrupt`` raised there comes back out of the FFI call as a ``RuntimeError``, often
with an empty message, and a step that falls back when a backend fails (a partition then runs
on the host) would take it for one: a build interrupted at the wrong moment finished, exit 0,
with layers silently on the CPU. :func:`interrupts_kept` notes that SIGINT arrived, so that the
build raises ``KeyboardInterrupt`` whatever became of the one Python raised.

>>> import signal
>>> try:
...     with interrupts_kept():
...         try:
...             signal.raise_signal(signal.SIGINT)
...         except KeyboardInterrupt:
...             raise RuntimeError("")      # what it becomes through TVM's FFI
... except KeyboardInterrupt:
...     print("interrupted")
interrupted
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["interrupts_kept"]


@contextlib.contextmanager
def interrupts_kept() -> Iterator[None]:
    """Inside, SIGINT raises ``KeyboardInterrupt`` as Python's default handler does, and is
    noted: the block then ends in ``KeyboardInterrupt``, whether it returned or raised anything
    else. Only on the main thread with Python's default handler installed (another thread
    cannot set a handler, and a program that installed its own keeps it)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    seen: list[int] = []

    def noted(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, noted)
    try:
        yield
    except BaseException:
        if seen:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if seen:
        raise KeyboardInterrupt
