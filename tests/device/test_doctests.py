"""The examples in the device kit's docstrings run and are right."""

import doctest
import importlib

import pytest

MODULES = ["tirpat.device", "tirpat.device.buffers", "tirpat.device.session", "tirpat.device.planner",
           "tirpat.device.trace", "tirpat.device.memory", "tirpat.device.instr"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
