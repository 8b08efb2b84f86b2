import pathlib
import sys
from typing import Any, NamedTuple

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))


class QuantisedCNN(NamedTuple):
    """A QDQ model, its Relax import, the integerised module, the warnings integerize gave,
    and the integerised module on llvm's VM."""

    qdq: Any
    mod: Any
    integer: Any
    warnings: list
    vm: Any


@pytest.fixture(scope="session")
def quantised_cnn():
    """``quantised_cnn(name, seed, per_channel=False)``: a CNN of ``tirpat.testing.onnx_cnn``
    quantised by ``tp.quantize`` (16 calibration samples), imported, integerised (the warnings
    it gave recorded) and compiled for llvm; made once per session, since the quantisation and
    the llvm build take seconds and several test files check the same models."""
    import warnings

    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    import tirpat as tp
    from tirpat.testing import onnx_cnn

    made = {}

    def get(name: str, seed: int, per_channel: bool = False) -> QuantisedCNN:
        key = (name, seed, per_channel)
        if key not in made:
            model = onnx_cnn.MODELS[name](seed=seed)
            qdq = tp.quantize(model, onnx_cnn.calibration(model, 16), per_channel=per_channel)
            mod = from_onnx(qdq, keep_params_in_input=False)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                integer = tp.integerize()(mod)
            made[key] = QuantisedCNN(qdq, mod, integer, caught,
                                     relax.VirtualMachine(tvm.compile(integer, "llvm"), tvm.cpu()))
        return made[key]

    return get
