"""The examples of docs/runtime.md that run without a server run as shown and print what
their comments claim: the *Workflows* section's (in-memory store, an in-process worker), in
docs/runtime.md and in its Chinese translation docs/zh/runtime.md."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
# Each page and the title its Workflows section starts with.
WORKFLOWS = {"runtime.md": "Workflows", "zh/runtime.md": "工作流"}


def section(doc: str, title: str) -> str:
    start = doc.index(f"## {title}")
    end = doc.find("\n## ", start + 1)
    return doc[start : end if end != -1 else len(doc)]


@pytest.mark.parametrize("page", WORKFLOWS)
def test_the_workflows_example_runs_and_prints_what_it_says(page: str) -> None:
    doc = (DOCS / page).read_text("utf-8")
    (code,) = re.findall(r"```python\n(.*?)```", section(doc, WORKFLOWS[page]), re.S)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"docs/{page}#workflows", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines == ["bytes: 35", str(["succeeded"] * 4), "stopped 0"]
    claimed = re.findall(r"# (bytes: 35|all succeeded|stopped 0)", code)
    assert claimed == ["bytes: 35", "all succeeded", "stopped 0"]
