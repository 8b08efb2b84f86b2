"""Relax models for the model-level tests (TVMScript built by shape, and relax.frontend.nn)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R


def mlp(batch: int, features: int, hidden: int, classes: int, shift: int = 8) -> tvm.IRModule:
    """int8 MLP: dense + bias + ReLU + requantise, then a dense head (weight [classes, hidden],
    through permute_dims as nn.Linear writes it) and a row sum left for the host."""
    half = 1 << (shift - 1)

    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((batch, features), "int8"), w: R.Tensor((features, hidden), "int8"),
                 b: R.Tensor((hidden,), "int32"), w2: R.Tensor((classes, hidden), "int8")):
            with R.dataflow():
                y = R.matmul(x, w, out_dtype="int32")
                r = R.nn.relu(R.add(y, b))
                q = R.astype(R.clip(R.right_shift(R.add(r, R.const(half, "int32")), R.const(shift, "int32")),
                                    -128, 127), "int8")
                o = R.matmul(q, R.permute_dims(w2), out_dtype="int32")
                s = R.sum(o, axis=[1])
                R.output(o, s)
            return (o, s)

    return Module


def random_inputs(mod: tvm.IRModule, rng: np.random.Generator, fn: str = "main") -> list:
    """Random arrays for every parameter of ``fn``: int8 in full range, int32 as biases."""
    out = []
    for p in mod[fn].params:
        shape = [int(d) for d in p.ty.shape.values]
        dtype = str(p.ty.dtype)
        if dtype == "int8":
            out.append(rng.integers(-128, 128, shape, dtype=np.int8))
        elif dtype == "int32":
            out.append(rng.integers(-5000, 5000, shape, dtype=np.int32))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def reference(mod: tvm.IRModule, args: list):
    """The module compiled by ``tvm.compile(mod, "llvm")`` and run on TVM's VM."""
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    if isinstance(out, tvm.runtime.Tensor):
        return out.numpy()
    return tuple(o.numpy() for o in out)
