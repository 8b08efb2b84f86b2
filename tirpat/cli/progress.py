"""Progress on a terminal, silence in a pipe: what a long ``tirpat`` command shows while it works.

A :class:`Progress` draws on stderr with `rich <https://rich.readthedocs.io>`_ when stderr is
a terminal: a spinner, the current step, a detail (the TVM pass running, the trial being
measured) and the elapsed time; steps that finish stay on screen with their time. When
stderr is not a terminal (a pipe, a file, CI) it draws nothing at all.

>>> with Progress(enabled=False) as progress:
...     with progress.step("reading model.onnx"):
...         pass
...     advance = progress.bar("tuning", total=4)
...     advance(4)
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Iterator

import tvm

__all__ = ["Progress", "pass_names"]


class Progress:
    """Steps and bars on stderr, drawn only on a terminal (``enabled=None`` decides so)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._live = None
        self._terminal = None
        self._task = None

    def __enter__(self) -> "Progress":
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as Live, SpinnerColumn, TextColumn

            # A terminal of its own (a copy of fd 2): the display stays visible while a block
            # captures fd 2 (tirpat.model.tvm_noise).
            self._terminal = os.fdopen(os.dup(sys.stderr.fileno()), "w")
            self._live = Live(SpinnerColumn(finished_text="[green]done"), TextColumn("{task.description}"),
                              BarColumn(bar_width=20), TextColumn("{task.fields[count]}"),
                              TextColumn("[dim]{task.fields[detail]}"), TextColumn("{task.elapsed:.1f} s"),
                              console=Console(file=self._terminal), redirect_stderr=False)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
            self._terminal.close()

    @contextlib.contextmanager
    def step(self, description: str) -> Iterator[None]:
        """Show ``description`` with a spinner while the block runs."""
        if self._live is None:
            yield
            return
        task = self._live.add_task(description, total=None, detail="", count="")
        previous, self._task = self._task, task
        try:
            yield
        finally:
            self._task = previous
            self._live.update(task, total=1, completed=1, detail="")

    def detail(self, text: str) -> None:
        """Say what the current step is doing now (cheap: call it as often as you like)."""
        if self._live is not None and self._task is not None:
            self._live.update(self._task, detail=text)

    def bar(self, description: str, total: int) -> Callable[[int], None]:
        """A bar of ``total`` units; returns ``advance(n=1)``."""
        if self._live is None:
            return lambda n=1: None
        task = self._live.add_task(description, total=total, detail="", count=f"0/{total}")
        done = 0

        def advance(n: int = 1) -> None:
            nonlocal done
            done += n
            self._live.update(task, completed=done, count=f"{done}/{total}")

        return advance


@contextlib.contextmanager
def pass_names(progress: Progress) -> Iterator[None]:
    """Report each TVM pass that runs inside the block as the progress detail.

    A ``tvm.instrument`` on the current ``PassContext``, which ``tvm.compile`` uses.
    """
    if not progress.enabled:
        yield
        return

    @tvm.instrument.pass_instrument
    class _ShowPass:
        def run_before_pass(self, mod, info) -> None:
            progress.detail(info.name)

    current = tvm.transform.PassContext.current()
    with tvm.transform.PassContext(opt_level=current.opt_level, required_pass=list(current.required_pass),
                                   disabled_pass=list(current.disabled_pass), config=dict(current.config),
                                   instruments=[*current.instruments, _ShowPass()]):
        yield
