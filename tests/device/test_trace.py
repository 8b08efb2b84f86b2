"""tirpat.device.trace: any backend's timeline (events with unit, start, end) as trace-event JSON."""

import json
from collections import namedtuple

from tirpat.device.trace import TIME_UNIT, has_timeline, save_trace

Event = namedtuple("Event", "unit start end opcode")


class Timeline:
    """A timeline as the protocol has it: ``events`` and, optionally, ``units``."""

    def __init__(self, events, units=()):
        self.events, self.units = events, units


def test_a_process_per_backend_a_track_per_unit_and_the_layers(tmp_path):
    npu = Timeline([Event("dma", 0, 10, "LD"), Event("mac", 10, 30, "MM"), Event("dma", 12, 20, "LD")],
                   units=("dma", "mac", "idle"))
    vec = Timeline([Event("lanes", 5, 9, "vadd")])
    path = save_trace(tmp_path / "t.json", {"npu": npu, "vec": vec}, {"npu": [("conv", 0, 18), ("dense", 18, 30)]},
                      title="m.tirpat")
    trace = json.loads(path.read_text())
    assert trace["otherData"] == {"time unit": TIME_UNIT}
    meta = {(e["pid"], e["tid"], e["name"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert meta[(1, 0, "process_name")] == {"name": "npu: m.tirpat"} and meta[(2, 0, "process_name")] == {"name": "vec: m.tirpat"}
    names = {(pid, tid): args["name"] for (pid, tid, name), args in meta.items() if name == "thread_name"}
    # the units in the timeline's order (one without events too), the layers first; no layers: no track
    assert names == {(1, 0): "layers", (1, 1): "dma", (1, 2): "mac", (1, 3): "idle", (2, 1): "lanes"}
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    busy = {}
    for e in events:
        busy[names[e["pid"], e["tid"]]] = busy.get(names[e["pid"], e["tid"]], 0) + e["dur"]
    assert busy == {"layers": 30, "dma": 18, "mac": 20, "lanes": 4}
    assert [(e["name"], e["ts"]) for e in events if e["pid"] == 1 and e["tid"] == 0] == [("conv", 0), ("dense", 18)]
    assert {e["name"] for e in events if e["tid"] != 0} == {"LD", "MM", "vadd"}


def test_what_has_a_timeline():
    class Stats:
        timeline = Timeline([])

    assert has_timeline(Stats()) and not has_timeline(object()) and not has_timeline({"cycles": 3})
