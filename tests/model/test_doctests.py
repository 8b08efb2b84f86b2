"""The examples in the model level's docstrings (and accel's Backend hooks) run and are right."""

import doctest
import importlib

import pytest
import tvm
from tvm import relax

import tirpat as tp

MODULES = ["tirpat.model.partition", "tirpat.model.report", "tirpat.model.pipeline", "tirpat.model.prepack",
           "tirpat.model.compiled", "tirpat.model.kernel", "tirpat.model.build", "tirpat.model.native", "tirpat.model.host_cpu",
           "tirpat.model.host_inline", "tirpat.model.host_loops", "tirpat.model.cpu_loops", "tirpat.model.archive", "tirpat.model.storages",
           "tirpat.model.shapes", "tirpat.model.integerize",
           "tirpat.model.integerize.fixed_point", "tirpat.model.integerize.rules", "tirpat.model.integerize.pads",
           "tirpat.model.integerize.tables", "accel.compiler.patterns", "accel.backend"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS,
                             extraglobs={"tp": tp, "tvm": tvm, "relax": relax})
    assert result.failed == 0
