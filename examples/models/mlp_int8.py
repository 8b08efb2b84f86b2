"""A two-layer int8 MLP as a Relax IRModule: the bundled example model of the README.

``tirpat compile examples/models/mlp_int8.py -t "accel, llvm"`` reads the IRModule named
``Module``: one input ``x`` (16 x 64, int8); the weights are seeded random constants bound
into the module, so the compiler re-lays them out once. Layer 1 is dense + bias + ReLU +
requantise back to int8 (``clip((acc + 2^7) >> 8, -128, 127)``), layer 2 dense + bias with
int32 logits.
"""

import numpy as np
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class MLP:
    @R.function
    def main(x: R.Tensor((16, 64), "int8"), w1: R.Tensor((128, 64), "int8"), b1: R.Tensor((128,), "int32"),
             w2: R.Tensor((16, 128), "int8"), b2: R.Tensor((16,), "int32")) -> R.Tensor((16, 16), "int32"):
        with R.dataflow():
            h = R.matmul(x, R.permute_dims(w1), out_dtype="int32")
            h = R.nn.relu(R.add(h, b1))
            h = R.right_shift(R.add(h, R.const(128, "int32")), R.const(8, "int32"))
            h = R.astype(R.clip(h, -128, 127), "int8")
            y = R.add(R.matmul(h, R.permute_dims(w2), out_dtype="int32"), b2)
            R.output(y)
        return y


_rng = np.random.default_rng(0)
_WEIGHTS = {
    "w1": _rng.integers(-128, 128, (128, 64), dtype=np.int8),
    "b1": _rng.integers(-4096, 4096, (128,), dtype=np.int32),
    "w2": _rng.integers(-128, 128, (16, 128), dtype=np.int8),
    "b2": _rng.integers(-4096, 4096, (16,), dtype=np.int32),
}
Module = relax.transform.BindParams("main", _WEIGHTS)(MLP)
