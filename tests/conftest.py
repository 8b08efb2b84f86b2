import inspect
import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# One thread per test process: xdist runs one worker per core, and TVM's thread pool and BLAS
# each starting a thread per core in every worker oversubscribe the cores (waiting threads
# spin): measured, the same tests took a quarter more CPU. The workers xdist starts (and the
# programs tests start) inherit these; a value set by whoever runs the suite is kept.
for _threads in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

# TVMScript's parser calls inspect.stack() for each function it parses, and inspect looks up
# each frame's module by its file. A frame of the import system (`<frozen importlib._bootstrap>`,
# on the stack while a module holding TVMScript is imported: TVM's tensor intrinsics, a test
# file's kernels) has a file no module lists, so each lookup walked all of sys.modules again:
# importing tvm.s_tir.tensor_intrin made 30,000 such walks, 62 s; with the two frozen modules of
# the import system entered in inspect's file-to-module cache (the module the walk would have
# found, had they a __file__; their frames still have no source) 15 s.
for _frozen in ("importlib._bootstrap", "importlib._bootstrap_external"):
    getattr(inspect, "modulesbyfile", {}).setdefault(f"<frozen {_frozen}>", _frozen)

# Compiling with TVM takes tens of milliseconds, so the default 200 ms deadline is meaningless here.
settings.register_profile(
    "dev", deadline=None, max_examples=20, suppress_health_check=[HealthCheck.too_slow]
)
# CI is deterministic: a red run must be reproducible from its log. Its examples per test (where a
# test does not set its own) are what fits the suite in CI's 15 minutes on 2 cores.
settings.register_profile(
    "ci",
    deadline=None,
    max_examples=20,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def tirpat_here(capsys, monkeypatch, tmp_path):
    """``tirpat_here(*args)``: :func:`tirpat.cli.main` in this process, in ``tmp_path``:
    ``(status, stdout, stderr)``. For variations of a case the console script covers."""
    from tirpat.cli import main

    monkeypatch.chdir(tmp_path)

    def run(*args):
        capsys.readouterr()
        try:
            status = main([str(a) for a in args])
        except SystemExit as exit:
            status = exit.code
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.fixture
def tirpat_inline(tirpat_here, monkeypatch):
    """``tirpat_inline(*args, cwd=...)``: :func:`tirpat.cli.main` in this process, in ``cwd``
    (the current directory from then until the test ends), as a ``CompletedProcess`` like
    the console script's: for the variations of a case the console script covers (each
    subprocess starts Python and imports TVM again, one to three seconds of CPU)."""

    def run(*args, cwd):
        monkeypatch.chdir(cwd)
        status, out, err = tirpat_here(*args)
        return subprocess.CompletedProcess(["tirpat", *map(str, args)], status, out, err)

    return run


@pytest.fixture
def plain_cpu(monkeypatch):
    """This CPU, as tirpat's host check sees it, has only the features of LLVM's generic x86-64
    (tests of -mcpu/-mattr refusals that must not depend on the machine's CPU)."""
    from tvm.target import Target

    from tirpat.model import host_cpu

    generic = frozenset(host_cpu.features(Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu"})))
    monkeypatch.setattr(host_cpu, "host_features", lambda: generic)
    return generic


@pytest.fixture
def ctrl_c():
    """SIGINT raises ``KeyboardInterrupt`` in this process during the test, and a program it
    starts handles SIGINT as Python does: whoever started the suite (a background job of a
    non-interactive shell, a CI runner) may have left SIGINT ignored, which a process and its
    children inherit, and a tune then rightly ignores Ctrl-C as well."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# -- the longest test files first ------------------------------------------------------------
# xdist hands each worker whole files (--dist loadfile) in collection order
# (--no-loadscope-reorder): the longest first, so that the run does not end with one long file
# on one core while the others idle. The seconds are measured: `TIRPAT_TEST_DURATIONS=1
# python -m pytest` writes them again. A file not listed (a new one) counts as longest.
DURATIONS = Path(__file__).with_name("durations.json")


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    if not DURATIONS.exists():
        return
    seconds = json.loads(DURATIONS.read_text())
    # stable: the tests of one file keep their order
    items.sort(key=lambda item: -seconds.get(_file_of(item.nodeid), float("inf")))


_measured: dict = defaultdict(float)


def pytest_runtest_logreport(report):
    if os.environ.get("TIRPAT_TEST_DURATIONS"):
        _measured[_file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session):
    # in xdist's controller (which hears every worker's reports) or a run of one process
    if os.environ.get("TIRPAT_TEST_DURATIONS") and _measured and not hasattr(session.config, "workerinput"):
        ordered = dict(sorted(((f, round(t, 1)) for f, t in _measured.items()), key=lambda kv: -kv[1]))
        DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n")


# -- the files that use TVM's tensor intrinsics run on one worker -----------------------------
# Importing tvm.s_tir.tensor_intrin takes ~40 s (TVMScript parsing of TVM's intrinsics), paid by
# each process that runs one of these files (collection never imports it: tests/test_collection.py).
# xdist hands them out as one unit of work, so that one worker pays it, once.
TENSOR_INTRIN_FILES = ("tests/tirpat/test_tensorize_peer.py", "tests/tirpat/test_intrin_coverage.py",
                       "tests/tirpat/test_intrin_e2e.py")
# The documentation pages whose examples import them (tests/test_docs.py runs each page's
# examples as tests named by the page): their tests join the same unit.
TENSOR_INTRIN_PAGES = tuple(sorted(page.name for page in (Path(__file__).parent.parent / "docs").glob("*.md")
                                   if "tensor_intrin" in page.read_text()))


def xdist_scope(nodeid: str) -> str:
    """The unit of xdist's work ``nodeid`` belongs to: its file, or all of TENSOR_INTRIN_FILES
    and the tests of the pages TENSOR_INTRIN_PAGES."""
    file = _file_of(nodeid)
    if file in TENSOR_INTRIN_FILES or (file == "tests/test_docs.py" and nodeid.endswith(
            tuple(f"[{page}]" for page in TENSOR_INTRIN_PAGES))):
        return "tensor_intrin"
    return file


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own scheduler, which would answer
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return Scheduling(config, log)
