"""Where ``tirpat compile`` writes, checked before any work: next to MODEL by default (as
``tirpat quantize`` does), never onto a device, a directory, MODEL itself or a file that is
not a .tirpat (--report: .json); and ``--entry`` for a Relax function other than ``main``.
``run`` and ``quantize`` outputs: in test_compile_run.py and test_quantize.py."""

import shutil

import numpy as np
import pytest

TARGET = "accel, llvm"


def test_the_default_output_is_next_to_the_model(tirpat, example_mlp, tmp_path):
    (tmp_path / "sub").mkdir()
    shutil.copy(example_mlp, tmp_path / "sub" / "m.py")
    (tmp_path / "m.tirpat").write_bytes(b"a file of the user's, in the working directory")
    result = tirpat("compile", "sub/m.py", "-t", TARGET, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("wrote sub/m.tirpat")
    assert (tmp_path / "sub" / "m.tirpat").stat().st_size > 0
    assert (tmp_path / "m.tirpat").read_bytes() == b"a file of the user's, in the working directory"


def test_compile_help_says_where_the_output_goes(tirpat_inline, tmp_path):
    text = " ".join(tirpat_inline("compile", "--help", cwd=tmp_path).stdout.split())
    assert "default: next to MODEL, its name with .tirpat" in text
    assert "sub/m.onnx -> sub/m.tirpat" in text and "replaced only if its name ends in .tirpat" in text


def test_a_device_as_output_is_named_before_compiling(tirpat_inline, error_line, example_mlp, tmp_path):
    """It used to compile, then fail with "error: error: argument out of range"."""
    line = error_line(tirpat_inline("compile", example_mlp, "-t", TARGET, "-o", "/dev/null", cwd=tmp_path),
                      "tirpat compile: error: /dev/null: not a regular file, so -o cannot write there: a .tirpat is "
                      "a zip archive")
    assert line.count("error:") == 1


@pytest.mark.parametrize("args, fragment", [
    (["-o", "notes.txt"], "notes.txt: exists and its name does not end in .tirpat; not replacing it"),
    (["-o", "m.py"], "m.py: -o names MODEL itself"),
    (["-o", "somedir"], "somedir: is a directory; -o names the file to write"),
    (["--report", "somedir"], "somedir: is a directory; --report names the file to write"),
    (["--report", "m.py"], "m.py: --report names MODEL itself"),
    (["--report", "notes.txt"], "notes.txt: exists and its name does not end in .json; not replacing it"),
    (["-o", "x.tirpat", "--report", "x.tirpat"], "x.tirpat: --report and -o name the same file"),
])
def test_outputs_are_checked_before_compiling(tirpat_here, example_mlp, tmp_path, args, fragment):
    shutil.copy(example_mlp, tmp_path / "m.py")
    (tmp_path / "notes.txt").write_text("keep me")
    (tmp_path / "somedir").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    status, out, err = tirpat_here("compile", "m.py", "-t", TARGET, *args)
    assert status == 1 and out == "" and err.count("\n") == 1 and fragment in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "nothing is written"
    assert (tmp_path / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("link", ["hard", "symbolic"])
@pytest.mark.parametrize("option, name", [("-o", "out.tirpat"), ("--report", "rep.json")])
def test_an_output_that_is_model_under_another_name_is_refused(tirpat_here, example_mlp, tmp_path, link, option,
                                                               name):
    """A hard link to MODEL named like the output: compile replaced MODEL's contents with the
    report (the check compared paths after symlinks, not the files)."""
    shutil.copy(example_mlp, tmp_path / "m.py")
    (tmp_path / name).hardlink_to(tmp_path / "m.py") if link == "hard" else (tmp_path / name).symlink_to("m.py")
    before = (tmp_path / "m.py").read_bytes()
    status, out, err = tirpat_here("compile", "m.py", "-t", TARGET, option, name)
    assert (status, out) == (1, "") and err == f"tirpat compile: error: {name}: {option} names MODEL itself; " \
                                              f"choose another {option}\n"
    assert (tmp_path / "m.py").read_bytes() == before


def test_two_outputs_that_are_one_file_are_refused(tirpat_here, example_mlp, tmp_path):
    shutil.copy(example_mlp, tmp_path / "m.py")
    (tmp_path / "x.tirpat").write_bytes(b"an old model")
    (tmp_path / "x.json").hardlink_to(tmp_path / "x.tirpat")
    status, out, err = tirpat_here("compile", "m.py", "-t", TARGET, "-o", "x.tirpat", "--report", "x.json")
    assert status == 1 and "x.json: --report and -o name the same file" in err, err
    assert (tmp_path / "x.tirpat").read_bytes() == b"an old model"


def test_run_output_that_is_its_inputs_under_another_name_is_refused(tmp_path):
    """The check is shared by every command: ``run -o`` a hard link to ``--inputs``."""
    from tirpat.cli.command import CommandError
    from tirpat.cli.output_file import check_output

    np.savez(tmp_path / "in.npz", x=np.zeros(3))
    (tmp_path / "out.npz").hardlink_to(tmp_path / "in.npz")
    with pytest.raises(CommandError, match="out.npz: -o names --inputs itself"):
        check_output(tmp_path / "out.npz", "-o", ".npz", {"MODEL": tmp_path / "m.tirpat", "--inputs": tmp_path / "in.npz"})
    (tmp_path / "other.npz").write_bytes((tmp_path / "in.npz").read_bytes())      # equal contents, another file
    check_output(tmp_path / "other.npz", "-o", ".npz", {"--inputs": tmp_path / "in.npz"})


NN_MODULE = """
from tvm.relax.frontend import nn

class MLP(nn.Module):
    def __init__(self):
        self.fc1 = nn.Linear(64, 32, bias=False, dtype="int8", out_dtype="int32")

    def forward(self, x):
        return self.fc1(x)

Module, params = MLP().export_tvm(spec={"forward": {"x": nn.spec.Tensor((8, 64), "int8")}})
"""


def test_entry_compiles_a_function_not_named_main(tirpat_inline, error_line, tmp_path):
    (tmp_path / "nnmod.py").write_text(NN_MODULE)
    error_line(tirpat_inline("compile", "nnmod.py", "-t", TARGET, cwd=tmp_path),
               "nnmod.py: the IRModule has no Relax function 'main' to compile; its Relax functions are forward: "
               "name one with --entry")
    compiled = tirpat_inline("compile", "nnmod.py", "-t", TARGET, "--entry", "forward", cwd=tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (8, 64), dtype=np.int8)
    w = rng.integers(-128, 128, (32, 64), dtype=np.int8)
    np.savez(tmp_path / "in.npz", x=x, fc1_weight=w)
    ran = tirpat_inline("run", "nnmod.tirpat", "--inputs", "in.npz", "-o", "out.npz", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["output_0"], x.astype(np.int32) @ w.T.astype(np.int32))


def test_the_report_may_go_to_a_stream(tirpat, example_mlp, tmp_path):
    result = tirpat("compile", example_mlp, "-t", TARGET, "-o", "m.tirpat", "--report", "/dev/stdout", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"macs"' in result.stdout and (tmp_path / "m.tirpat").stat().st_size > 0
