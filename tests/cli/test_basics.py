"""The command line's frame: commands, help with an example, usage errors, ``targets``."""

import json
import re

import pytest
import tvm

import tirpat as tp
from tirpat.cli import commands, main

COMMANDS = sorted(commands())


def test_the_design_commands_are_there():
    assert {"targets", "compile", "run"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_help_shows_an_example(capsys, name):
    with pytest.raises(SystemExit) as exit:
        main([name, "--help"])
    out = capsys.readouterr().out
    assert exit.value.code == 0 and "example:" in out
    assert out.split("example:")[-1].strip().startswith(f"tirpat {name}"), out


def test_top_level_help_lists_the_commands(tirpat, tmp_path):
    result = tirpat("--help", cwd=tmp_path)
    assert result.returncode == 0
    for name in COMMANDS:
        assert re.search(rf"^\s+{name}\s", result.stdout, re.M), result.stdout


def test_no_command_is_a_usage_error(tirpat, tmp_path):
    result = tirpat(cwd=tmp_path)
    assert result.returncode == 2 and "usage: tirpat" in result.stderr


def test_a_usage_error_exits_2_with_one_line(tirpat, error_line, tmp_path):
    line = error_line(tirpat("compile", cwd=tmp_path), "the following arguments are required: MODEL, -t/--target",
                      status=2)
    assert line.startswith("tirpat compile: error:") and "see 'tirpat compile --help'" in line


@pytest.mark.parametrize("args, fragment", [
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["compile", "m.onnx", "-t"], "argument -t/--target: expected one argument"),
    (["run", "m.tirpat", "--seed", "x"], "argument --seed: expected a non-negative integer, got 'x'"),
    (["targets", "--bogus"], "tirpat targets: error: unrecognized arguments: --bogus (see 'tirpat targets --help')"),
    (["run", "m.tirpat", "extra.npz"], "tirpat run: error: unrecognized arguments: extra.npz (see 'tirpat run --help')"),
    (["compile", "m.onnx", "-t", "llvm", "--input-shapes", "x:[a]"], "argument --input-shapes: expected name:[d0,d1,...]"),
])
def test_usage_errors(capsys, args, fragment):
    with pytest.raises(SystemExit) as exit:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit.value.code == 2 and len(err) == 1 and fragment in err[0], err


def test_python_dash_m_is_the_same_program(tirpat, tmp_path):
    result = tirpat("targets", "--json", cwd=tmp_path, module=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(tirpat("targets", "--json", cwd=tmp_path).stdout)


def test_targets_lists_backends_with_options_types_and_defaults(tirpat_inline, tmp_path):
    result = tirpat_inline("targets", cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == ""
    accel = tp.backends()["accel"]
    assert re.search(r"^accel\s", result.stdout, re.M)
    for name, option in accel.options.items():
        assert re.search(rf"-{name}=INT\s+.*\(default {option.default}\)", result.stdout), name
    host, others = result.stdout.split("Host (", 1)[1].split("cannot be the host here:")
    assert host.splitlines()[0].endswith(": llvm"), "only a host tirpat can build and run here is offered"
    assert re.search(r"^  c: TVM's C source generator", others, re.M)
    assert re.search(r"^  cuda, .*opencl.*: a GPU: it runs the kernels a host launches", others, re.M)


def test_targets_json_is_the_registry(tirpat_inline, tmp_path):
    listing = json.loads(tirpat_inline("targets", "--json", cwd=tmp_path).stdout)
    accel = next(b for b in listing["backends"] if b["name"] == "accel")
    assert {o["name"]: (o["type"], o["default"]) for o in accel["options"]} == {
        k: (o.type_name, o.default) for k, o in tp.backends()["accel"].options.items()}
    assert listing["hosts"] == ["llvm"]
    assert set(listing["not_hosts"]) | {"llvm"} == set(tvm.target.Target.list_kinds())


def test_targets_of_one_name(tirpat_inline, error_line, tmp_path):
    llvm = tirpat_inline("targets", "llvm", cwd=tmp_path)
    assert llvm.returncode == 0
    assert "-mattr=A,B,..." in llvm.stdout and "--fast-math" in llvm.stdout and "-num-cores=INT" in llvm.stdout
    assert "-tile=INT" in tirpat_inline("targets", "accel", cwd=tmp_path).stdout
    cuda = tirpat_inline("targets", "cuda", cwd=tmp_path)
    assert cuda.returncode == 0 and cuda.stdout.strip() == ("cuda  TVM target kind 'cuda': cannot be the host "
                                                            "here: a GPU: it runs the kernels a host launches, it is not one")
    error_line(tirpat_inline("targets", "nosuch", cwd=tmp_path), "no backend or TVM target kind named 'nosuch'",
               "registered backends: accel")
