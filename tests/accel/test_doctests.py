"""The examples in accel's docstrings run and are right."""

import doctest
import importlib

import pytest

MODULES = ["accel", "accel.hw.config", "accel.hw.errors", "accel.hw.isa", "accel.hw.emitter", "accel.hw.tokens",
           "accel.hw.timing", "accel.hw.cycles", "accel.hw.sim", "accel.hw.fused", "accel.hw.kernels", "accel.hw.stream", "accel.hw.stats", "accel.hw.runtime", "accel.hw.instructions",
           "accel.compiler.blocks", "accel.compiler.conv", "accel.compiler.rules", "accel.compiler.schedule",
           "accel.compiler.tuning",
           "accel.compiler.wrapping", "accel.compiler.build", "accel.compiler.pooling",
           "accel.compiler.elementwise", "accel.compiler.upsample", "accel.compiler.prelowered",
           "accel.compiler.groups", "accel.compiler.chains", "accel.compiler.depthwise"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
