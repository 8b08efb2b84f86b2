"""A small int8 CNN as a Relax IRModule: the README's tuning example.

``tirpat tune examples/models/cnn_int8.py -t "accel, llvm" --trials 24 --records DIR`` reads
the IRModule named ``Module``: one input ``x`` (int8, NHWC 2 x 16 x 16 x 32); a 3x3 conv2d
with stride 2 to 64 channels + bias + ReLU + requantise back to int8, then a dense head with
bias giving int32 logits. The weights are seeded random constants bound into the module.
The convolution's output is 8 x 8: one output row is half a 16-row tile, which the
heuristic schedule pads and a tuned one need not.
"""

import numpy as np
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class CNN:
    @R.function
    def main(x: R.Tensor((2, 16, 16, 32), "int8"), w: R.Tensor((3, 3, 32, 64), "int8"), b: R.Tensor((64,), "int32"),
             wd: R.Tensor((10, 4096), "int8"), bd: R.Tensor((10,), "int32")) -> R.Tensor((2, 10), "int32"):
        with R.dataflow():
            h = R.nn.conv2d(x, w, strides=2, padding=1, data_layout="NHWC", kernel_layout="HWIO", out_dtype="int32")
            h = R.nn.relu(R.add(h, b))
            h = R.right_shift(R.add(h, R.const(128, "int32")), R.const(8, "int32"))
            h = R.astype(R.clip(h, -128, 127), "int8")
            y = R.add(R.matmul(R.reshape(h, (2, 4096)), R.permute_dims(wd), out_dtype="int32"), bd)
            R.output(y)
        return y


_rng = np.random.default_rng(0)
_WEIGHTS = {
    "w": _rng.integers(-128, 128, (3, 3, 32, 64), dtype=np.int8),
    "b": _rng.integers(-4096, 4096, (64,), dtype=np.int32),
    "wd": _rng.integers(-128, 128, (10, 4096), dtype=np.int8),
    "bd": _rng.integers(-4096, 4096, (10,), dtype=np.int32),
}
Module = relax.transform.BindParams("main", _WEIGHTS)(CNN)
