"""The whole-model offload report: where each operator ran, and its multiply-accumulates.

MACs are counted on the Relax graph, before any padding or tiling: ``matmul`` is the
output's elements times the reduction length, a convolution the output's elements times
its weight's elements per output channel. A backend may say, from its ``schedule`` hook,
what it left for the CPU inside a partition and how many MACs its device really executes
(tiles padded included) by setting the PrimFunc attribute :data:`SCHEDULE_NOTES` to JSON text
``{"host_macs": int, "device_macs": int, "host_steps": [[what, why], ...],
"epilogue": [str, ...]}`` (every key optional).

>>> r = ModelReport(total_macs=100, partitions=[Partition("accel", "f", "accel.matmul", ["relax.matmul"], 100)])
>>> r.to_json()["macs"]
{'accel': 100, 'host': 0}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import tvm
from tvm import relax, tirx

__all__ = ["ModelReport", "Partition", "HostOp", "SCHEDULE_NOTES", "macs_of", "macs_known", "epilogue_of"]

#: PrimFunc attribute a backend's schedule may set: JSON notes for the report (module docstring).
SCHEDULE_NOTES = "tirpat.notes"

_CONV = {"relax.nn.conv1d": "OIW", "relax.nn.conv2d": "OIHW", "relax.nn.conv3d": "OIDHW"}


def _static_shape(expr) -> list | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    shape = ty.shape
    if not isinstance(shape, relax.ShapeExpr):
        return None
    dims = []
    for d in shape.values:
        if not isinstance(d, tirx.IntImm):
            return None
        dims.append(int(d.value))
    return dims


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def macs_of(call) -> int:
    """The multiply-accumulates of one Relax operator call (0 for operators that do none, and
    for dynamic shapes).

    >>> from tvm.script import relax as R
    >>> x = relax.Var("x", R.Tensor((8, 64), "int8")); w = relax.Var("w", R.Tensor((64, 32), "int8"))
    >>> macs_of(relax.BlockBuilder().normalize(relax.op.matmul(x, w, out_dtype="int32")))
    16384
    """
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return 0
    name = call.op.name
    out = _static_shape(call)
    if out is None:
        return 0
    if name == "relax.matmul":
        a = _static_shape(call.args[0])
        return 0 if a is None else _prod(out) * a[-1]
    if name in _CONV:
        w = _static_shape(call.args[1])
        if w is None:
            return 0
        layout = str(call.attrs.kernel_layout)
        return _prod(out) * _prod(w) // w[layout.index("O")]
    return 0


def macs_known(call) -> bool:
    """Whether :func:`macs_of` counts ``call``: False for a matmul or convolution with a
    symbolic shape (its multiply-accumulates depend on the input's size).

    >>> from tvm.script import relax as R
    >>> n = tirx.Var("n", "int64")
    >>> x = relax.Var("x", R.Tensor((n, 64), "int8")); w = relax.Var("w", R.Tensor((64, 32), "int8"))
    >>> macs_known(relax.BlockBuilder().normalize(relax.op.matmul(x, w, out_dtype="int32")))
    False
    """
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return True
    name = call.op.name
    if name == "relax.matmul":
        operand = call.args[0]
    elif name in _CONV:
        operand = call.args[1]
    else:
        return True
    return _static_shape(call) is not None and _static_shape(operand) is not None


_REQUANT = {"relax.multiply", "relax.right_shift"}


def _const_value(expr):
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):
        return expr.value
    if isinstance(expr, tvm.ir.Constant) and tuple(expr.value.shape) == ():
        return expr.value.numpy().item()
    return None


def epilogue_of(calls: list) -> list:
    """What the operators after a partition's matmul or convolution do, in words: ``bias``,
    ``ReLU``, ``clip``, ``requantise``, ``residual add``, ``cast``.

    ``calls`` are the partition's Relax calls in order, the compute operator first.
    """
    words: list = []

    def say(word):
        if word not in words:
            words.append(word)

    core = calls[0]
    out_shape = _static_shape(core)
    requant = any(c.op.name in _REQUANT for c in calls[1:])
    for call in calls[1:]:
        name = call.op.name
        if name in ("relax.add", "relax.subtract"):
            if requant and call is not calls[1] and _const_value(call.args[1]) is not None:
                say("requantise")
                continue
            operand = _static_shape(call.args[1])
            full = operand is not None and out_shape is not None and _prod(operand) == _prod(out_shape)
            say("residual add" if full else "bias")
        elif name == "relax.nn.relu":
            say("ReLU")
        elif name in _REQUANT:
            say("requantise")
        elif name in ("relax.clip", "relax.maximum", "relax.minimum"):
            low = _const_value(call.args[1])
            if requant:
                say("requantise")
                if low == 0:
                    say("ReLU")
            else:
                say("ReLU" if low == 0 and name != "relax.minimum" else "clip")
        elif name == "relax.astype":
            if not (requant and str(call.ty.dtype) == "int8"):
                say(f"cast to {call.ty.dtype}")
        else:
            say(name.removeprefix("relax."))
    return words


@dataclass
class Partition:
    """One operator group a backend took: its function, pattern, operators and MACs."""

    backend: str
    function: str
    pattern: str
    ops: list
    macs: int
    epilogue: list = field(default_factory=list)
    rules: dict = field(default_factory=dict)       # TIR rule -> sites rewritten
    host_macs: int = 0                              # MACs the backend left for the CPU
    device_macs: int | None = None                  # MACs the device executes, padding included
    on_host: list = field(default_factory=list)     # [what, why] steps the CPU does for it
    fallback: str | None = None                     # why its backend could not lower it (it ran on the host)
    from_records: bool = False                      # scheduled from a tuning record


@dataclass
class HostOp:
    """One operator left for the host target, with the reason no backend took it; ``var`` is
    the name it is bound to as ``tp.partition(mod, target).show()`` prints it."""

    op: str
    var: str
    reason: str
    macs: int = 0


@dataclass
class ModelReport:
    """What ``tp.build`` did with each operator of a model; ``str()`` reads well,
    :meth:`to_json` is a JSON-serialisable dict (``tirpat compile --report``)."""

    total_macs: int = 0
    partitions: list = field(default_factory=list)
    on_host: list = field(default_factory=list)
    #: matmuls and convolutions with symbolic shapes: their MACs are not in :attr:`total_macs`
    uncounted: int = 0
    #: tuning records given to the build: ``{"path", "applied", "partitions", "misses"}``
    #: (partitions scheduled from a record, of how many; ``misses``: partition -> why none)
    records: dict | None = None
    #: the target's backends, in priority order (those that took nothing included)
    backends: list = field(default_factory=list)

    @property
    def macs(self) -> dict:
        """MACs by backend name, ``"host"`` included; they sum to :attr:`total_macs`. A
        partition that fell back to the host counts for the host."""
        out: dict = {}
        for p in self.partitions:
            out[p.backend] = out.get(p.backend, 0) + (0 if p.fallback else p.macs - p.host_macs)
        out["host"] = self.total_macs - sum(out.values())
        return out

    def to_json(self) -> dict:
        """``total_macs``, ``macs`` (by backend, ``"host"`` included), ``partitions``,
        ``on_host``, ``uncounted`` (operators whose MACs depend on symbolic shapes) and
        ``records`` (None when the build had no tuning records) and ``backends`` (the target's)."""
        return {"total_macs": self.total_macs, "macs": self.macs,
                "partitions": [asdict(p) for p in self.partitions],
                "on_host": [asdict(h) for h in self.on_host], "uncounted": self.uncounted,
                "records": self.records, "backends": self.backends}

    @classmethod
    def from_json(cls, data: dict) -> "ModelReport":
        """The inverse of :meth:`to_json`."""
        partitions = [Partition(**p) for p in data["partitions"]]
        backends = data.get("backends") or list(dict.fromkeys(p.backend for p in partitions))
        return cls(data["total_macs"], partitions, [HostOp(**h) for h in data["on_host"]],
                   data.get("uncounted", 0), data.get("records"), backends)

    def __str__(self) -> str:
        total = self.total_macs
        share = lambda n: f"{100 * n / total:.1f}%" if total else "-"  # noqa: E731
        if self.uncounted:
            count = (f"{total:,} counted" if total else "unknown") + \
                f" ({self.uncounted} matmul or convolution operators have symbolic shapes: their MACs depend on the input)"
        else:
            count = f"{total:,}" + ("" if total else " (the model has no matmul or convolution)")
        lines = ["tirpat model report", f"  multiply-accumulates: {count}"]
        for name, n in self.macs.items():
            lines.append(f"    on {name}: {n:,} ({share(n)})")
        if self.records is not None:
            lines.append(f"  {records_line(self.records)}")
        fell_back = [p for p in self.partitions if p.fallback]
        for p in self.partitions:
            if p.fallback:
                continue        # listed with the host's operators
            lines.append(f"  {p.backend}: {p.function} ({p.pattern}): {_what(p)}, {p.macs:,} MACs")
            if p.from_records:
                lines.append("      scheduled from a tuning record")
            if p.device_macs is not None and p.device_macs != p.macs - p.host_macs:
                lines.append(f"      the device executes {p.device_macs:,} MACs: the matrices are padded to whole tiles")
            if not p.rules and not p.on_host:     # else the backend's own reasons follow
                lines.append(f"      ran on the host: none of {p.backend}'s rules matched its code")
            for what_cpu, why in p.on_host:
                lines.append(f"      on the CPU: {what_cpu} {why}")
        if self.on_host or fell_back:
            lines.append("  on the host:")
        for p in fell_back:
            lines.append(f"    {p.function} ({p.pattern}): {_what(p)}, {p.macs:,} MACs: {p.fallback}")
        for h in self.on_host:
            macs = f", {h.macs:,} MACs" if h.macs else ""
            lines.append(f"    {h.var} = {_short(h.op)}{macs}: {h.reason}")
        return "\n".join(lines)


def records_line(records: dict) -> str:
    """How many partitions the build scheduled from its tuning records, and why the others not."""
    line = (f"tuning records {records['path']}: {records['applied']} of {records['partitions']} partitions "
            "scheduled from a record")
    return "\n    ".join([line] + [f"{name}: {why}" for name, why in records["misses"].items()])


def _what(p: Partition) -> str:
    """What a partition computes, in words: ``matmul + bias + ReLU``."""
    return " + ".join([_short(p.ops[0])] + p.epilogue) if p.ops else p.pattern


def _short(op: str) -> str:
    return op.removeprefix("relax.").removeprefix("nn.")


def notes_of(func) -> dict:
    """The backend's :data:`SCHEDULE_NOTES` notes of a PrimFunc (empty when it set none)."""
    if func.attrs is None or SCHEDULE_NOTES not in func.attrs:
        return {}
    return json.loads(str(func.attrs[SCHEDULE_NOTES]))
