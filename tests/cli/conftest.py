"""The real ``tirpat`` console script, run in subprocesses in temporary directories."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE_MLP = ROOT / "examples" / "models" / "mlp_int8.py"


def console_script() -> str:
    """The installed ``tirpat`` script of this interpreter (``pip install -e .`` makes it)."""
    beside = pathlib.Path(sys.executable).with_name("tirpat")
    found = str(beside) if beside.exists() else shutil.which("tirpat")
    assert found, "the tirpat console script is not installed: pip install -e '.[test]'"
    return found


def environment() -> dict:
    """This checkout first on the path (a worktree's code, not the editable install's)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("TIRPAT_DEBUG", None)
    return env


def run_tirpat(*args, cwd, timeout=600, module=False, **kwargs) -> subprocess.CompletedProcess:
    """``tirpat ARGS`` (or ``python -m tirpat ARGS``) in ``cwd``, output captured (a pipe, not a terminal)."""
    command = [sys.executable, "-m", "tirpat"] if module else [console_script()]
    return subprocess.run([*command, *map(str, args)], cwd=cwd, env=environment(), capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str, status: int = 1) -> str:
    """The run failed with ``status`` and said so in one line on stderr containing every fragment."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli")


@pytest.fixture(scope="session")
def tirpat():
    """``tirpat(*args, cwd=...)``: run the console script; see :func:`run_tirpat`."""
    return run_tirpat


@pytest.fixture(scope="session")
def error_line():
    """``error_line(result, *fragments, status=1)``: see :func:`assert_one_line_error`."""
    return assert_one_line_error


@pytest.fixture(scope="session")
def example_mlp():
    return EXAMPLE_MLP


@pytest.fixture(scope="session")
def script():
    """``(path of the tirpat console script, the environment to run it in)``."""
    return console_script(), environment()


@pytest.fixture(scope="session")
def repo_root():
    return ROOT
