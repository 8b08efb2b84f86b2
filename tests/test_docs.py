"""Every Python code block in the README and docs/ runs; a block that quotes a file
(fenced ```python file=PATH) is still in that file, verbatim."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if (ROOT / "docs").exists() else [ROOT / "README.md"]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_python_blocks_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)         # what an example writes (model.export("resnet.tirpat")) lands here
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(path), "exec"), namespace)  # noqa: S102 - documentation examples


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_quoted_blocks_are_still_in_their_files(path):
    for name, block in re.findall(r"```python file=(\S+)\n(.*?)```", path.read_text(), re.S):
        assert block in (ROOT / name).read_text(), f"{path.name} quotes {name}, which no longer has: {block[:200]}"
