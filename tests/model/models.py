"""Relax models for the model-level tests (TVMScript built by shape, and relax.frontend.nn)."""

from __future__ import annotations

import threading
from typing import Callable

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


def epilogue_operand(op: str, operand_shape: tuple, left: bool) -> tvm.IRModule:
    """An int8 matmul [20, 24] x [24, 40] -> int32 and one binary ``R.<op>`` with an int32
    operand of ``operand_shape``, on the left (``op(b, y)``) or the right (``op(y, b)``)."""
    fn = getattr(R, op)

    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((20, 24), "int8"), w: R.Tensor((24, 40), "int8"), b: R.Tensor(operand_shape, "int32")):
            with R.dataflow():
                y = R.matmul(x, w, out_dtype="int32")
                z = fn(b, y) if left else fn(y, b)
                R.output(z)
            return z

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


def cnn(size: int = 8, channels: int = 8, classes: int = 10, layout: str = "NCHW", shift: int = 10) -> tvm.IRModule:
    """A ResNet-style int8 CNN: a 3x3 conv + bias + ReLU + requantise (ReLU folded into the
    clip), a residual block (3x3 conv + bias, plus the block's input, ReLU, requantise), a
    flatten and a dense head. Weights [F, C, 3, 3] (OIHW) for NCHW, [3, 3, C, F] (HWIO) for NHWC."""
    nchw = layout == "NCHW"
    act = (1, 3, size, size) if nchw else (1, size, size, 3)
    hidden = (1, channels, size, size) if nchw else (1, size, size, channels)
    w1s = (channels, 3, 3, 3) if nchw else (3, 3, 3, channels)
    w2s = (channels, channels, 3, 3) if nchw else (3, 3, channels, channels)
    bias = (1, channels, 1, 1) if nchw else (1, 1, 1, channels)
    kernel = "OIHW" if nchw else "HWIO"
    flat = channels * size * size
    half = 1 << (shift - 1)

    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor(act, "int8"), w1: R.Tensor(w1s, "int8"), b1: R.Tensor(bias, "int32"),
                 w2: R.Tensor(w2s, "int8"), b2: R.Tensor(bias, "int32"), wd: R.Tensor((classes, flat), "int8")):
            with R.dataflow():
                c1 = R.nn.conv2d(x, w1, padding=1, data_layout=layout, kernel_layout=kernel, out_dtype="int32")
                a1 = R.astype(R.clip(R.right_shift(R.add(R.multiply(R.add(c1, b1), R.const(3, "int32")),
                                                          R.const(half, "int32")), R.const(shift, "int32")), 0, 127),
                              "int8")
                c2 = R.nn.conv2d(a1, w2, padding=1, data_layout=layout, kernel_layout=kernel, out_dtype="int32")
                r = R.nn.relu(R.add(R.add(c2, b2), R.astype(a1, "int32")))
                a2 = R.astype(R.clip(R.right_shift(R.add(r, R.const(half, "int32")), R.const(shift, "int32")),
                                     -128, 127), "int8")
                f = R.reshape(a2, (1, flat))
                o = R.matmul(f, R.permute_dims(wd), out_dtype="int32")
                R.output(o)
            return o

    return Module


def matmul(m, k: int, n: int, dtype: str = "int32") -> tvm.IRModule:
    """``main(x[m, k], w[k, n]) = x @ w`` of ``dtype`` (``m`` may be a symbolic ``tirx.Var``)."""
    x = relax.Var("x", relax.TensorType((m, k), dtype))
    w = relax.Var("w", relax.TensorType((k, n), dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    return bb.get()


def batch_matmul(batch: int, m: int, n: int, k: int) -> tvm.IRModule:
    """A batched int8 matmul with a bias and a saturating requantise."""

    @I.ir_module
    class Module:
        @R.function
        def main(a: R.Tensor((batch, m, k), "int8"), b: R.Tensor((batch, k, n), "int8"), bias: R.Tensor((n,), "int32")):
            with R.dataflow():
                y = R.add(R.matmul(a, b, out_dtype="int32"), bias)
                q = R.astype(R.clip(R.right_shift(y, R.const(6, "int32")), -128, 127), "int8")
                R.output(q)
            return q

    return Module


def nn_mlp(features: int = 48, hidden: int = 32, classes: int = 10, batch: int = 4) -> tvm.IRModule:
    """An MLP written with relax.frontend.nn: int8 Linear layers with int32 results (no bias),
    a ReLU between them, narrowed to int8 by a cast."""
    from tvm.relax.frontend import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(features, hidden, bias=False, dtype="int8", out_dtype="int32")
            self.fc2 = nn.Linear(hidden, classes, bias=False, dtype="int8", out_dtype="int32")

        def forward(self, x: nn.Tensor):
            h = nn.op.astype(nn.op.minimum(nn.op.relu(self.fc1(x)), nn.op.full((1,), 127, "int32")), "int8")
            return self.fc2(h)

    mod, _ = MLP().export_tvm({"forward": {"x": nn.spec.Tensor((batch, features), "int8")}})
    return mod


def onnx_mlp(batch: int, features: int, hidden: int, classes: int, seed: int = 0):
    """An int8 ONNX MLP with MatMulInteger layers (weights as initializers): MatMulInteger +
    bias + Relu + Cast to int8 (wrapping), then a MatMulInteger head."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = rng.integers(-128, 128, (features, hidden), dtype=np.int8)
    b1 = rng.integers(-2000, 2000, (hidden,), dtype=np.int32)
    w2 = rng.integers(-128, 128, (hidden, classes), dtype=np.int8)
    nodes = [
        helper.make_node("MatMulInteger", ["x", "w1"], ["y"]),
        helper.make_node("Add", ["y", "b1"], ["z"]),
        helper.make_node("Relu", ["z"], ["r"]),
        helper.make_node("Cast", ["r"], ["h"], to=TensorProto.INT8),
        helper.make_node("MatMulInteger", ["h", "w2"], ["out"]),
    ]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
             numpy_helper.from_array(w2, "w2")]
    graph = helper.make_graph(nodes, "int8_mlp", [helper.make_tensor_value_info("x", TensorProto.INT8, [batch, features])],
                              [helper.make_tensor_value_info("out", TensorProto.INT32, [batch, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def in_threads(worker: Callable[[int], None], n: int, timeout: float = 300) -> None:
    """``worker(k)`` for each ``k`` in ``range(n)``, each on a thread of its own, all released
    together; fails, naming the thread, when one raised or did not finish within ``timeout`` s."""
    start = threading.Barrier(n, timeout=60)
    errors = []

    def run(k):
        try:
            start.wait()
            worker(k)
        except BaseException as err:  # noqa: BLE001 - reported below, with its thread
            errors.append((k, repr(err)))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), f"a thread did not finish within {timeout} s"
    assert errors == [], errors
