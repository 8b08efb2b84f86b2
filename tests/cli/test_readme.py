"""The README's command-line section works as shown: its commands run, and their output has
the lines the README shows (numbers may differ: the cycle model is allowed to improve)."""

import re
import shlex
import shutil

SECTION = "## Compile and run a model from the command line"


def readme_section(root):
    text = (root / "README.md").read_text()
    assert SECTION in text
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def shown_line_pattern(line: str) -> re.Pattern:
    """The README line as a regex: every number may be another number, and the spaces that
    align columns may be more or fewer."""
    parts = re.split(r"-?\d[\d,.]*", line.strip())
    return re.compile(r"-?\d[\d,.]*".join(r"\s+".join(map(re.escape, re.split(r"\s+", p))) for p in parts))


def assert_shows(shown: str, actual: str) -> None:
    """Each non-blank line of ``shown`` matches a line of ``actual``, in order."""
    lines = iter(actual.splitlines())
    for line in filter(str.strip, shown.splitlines()):
        pattern = shown_line_pattern(line)
        assert any(pattern.fullmatch(candidate.strip()) for candidate in lines), (line, actual)


def test_readme_commands_work_as_shown(tirpat, repo_root, tmp_path):
    section = readme_section(repo_root)
    commands = [shlex.split(line, comments=True) for line in re.findall(r"```bash\n(.*?)```", section, re.S)[0].splitlines()]
    commands = [c for c in commands if c]
    outputs = re.findall(r"```text\n(.*?)```", section, re.S)
    assert [c[:2] for c in commands] == [["tirpat", "targets"], ["tirpat", "compile"], ["tirpat", "run"]]
    shutil.copytree(repo_root / "examples" / "models", tmp_path / "examples" / "models")
    results = []
    for command in commands:
        result = tirpat(*command[1:], cwd=tmp_path)
        assert result.returncode == 0 and result.stderr == "", (command, result.stderr)
        results.append(result.stdout)
    assert "accel" in results[0]
    assert_shows(outputs[0], results[1])          # compile's report
    assert_shows(outputs[1], results[2])          # run's outputs and profile
    for written in ("mlp.tirpat", "mlp.json", "mlp.png"):
        assert (tmp_path / written).stat().st_size > 0


def test_numbers_in_shown_lines_are_wildcards():
    assert shown_line_pattern("1641 cycles, roofline 640 (39%)").fullmatch("1,702 cycles, roofline 641 (38%)")
    assert not shown_line_pattern("on accel: 100 (100.0%)").fullmatch("on host: 100 (100.0%)")
    assert shown_line_pattern("2  matmul + bias     253").fullmatch("2  matmul + bias    1253")


def test_the_section_names_every_command(repo_root):
    """A new user reads only this section and --help: every command is at least named here."""
    from tirpat.cli import commands

    section = readme_section(repo_root)
    missing = [name for name in commands() if f"tirpat {name}" not in section]
    assert missing == [], f"the README's command-line section never mentions {missing}"


def test_readme_states_the_exit_statuses_the_commands_give(tirpat, tirpat_inline, repo_root, example_mlp, tmp_path):
    """The README's rule (1: a problem with the input; 2: a usage error) for the cases it names."""
    text = " ".join(readme_section(repo_root).split())
    assert "Exit status 1 is a problem with the input" in text and "exit status 2 is a usage error" in text
    assert "a malformed `--input-shapes`, a `--seed` or `--trials` that is not a number" in text
    usage = [["compile", example_mlp, "-t", "accel, llvm", "--input-shapes", "x:[a,3]"],
             ["run", "m.tirpat", "--seed", "-5"],
             ["tune", example_mlp, "-t", "accel, llvm", "--trials", "0", "--records", "r"]]
    for n, args in enumerate(usage):
        result = (tirpat if n == 0 else tirpat_inline)(*args, cwd=tmp_path)     # the console script once
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, (args, result.stderr)
    (tmp_path / "notes.txt").write_text("keep me")
    for n, args in enumerate([["compile", "missing.py", "-t", "accel, llvm"],
                              ["compile", example_mlp, "-t", "accel -tile=7, llvm"],
                              ["compile", example_mlp, "-t", "accel, llvm", "-o", "notes.txt"]]):
        result = (tirpat if n == 0 else tirpat_inline)(*args, cwd=tmp_path)
        assert result.returncode == 1 and len(result.stderr.splitlines()) == 1, (args, result.stderr)
