"""Device timelines as Chrome/Perfetto trace-event JSON: open them in ui.perfetto.dev or
chrome://tracing.

Any backend whose statistics carry a timeline gets the export: a timeline is an object with
``events``, each with ``unit`` (the track it keeps busy: a unit of the device), ``start`` and
``end`` (its cycles, ``end`` exclusive) and, optionally, ``opcode`` (the name an event shows);
the timeline's optional ``units`` orders the tracks (else the order units first appear in).
The trace has one process per backend, in it a track per unit and, given the model's layers
(``(label, start, end)`` cycle spans, ``tirpat run``'s ``model.layers``), a ``layers`` track
above them. Trace-event times are microseconds; here one microsecond is one device cycle, as
the trace's ``otherData`` says.

>>> from collections import namedtuple
>>> Event = namedtuple("Event", "unit start end")
>>> class Timeline:
...     events = [Event("vld", 0, 4), Event("valu", 4, 6), Event("vld", 4, 8)]
>>> trace = trace_events({"vecunit": Timeline()}, {"vecunit": [("add + ReLU", 0, 8)]})
>>> [(e["name"], e["args"]["name"]) for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
[('thread_name', 'layers'), ('thread_name', 'vld'), ('thread_name', 'valu')]
>>> [(e["name"], e["tid"], e["ts"], e["dur"]) for e in trace["traceEvents"] if e["ph"] == "X"]
[('add + ReLU', 0, 0, 8), ('vld', 1, 0, 4), ('valu', 2, 4, 2), ('vld', 1, 4, 4)]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence, Union

__all__ = ["trace_events", "save_trace", "has_timeline"]

#: what a trace's microsecond stands for
TIME_UNIT = "one microsecond of the trace is one device cycle"


def has_timeline(stats) -> bool:
    """Whether a backend's statistics carry a timeline this module can export."""
    return hasattr(getattr(stats, "timeline", None), "events")


def trace_events(timelines: Mapping[str, object], layers: Mapping[str, Sequence[tuple[str, int, int]]] | None = None,
                 title: str = "") -> dict:
    """The trace-event JSON object of ``timelines`` (backend name -> timeline) and their
    ``layers`` (backend name -> ``(label, start, end)`` spans): a ``traceEvents`` list of
    complete (``"X"``) events and metadata (``"M"``) naming each process and track."""
    out = []
    for pid, (backend, timeline) in enumerate(timelines.items(), start=1):
        events = list(timeline.events)
        units = list(dict.fromkeys([*getattr(timeline, "units", ()), *(e.unit for e in events)]))
        spans = list((layers or {}).get(backend, ()))
        tid = {unit: n for n, unit in enumerate(["layers"] * bool(spans) + units, start=0 if spans else 1)}
        out.append(_meta("process_name", pid, 0, f"{backend}: {title}" if title else backend))
        for track, number in tid.items():       # the tracks in this order, not by name
            out.append(_meta("thread_name", pid, number, track))
            out.append(_meta("thread_sort_index", pid, number, number, key="sort_index"))
        for n, (label, start, end) in enumerate(spans):
            out.append({"name": label, "cat": "layer", "ph": "X", "ts": start, "dur": end - start,
                        "pid": pid, "tid": 0, "args": {"layer": n + 1, "cycles": end - start}})
        for e in events:
            out.append({"name": getattr(e, "opcode", e.unit), "cat": e.unit, "ph": "X", "ts": e.start,
                        "dur": e.end - e.start, "pid": pid, "tid": tid[e.unit]})
    return {"traceEvents": out, "otherData": {"time unit": TIME_UNIT}}


def _meta(name: str, pid: int, tid: int, value, key: str = "name") -> dict:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def save_trace(path: Union[str, Path], timelines: Mapping[str, object],
               layers: Mapping[str, Sequence[tuple[str, int, int]]] | None = None, title: str = "") -> Path:
    """Write :func:`trace_events` as JSON at exactly ``path``; returns it."""
    path = Path(path)
    path.write_text(json.dumps(trace_events(timelines, layers, title)) + "\n")
    return path
