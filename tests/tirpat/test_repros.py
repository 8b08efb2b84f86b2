"""The reproducers of issue 17 (in the shared repros directory), run as they are: each exits
0 once tirpat's build agrees with ``Schedule.tensorize``'s and 1 while it does not.

- ``pipeline_reruns_lowering``: a software-pipelined, storage-aligned staging buffer; block
  lowering run twice re-applied the alignment to the wrong axis (wrong results);
- ``view_hides_vthread_accumulator``: an accumulator under a virtual thread reached through a
  buffer view was shared by both virtual threads (wrong results);
- ``view_of_warp_memory``: TVM's mma fill/store intrinsics on warp memory; the CUDA build
  failed, and must now give tensorize's source (no GPU needed).
"""

import contextlib
import io
import pathlib
import runpy

import pytest

REPROS = pathlib.Path("/work/shared/repros")
NAMES = ["pipeline_reruns_lowering", "view_hides_vthread_accumulator", "view_of_warp_memory"]


@pytest.mark.parametrize("name", NAMES)
def test_reproducer_exits_0(name):
    path = REPROS / f"{name}.py"
    if not path.exists():
        pytest.skip(f"{path} is not on this machine")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(path), run_name="__main__")
    assert exit_.value.code == 0, out.getvalue()
