"""One tuning candidate as a self-contained file, and its measurement.

An artifact is a zip holding the candidate (the scheduled module, as TVM's JSON), the host
target, the backend's name and options, arguments, and the results the same arguments give
with the untuned workload compiled by TVM alone (the reference). :func:`measure` compiles
it for the host through the backends' TIR pipeline, runs it on the backend's device through
:meth:`~tirpat.Backend.measure`, and checks every buffer bit for bit against the reference:
a candidate that computes anything else is an error, so a wrong schedule never wins.

The measuring machine compiles, as a device farm builds with its own toolchain: the tuning
machine only searches, and an RPC server (:mod:`tirpat.model.tune.rpc`) does the work that
scales with the number of servers. The same file is measured in-process or on a server.

>>> ref = reference(workload, tvm.target.Target("llvm"), seed=0)      # doctest: +SKIP
>>> pack("cand.tptune", scheduled_mod, tvm.target.Target("llvm"), ref)  # doctest: +SKIP
>>> measure("cand.tptune")                                          # doctest: +SKIP
13992.0
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import tvm
from tvm import ir, tirx

from ..backend import lookup
from ..partition import BACKEND_ATTR, OPTIONS_ATTR
from ..pipeline import TIR_PIPELINE

__all__ = ["Reference", "NotBitExact", "reference", "random_args", "compile_candidate", "pack", "measure"]

#: The suffix of an artifact file.
SUFFIX = ".tptune"
_CANDIDATE, _META, _DATA = "candidate.json", "meta.json", "data.npz"


class NotBitExact(ValueError):
    """A candidate's results differ from the reference's; the message names the buffer."""


@dataclass(frozen=True)
class Reference:
    """What a candidate of one task is checked against: the backend and its options, the
    arguments (one array per buffer parameter) and every buffer after the reference run."""

    backend: str
    options: dict
    names: tuple
    args: tuple
    expected: tuple

    def data(self) -> bytes:
        """The arguments and expected buffers as ``.npz`` bytes (written once per task)."""
        out = io.BytesIO()
        arrays = {f"arg{n}": a for n, a in enumerate(self.args)}
        arrays.update({f"expected{n}": e for n, e in enumerate(self.expected)})
        np.savez(out, **arrays)
        return out.getvalue()


def random_args(func: tirx.PrimFunc, seed: int) -> list:
    """Seeded arguments for every buffer parameter of ``func``: 8- and 16-bit integers over
    their whole range, wider integers in [-5000, 5000) (biases: large ones would saturate
    every requantised result and hide a wrong product), floats standard normal.

    >>> [a.dtype.name for a in random_args(func, 0)]       # doctest: +SKIP
    ['int8', 'int8', 'int32', 'int8']
    """
    rng = np.random.default_rng(seed)
    out = []
    for p in func.params:
        if not tirx.is_buffer_var(p):
            raise TypeError(f"tuning needs buffer parameters only; {p.name} is a scalar")
        shape = []
        for d in p.shape:
            if not isinstance(d, tirx.IntImm):
                raise ValueError(f"tuning needs static shapes; buffer {p.name} has the shape {list(p.shape)}")
            shape.append(int(d.value))
        dtype = np.dtype(str(p.dtype))
        if dtype.kind in "iu" and dtype.itemsize <= 2:
            info = np.iinfo(dtype)
            out.append(rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype))
        elif dtype.kind in "iu":
            out.append(rng.integers(0 if dtype.kind == "u" else -5000, 5000, shape).astype(dtype))
        elif dtype.kind == "b":
            out.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def _untagged(func: tirx.PrimFunc) -> tirx.PrimFunc:
    for key in (BACKEND_ATTR, OPTIONS_ATTR):
        if func.attrs is not None and key in func.attrs:
            func = func.without_attr(key)
    return func.with_attr("global_symbol", "main")


def reference(workload: ir.IRModule, host, seed: int) -> Reference:
    """Run the workload's ``main`` (tagged with its backend) compiled by TVM alone for
    ``host`` on :func:`random_args`: the reference of every candidate of the task."""
    func = workload["main"]
    backend = str(func.attrs[BACKEND_ATTR])
    options = json.loads(str(func.attrs[OPTIONS_ATTR]))
    args = random_args(func, seed)
    tensors = [tvm.runtime.tensor(a) for a in args]
    tvm.compile(ir.IRModule({"main": _untagged(func)}), target=host)["main"](*tensors)
    names = tuple(p.name for p in func.params)
    return Reference(backend, options, names, tuple(args), tuple(t.numpy() for t in tensors))


def compile_candidate(mod: ir.IRModule, host):
    """A candidate (its ``main`` tagged with its backend) compiled for ``host`` through the
    backends' TIR pipeline (:data:`tirpat.TIR_PIPELINE`)."""
    func = mod["main"].with_attr("global_symbol", "main")
    return tvm.compile(ir.IRModule({"main": func}), target=host, tir_pipeline=TIR_PIPELINE)


def pack(path, mod: ir.IRModule, host, ref: Reference, data: bytes | None = None) -> Path:
    """Write the artifact ``path``: the candidate ``mod`` for ``host`` with ``ref``; ``data``
    is ``ref.data()`` when the caller already has it."""
    path = Path(path)
    meta = {"backend": ref.backend, "options": ref.options, "names": list(ref.names),
            "host": _plain(tvm.target.Target(host).export())}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(_CANDIDATE, tvm.ir.save_json(mod))
        z.writestr(_META, json.dumps(meta))
        z.writestr(_DATA, ref.data() if data is None else data)
    return path


def _plain(value):
    """A target's ``export()`` (TVM maps and arrays) as JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value


def measure(path) -> float:
    """Compile the candidate of the artifact ``path``, run it on its backend's device and
    return the cost :meth:`~tirpat.Backend.measure` gives; raise :class:`NotBitExact` when a
    buffer differs from the reference.

    This compiles and runs the code the artifact describes: measure only artifacts you
    made (an RPC server that measures runs whatever it is sent).
    """
    with zipfile.ZipFile(path) as z:
        meta = json.loads(z.read(_META))
        mod = tvm.ir.load_json(z.read(_CANDIDATE).decode())
        with np.load(io.BytesIO(z.read(_DATA))) as data:
            n = len(meta["names"])
            args = [data[f"arg{i}"] for i in range(n)]
            expected = [data[f"expected{i}"] for i in range(n)]
    main = compile_candidate(mod, tvm.target.Target(meta["host"]))["main"]
    backend = lookup(meta["backend"])
    opts = backend.resolve(meta["options"])
    tensors = [tvm.runtime.tensor(a) for a in args]
    cost = float(backend.measure(lambda: main(*tensors), opts))
    for name, tensor, want in zip(meta["names"], tensors, expected):
        got = tensor.numpy()
        if not np.array_equal(got, want):
            wrong = np.argwhere(got != want)
            first = tuple(int(i) for i in wrong[0])
            raise NotBitExact(f"buffer {name}: {len(wrong)} of {want.size} elements differ from the reference "
                              f"(first at {list(first)}: {got[first]} instead of {want[first]})")
    return cost
