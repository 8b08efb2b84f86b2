"""Small float ONNX CNNs with seeded random weights, built with ``onnx.helper``.

For tests, benchmarks and trying the quantise -> compile -> run flow without downloading a
model (``python -m tirpat.testing.onnx_cnn residual cnn.onnx`` writes one). Weights are
He-initialised so that activations keep their magnitude through the layers. Needs the
``model`` extra (onnx).

>>> model = residual(seed=0)
>>> [i.name for i in model.graph.input], [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
(['x'], [1, 3, 16, 16])
>>> sorted({n.op_type for n in model.graph.node})
['Add', 'AveragePool', 'Conv', 'Flatten', 'Gemm', 'GlobalAveragePool', 'Relu']
"""

from __future__ import annotations

import os
import sys
from typing import Callable

import numpy as np

__all__ = ["MODELS", "conv_relu", "strided", "residual", "upsampling", "decoder", "calibration", "input_shape", "output_scale"]

INPUT_SHAPE = (1, 3, 16, 16)
CLASSES = 10


class _Builder:
    """Appends nodes and seeded initialisers; names are generated."""

    def __init__(self, seed: int) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.rng = np.random.default_rng(seed)
        self.nodes, self.initialisers, self.count = [], [], 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def _init(self, kind: str, array: np.ndarray) -> str:
        name = self._name(kind)
        self.initialisers.append(self.numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def _node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(self.helper.make_node(op, inputs, [out], **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int = 3, stride: int = 1) -> str:
        w = self.rng.normal(0, np.sqrt(2 / (cin * k * k)), (cout, cin, k, k))
        b = self.rng.normal(0, 0.1, cout)
        return self._node("Conv", [x, self._init("w", w), self._init("b", b)], kernel_shape=[k, k],
                          strides=[stride, stride], pads=[k // 2] * 4)

    def relu(self, x: str) -> str:
        return self._node("Relu", [x])

    def add(self, a: str, b: str) -> str:
        return self._node("Add", [a, b])

    def max_pool(self, x: str, k: int = 2) -> str:
        return self._node("MaxPool", [x], kernel_shape=[k, k], strides=[k, k])

    def avg_pool(self, x: str, k: int = 2) -> str:
        return self._node("AveragePool", [x], kernel_shape=[k, k], strides=[k, k])

    def global_avg_pool(self, x: str) -> str:
        return self._node("GlobalAveragePool", [x])

    def flatten(self, x: str) -> str:
        return self._node("Flatten", [x])

    def conv_transpose(self, x: str, cin: int, cout: int, k: int = 2, stride: int | None = None, pad: int = 0,
                       output_padding: int = 0) -> str:
        """A ConvTranspose with a bias; stride = kernel ``k`` (each output pixel from one tap)
        unless ``stride`` says otherwise."""
        w = self.rng.normal(0, np.sqrt(2 / cin), (cin, cout, k, k))
        b = self.rng.normal(0, 0.1, cout)
        stride = k if stride is None else stride
        return self._node("ConvTranspose", [x, self._init("w", w), self._init("b", b)], kernel_shape=[k, k],
                          strides=[stride, stride], pads=[pad] * 4, output_padding=[output_padding] * 2)

    def resize(self, x: str, scale: int = 2) -> str:
        """A nearest Resize by ``scale`` along H and W (asymmetric coordinates, floor: a detector's FPN)."""
        return self._node("Resize", [x, "", self._init("scales", np.array([1, 1, scale, scale]))], mode="nearest",
                          coordinate_transformation_mode="asymmetric", nearest_mode="floor")

    def gemm(self, x: str, cin: int, cout: int) -> str:
        w = self.rng.normal(0, np.sqrt(1 / cin), (cout, cin))
        b = self.rng.normal(0, 0.1, cout)
        return self._node("Gemm", [x, self._init("w", w), self._init("b", b)], transB=1)

    def model(self, name: str, shape: tuple, out_features: int | tuple):
        """The model; ``out_features``: the output's features, or its whole shape (a tuple)."""
        from onnx import TensorProto

        h = self.helper
        # stable names: the input is "x", the last node's output "y"
        self.nodes[-1].output[0] = "y"
        out = list(out_features) if isinstance(out_features, tuple) else [shape[0], out_features]
        graph = h.make_graph(self.nodes, name, [h.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                             [h.make_tensor_value_info("y", TensorProto.FLOAT, out)], self.initialisers)
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="tirpat.testing")


def conv_relu(seed: int = 0, channels: int = 16):
    """Conv + ReLU twice, global average pool, Gemm classifier."""
    g = _Builder(seed)
    c = g.relu(g.conv("x", 3, channels))
    c = g.relu(g.conv(c, channels, channels))
    g.gemm(g.flatten(g.global_avg_pool(c)), channels, CLASSES)
    return g.model("conv_relu", INPUT_SHAPE, CLASSES)


def strided(seed: int = 0, channels: int = 16):
    """Two stride-2 convolutions with ReLU, a 2x2 max pool, Gemm classifier."""
    g = _Builder(seed)
    c = g.relu(g.conv("x", 3, channels, stride=2))
    c = g.relu(g.conv(c, channels, 2 * channels, stride=2))
    p = g.max_pool(c)                                   # 16 -> 8 -> 4 -> 2
    g.gemm(g.flatten(p), 2 * channels * 4, CLASSES)
    return g.model("strided", INPUT_SHAPE, CLASSES)


def residual(seed: int = 0, channels: int = 16):
    """A stem conv, a residual block (conv-ReLU-conv + skip, ReLU), 2x2 average pool, global
    average pool, Gemm classifier."""
    g = _Builder(seed)
    stem = g.relu(g.conv("x", 3, channels))
    branch = g.conv(g.relu(g.conv(stem, channels, channels)), channels, channels)
    block = g.relu(g.add(branch, stem))
    g.gemm(g.flatten(g.global_avg_pool(g.avg_pool(block))), channels, CLASSES)
    return g.model("residual", INPUT_SHAPE, CLASSES)


def upsampling(seed: int = 0, channels: int = 8):
    """A detector's upsampling path: a stride-2 convolution with ReLU, a nearest 2x Resize, a
    convolution with ReLU, a ConvTranspose with kernel = stride = 2 (16 -> 8 -> 16 -> 32 pixels).

    >>> sorted({n.op_type for n in upsampling().graph.node})
    ['Conv', 'ConvTranspose', 'Relu', 'Resize']
    """
    g = _Builder(seed)
    c = g.relu(g.conv("x", 3, channels, stride=2))
    c = g.relu(g.conv(g.resize(c), channels, channels))
    g.conv_transpose(c, channels, channels // 2)
    h, w = INPUT_SHAPE[2:]
    return g.model("upsampling", INPUT_SHAPE, (1, channels // 2, 2 * h, 2 * w))


def decoder(seed: int = 0, channels: int = 8):
    """A segmentation decoder's upsampling as PyTorch exports it: a stride-2 convolution with
    ReLU, a ConvTranspose with kernel 3, stride 2, padding 1 and output padding 1 (overlapping
    taps) with ReLU, a 1x1 convolution (16 -> 8 -> 16 pixels).

    >>> [n.op_type for n in decoder().graph.node]
    ['Conv', 'Relu', 'ConvTranspose', 'Relu', 'Conv']
    """
    g = _Builder(seed)
    c = g.relu(g.conv("x", 3, channels, stride=2))
    c = g.relu(g.conv_transpose(c, channels, channels, k=3, stride=2, pad=1, output_padding=1))
    g.conv(c, channels, 4, k=1)
    return g.model("decoder", INPUT_SHAPE, (1, 4, *INPUT_SHAPE[2:]))


#: The models by name.
MODELS: dict[str, Callable] = {"conv_relu": conv_relu, "strided": strided, "residual": residual}


def input_shape(model) -> tuple[int, ...]:
    """The static shape of the model's (single) input."""
    return tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)


def output_scale(qdq_model, index: int = 0) -> float:
    """The quantisation step of a QDQ model's output (the ``index``-th of several): the scale
    of the DequantizeLinear that produces it (to measure differences in steps)."""
    from onnx import numpy_helper

    out = qdq_model.graph.output[index].name
    node = next((n for n in qdq_model.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == out), None)
    if node is None:
        raise ValueError(f"the output {out!r} is not produced by a DequantizeLinear: not a QDQ model's output")
    scale = next(i for i in qdq_model.graph.initializer if i.name == node.input[1])
    return float(numpy_helper.to_array(scale).reshape(-1)[0])


def calibration(model, samples: int = 16, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded standard-normal calibration data for the model's input: ``{name: [samples, *shape]}``."""
    rng = np.random.default_rng(seed)
    name = model.graph.input[0].name
    return {name: rng.standard_normal((samples, *input_shape(model))).astype(np.float32)}


def main(argv: list[str] | None = None) -> int:
    """``python -m tirpat.testing.onnx_cnn NAME OUT.onnx [--calibration calib.npz]``."""
    import argparse

    import onnx

    parser = argparse.ArgumentParser(prog="python -m tirpat.testing.onnx_cnn",
                                     description="Write a small float ONNX CNN with seeded random weights.")
    parser.add_argument("name", choices=sorted(MODELS))
    parser.add_argument("out", help="the .onnx file to write")
    parser.add_argument("--calibration", help="also write seeded calibration data (.npz) here")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights (the calibration data's is seed + 1)")
    args = parser.parse_args(argv)
    for path in filter(None, (args.out, args.calibration)):     # before writing either: one line, not a traceback
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder) or os.path.isdir(path):
            print(f"{parser.prog}: error: {path}: " + ("is a directory" if os.path.isdir(path)
                                                        else f"no such directory '{folder}'"), file=sys.stderr)
            return 1
    model = MODELS[args.name](seed=args.seed)
    onnx.save(model, args.out)
    print(f"wrote {args.out}: the {args.name} CNN, float32, seed {args.seed}")
    if args.calibration:
        with open(args.calibration, "wb") as f:         # exactly that path (np.savez appends .npz)
            np.savez(f, **calibration(model, seed=args.seed + 1))
        print(f"wrote {args.calibration}: calibration data for 'tirpat quantize --calibration'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
