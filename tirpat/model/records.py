"""Tuning records: the meta_schedule database ``tp.tune`` writes and ``tp.build`` applies.

A records directory is meta_schedule's JSON database (``database_workload.json``,
``database_tuning_record.json``). A workload is one partition's legalized PrimFunc tagged
with its backend and the backend's options (:func:`workload`), so records made for
``accel -tile=32`` never apply to ``accel``. Applying a record replays the design-space
part of its trace on the partition (its sampled decisions, e.g. knob annotations); the
backend's ``schedule`` hook then schedules the result as it schedules any partition.

>>> records = tp.Records("records/")                                  # doctest: +SKIP
>>> func = records.apply(func, "accel", opts)                         # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path

import tvm_ffi
from tvm import ir, s_tir, tirx

from .partition import BACKEND_ATTR, OPTIONS_ATTR, options_text

__all__ = ["Records", "workload"]

_WORKLOADS, _RECORDS = "database_workload.json", "database_tuning_record.json"


def workload(func: tirx.PrimFunc, backend: str, opts: dict) -> ir.IRModule:
    """The database key of a partition: ``{"main": func}`` tagged with ``backend`` and its
    ``opts``, without a ``global_symbol`` (the partition's name is not part of it)."""
    if func.attrs is not None and "global_symbol" in func.attrs:
        func = func.without_attr("global_symbol")
    return ir.IRModule({"main": func.with_attr(BACKEND_ATTR, backend).with_attr(OPTIONS_ATTR, options_text(opts))})


def _plain(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return func.without_attr(BACKEND_ATTR).without_attr(OPTIONS_ATTR)


class Records:
    """A directory of tuning records (see the module docstring).

    ``create=True`` makes an empty one (what ``tp.tune`` does); otherwise the directory must
    hold records already, so that a mistyped path is an error rather than an untuned build.
    """

    def __init__(self, path, *, create: bool = False) -> None:
        from tvm.s_tir.meta_schedule.database import JSONDatabase

        self.path = Path(path)
        if create:
            self.path.mkdir(parents=True, exist_ok=True)
        elif not (self.path / _WORKLOADS).is_file():
            raise FileNotFoundError(f"no tuning records in {self.path} (no {_WORKLOADS}; "
                                    f"'tirpat tune ... --records {self.path}' writes them)")
        self.database = JSONDatabase(str(self.path / _WORKLOADS), str(self.path / _RECORDS),
                                     module_equality="structural")

    def best(self, func: tirx.PrimFunc, backend: str, opts: dict):
        """The best valid record (a meta_schedule ``TuningRecord``) of the partition, or None."""
        key = workload(func, backend, opts)
        if not self.database.has_workload(key):
            return None
        for record in self.database.get_top_k(self.database.commit_workload(key), 1):
            if record.run_secs:
                return record
        return None

    def why_none(self, func: tirx.PrimFunc, backend: str, opts: dict) -> str:
        """Why :meth:`best` finds no record of the partition, in words: its computation has
        records tuned with other backend options, or none at all."""
        key = workload(func, backend, opts)
        if self.database.has_workload(key):
            return "its records have no successful measurement"
        plain = _plain(key["main"])
        for entry in self.database.get_all_tuning_records():
            other = entry.workload.mod["main"]
            if str(other.attrs.get(BACKEND_ATTR, "")) == backend and tvm_ffi.structural_equal(_plain(other), plain):
                theirs, ours = json.loads(str(other.attrs[OPTIONS_ATTR])), json.loads(options_text(opts))
                differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
                said = lambda o: " ".join(f"-{k}={o.get(k)}" for k in differ)  # noqa: E731
                return f"its records were tuned for {backend} {said(theirs)}, this build is for {backend} {said(ours)}"
        return "no record of this computation (not tuned, or the records are another model's)"

    def apply(self, func: tirx.PrimFunc, backend: str, opts: dict) -> tirx.PrimFunc:
        """``func`` with the design-space decisions of its best record replayed (``func``
        itself when there is none), for the backend's ``schedule`` hook."""
        record = self.best(func, backend, opts)
        if record is None:
            return func
        # ``key`` stays referenced while the schedule edits it: a Schedule of a module that
        # nothing else holds edits it in place, and its body is ``func``'s own
        key = workload(func, backend, opts)
        sch = s_tir.Schedule(key)
        record.trace.apply_to_schedule(sch, remove_postproc=True)
        return func.with_body(sch.mod["main"].body)

    def __repr__(self) -> str:
        return f"Records({str(self.path)!r})"
