"""Shared timing for the benchmarks: medians of repeated runs (the machines are shared and noisy).

>>> median_time(lambda: sum(range(1000)), repeats=5)    # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence


def median_time(fn: Callable, repeats: int, *, setup: Callable | None = None, warmup: bool = True) -> float:
    """Median wall time of ``fn()`` (or ``fn(setup())``, setup untimed) over ``repeats`` runs,
    after one untimed warm-up run (first calls allocate, JIT-resolve and fault pages in)."""
    call = (lambda: fn(setup())) if setup is not None else fn
    if warmup:
        call()
    times = []
    for _ in range(repeats):
        arg = setup() if setup is not None else None
        start = time.perf_counter()
        fn(arg) if setup is not None else fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_times(fns: Sequence[Callable], repeats: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Median wall time (or time by ``clock``: ``time.process_time`` for this process's CPU
    time) of each function, measured interleaved so that load from other processes hits all
    of them alike."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            start = clock()
            fn()
            out.append(clock() - start)
    return [statistics.median(t) for t in times]
