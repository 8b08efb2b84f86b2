"""The examples in the command line's docstrings run and are right."""

import doctest
import importlib

import pytest

import tirpat as tp

MODULES = ["tirpat.cli", "tirpat.cli.command", "tirpat.cli.arrays", "tirpat.cli.progress", "tirpat.cli.output_file"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), extraglobs={"tp": tp}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
