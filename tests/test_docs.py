"""Every Python code block in the README and docs/ runs, and what it prints is what the page
quotes: a ```text block right after a ```python block (nothing but blank lines between) is
that block's output, compared line for line; a line of just ``...`` in the quote stands for
any number of printed lines (addresses, timings, a long listing shortened). A block that
quotes a file (fenced ```python file=PATH) is still in that file, verbatim."""

import contextlib
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if (ROOT / "docs").exists() else [ROOT / "README.md"]
FENCE = re.compile(r"^```(?P<lang>\S*)(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)


def runnable_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line, code, quoted output or None) for every ```python block that is not a file quote.

    >>> runnable_blocks("```python\\nprint(1)\\n```\\n\\n```text\\n1\\n```\\n```python\\npass\\n```\\n")
    [(1, 'print(1)\\n', '1\\n'), (8, 'pass\\n', None)]
    """
    fences = list(FENCE.finditer(text))
    blocks = []
    for k, fence in enumerate(fences):
        if fence["lang"] != "python" or fence["info"].strip():
            continue
        after = fences[k + 1] if k + 1 < len(fences) else None
        quoted = (after["body"] if after is not None and after["lang"] == "text"
                  and not text[fence.end():after.start()].strip() else None)
        blocks.append((text.count("\n", 0, fence.start()) + 1, fence["body"], quoted))
    return blocks


def matches_quote(printed: str, quoted: str) -> bool:
    """Whether ``printed`` reads as ``quoted``, where a quoted line ``...`` stands for any lines.

    >>> matches_quote("a\\n0x7f3a\\nb\\n", "a\\n...\\nb\\n"), matches_quote("a\\nc\\n", "a\\n...\\nb\\n")
    (True, False)
    """
    parts = ["(?:.*\n)*?" if line == "..." else re.escape(line) + "\n" for line in quoted.splitlines()]
    return re.fullmatch("".join(parts), printed) is not None


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_python_blocks_run_and_print_what_the_page_quotes(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)         # what an example writes (model.export("resnet.tirpat")) lands here
    namespace: dict = {}
    for line, code, quoted in runnable_blocks(path.read_text()):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile("\n" * line + code, str(path), "exec"), namespace)  # noqa: S102 - documentation examples
        if quoted is not None:
            assert matches_quote(printed.getvalue(), quoted), (
                f"{path.name}:{line}: the block prints\n{printed.getvalue()}\nbut the page quotes\n{quoted}")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_quoted_blocks_are_still_in_their_files(path):
    for name, block in re.findall(r"```python file=(\S+)\n(.*?)```", path.read_text(), re.S):
        assert block in (ROOT / name).read_text(), f"{path.name} quotes {name}, which no longer has: {block[:200]}"
