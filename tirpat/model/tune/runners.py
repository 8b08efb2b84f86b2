"""meta_schedule's builder and runners for backend partitions.

- :class:`Builder` packs each candidate with its task's reference into an artifact
  (:mod:`tirpat.model.tune.artifact`; the measuring side compiles it): which task a
  candidate belongs to is looked up in the :class:`Candidates` table the search strategy
  fills (meta_schedule's builder inputs carry only the module).
- :class:`LocalRunner` measures artifacts in this process.
- :func:`rpc_runner` measures them on RPC servers through meta_schedule's own
  ``RPCRunner`` (see :mod:`tirpat.model.tune.rpc`).

>>> builder = Builder(candidates, workdir)            # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
from typing import Callable

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

from . import artifact

__all__ = ["Candidates", "Builder", "LocalRunner"]


class Candidates:
    """Which task each candidate module belongs to: the search strategy adds every
    candidate it hands out, the builder takes it back (by identity of the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_module: dict = {}

    def add(self, mod, task) -> None:
        with self._lock:
            # the module itself is kept, so that its handle cannot be reused meanwhile
            self._by_module[mod.__chandle__()] = (mod, task)

    def take(self, mod):
        with self._lock:
            found = self._by_module.pop(mod.__chandle__(), None)
        if found is None:
            raise KeyError("a candidate no tirpat search strategy handed out reached the builder")
        return found[1]


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"


@derived_object
class Builder(PyBuilder):
    """Pack candidates as artifacts in ``workdir`` (compiling them is the measurement's
    first step, so a candidate that does not compile is a run error naming why)."""

    def __init__(self, candidates: Candidates, workdir: str) -> None:
        super().__init__()
        self.candidates = candidates
        self.workdir = workdir
        self._count = itertools.count()

    def build(self, build_inputs):
        results = []
        for bi in build_inputs:
            task = self.candidates.take(bi.mod)
            # a directory of its own: meta_schedule's RemoveBuildArtifact deletes it
            where = tempfile.mkdtemp(prefix=f"{next(self._count)}-", dir=self.workdir)
            path = artifact.pack(os.path.join(where, f"{task.name}{artifact.SUFFIX}"), bi.mod, bi.target,
                                 task.reference, task.data)
            results.append(BuilderResult(str(path), None))
        return results


@derived_object
class _Done(PyRunnerFuture):
    def __init__(self, result: RunnerResult) -> None:
        super().__init__()
        self._result = result

    def done(self) -> bool:
        return True

    def result(self) -> RunnerResult:
        return self._result


def run_one(path: str) -> RunnerResult:
    """The runner result of measuring one artifact (an error for any exception, a result
    that is not bit-exact included)."""
    try:
        return RunnerResult([artifact.measure(path)], None)
    except Exception as err:  # noqa: BLE001 - reported as the candidate's error
        return RunnerResult(None, _first_line(err))


@derived_object
class LocalRunner(PyRunner):
    """Measure artifacts in this process, one after the other; ``before_each()`` is called
    before each (it raises to stop the tune: a measurement keeps any exception as the
    candidate's error)."""

    def __init__(self, before_each: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.before_each = before_each

    def run(self, runner_inputs):
        done = []
        for ri in runner_inputs:
            self.before_each()
            done.append(_Done(run_one(str(ri.artifact_path))))
        return done
