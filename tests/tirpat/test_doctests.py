"""The examples in the docstrings of tirpat's TIR core and testing helpers run and are right.
(The pipeline, device and model levels run theirs in their own tests.)"""

import doctest
import importlib

import numpy as np
import pytest
import tvm

import tirpat as tp

MODULES = ["tirpat"] + [f"tirpat.tir.{m}" for m in (
    "analysis", "binding", "canonical", "copy", "engine", "explain", "index_dtype", "inlining", "lowering", "match",
    "module_rule", "pattern", "region", "rewrite", "scan", "schedule", "script_pattern", "statement", "wrapping")] + ["tirpat.testing", "tirpat.testing.reference",
                                                              "tirpat.testing.strategies",
                                                              "tirpat.testing.differential",
                                                              "tirpat.testing.int8_models",
                                                              "tirpat.testing.onnx_qdq"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"tp": tp, "tvm": tvm, "np": np},
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
    assert result.attempted > 0, f"{name} has no runnable example"
