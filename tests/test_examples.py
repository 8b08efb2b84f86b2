"""Every example runs and checks its own result."""

import pathlib
import re
import runpy

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path):
    runpy.run_path(str(path), run_name="__main__")


def test_demo_runs_and_is_exact(capsys):
    from accel.demo import main

    assert main(["--batch", "1", "--size", "8", "--channels", "3", "16", "32", "--classes", "4"]) == 0
    out = capsys.readouterr().out
    assert "100.0%" in out and "bit-exact vs numpy: yes" in out and "roofline" in out
    assert "im2col on the CPU" in out and "im2col gather by strided, padded LOADs" in out
    # three convolutions and a dense: no one epilogue in the headline, each GEMM's in its line
    assert re.search(r"^  accel: main \(tir\): main, [\d,]+ MACs$", out, re.M), out
    assert "offloaded T_matmul_NT: 1x1x4x512 + epilogue bias" in out


def test_demo_nchw(capsys):
    from accel.demo import main

    assert main(["--batch", "1", "--size", "6", "--channels", "16", "16", "--layout", "NCHW"]) == 0
    out = capsys.readouterr().out
    assert "bit-exact vs numpy: yes" in out and "transposes the result from channels-last to NCHW" in out


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--classes", "0"], ["--channels", "3", "-1"], ["--size", "x"],
                                  ["--blocks", "-1"]])
def test_demo_refuses_bad_counts_in_one_line(argv, capsys):
    from accel.demo import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {argv[0]}: expected an integer of at least" in err and "Traceback" not in err


@pytest.mark.parametrize("model", [[], ["--model"]])
def test_demo_refuses_a_timeline_it_cannot_write_before_compiling(model, tmp_path, capsys):
    from accel.demo import main

    assert main([*model, "--timeline", str(tmp_path / "no" / "t.png")]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"python -m accel: error: --timeline {tmp_path / 'no' / 't.png'}: no such directory " \
                           f"'{tmp_path / 'no'}'\n"
    assert captured.out == ""           # refused before any compile
    assert main(["--timeline", str(tmp_path)]) == 1 and "is a directory" in capsys.readouterr().err
