"""Every example runs and checks its own result."""

import pathlib
import runpy

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path):
    runpy.run_path(str(path), run_name="__main__")


def test_demo_runs_and_is_exact(capsys):
    from accel.demo import main

    assert main(["--batch", "16", "--hidden", "32", "48", "16"]) == 0
    out = capsys.readouterr().out
    assert "100.0%" in out and "bit-exact vs numpy: yes" in out and "roofline" in out
