"""Collecting the tests stays cheap: every xdist worker collects every test file, so what a
test module does at import, each worker pays, before it runs anything.

The one known cost: importing ``tvm.s_tir.tensor_intrin`` parses TVM's ~600 TVMScript
intrinsics (~40 s). Only the tests that use the intrinsics import it, when they run, and
xdist runs them on one worker (tests/conftest.py).
"""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Collects the test files given and prints which tensor_intrin modules that imported.
COLLECT = """
import sys
import pytest
code = pytest.main(["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", *sys.argv[1:]])
print("imported:", sorted(m for m in sys.modules if m.startswith("tvm.s_tir.tensor_intrin")))
sys.exit(code)
"""


def _conftest(config):
    """tests/conftest.py, as pytest loaded it."""
    path = str(ROOT / "tests" / "conftest.py")
    return next(p for p in config.pluginmanager.get_plugins() if getattr(p, "__file__", None) == path)


def test_collecting_the_intrinsic_tests_does_not_import_tensor_intrin(pytestconfig):
    files = [str(ROOT / f) for f in _conftest(pytestconfig).TENSOR_INTRIN_FILES]
    done = subprocess.run([sys.executable, "-c", COLLECT, *files], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "imported: []" in done.stdout, done.stdout


class _LoadFileConfig:
    """What xdist's scheduler reads of the config of a ``-n 2 --dist loadfile`` run."""

    def getvalue(self, name):
        return {"dist": "loadfile", "tx": ["2*popen"]}[name]


def test_the_intrinsic_tests_are_one_unit_of_xdist_work(pytestconfig):
    """Every test file that reaches TVM's intrinsics (directly or through
    tirpat.testing.intrin) is listed, and so is the documentation page whose examples import them;
    the scheduler xdist is given hands them out as one unit (the page's tests with them); other
    files, and the other pages' tests, stay units of their own."""
    here = pathlib.Path(__file__).resolve()
    using = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
             if p != here and any(s in p.read_text() for s in ("tensor_intrin", "testing.intrin"))}
    assert using == set(_conftest(pytestconfig).TENSOR_INTRIN_FILES)
    scheduler = pytestconfig.hook.pytest_xdist_make_scheduler(config=_LoadFileConfig(), log=None)
    pages = [f"tests/test_docs.py::test[{page}]" for page in _conftest(pytestconfig).TENSOR_INTRIN_PAGES]
    assert pages == ["tests/test_docs.py::test[tensor-intrinsics.md]"]
    assert len({scheduler._split_scope(f"{f}::test[x]") for f in using} | {scheduler._split_scope(p) for p in pages}) == 1
    assert scheduler._split_scope("tests/test_docs.py::test[README.md]") == "tests/test_docs.py"
    assert scheduler._split_scope("tests/test_collection.py::test[x]") == "tests/test_collection.py"
