"""Collecting the tests stays cheap: every xdist worker collects every test file, so what a
test module does at import, each worker pays, before it runs anything.

The one known cost: importing ``tvm.s_tir.tensor_intrin`` parses TVM's ~600 TVMScript
intrinsics (~40 s). Only the tests that use the intrinsics import it, when they run.
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


def _intrinsic_test_files() -> list:
    """The test files that reach TVM's intrinsics, directly or through tirpat.testing.intrin."""
    return [str(p) for p in sorted((ROOT / "tests").rglob("test_*.py"))
            if any(s in p.read_text() for s in ("tensor_intrin", "testing.intrin"))]


def test_collecting_the_intrinsic_tests_does_not_import_tensor_intrin():
    files = _intrinsic_test_files()
    assert any(f.endswith("tests/tirpat/test_tensorize_peer.py") for f in files), files
    done = subprocess.run([sys.executable, "-c", COLLECT, *files], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "imported: []" in done.stdout, done.stdout
