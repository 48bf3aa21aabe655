"""The examples of docs/runtime.md that run without a server run as shown and print what
their comments claim: the *Workflows* section's (in-memory store, an in-process worker)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = (Path(__file__).resolve().parents[1] / "docs" / "runtime.md").read_text("utf-8")


def section(title: str) -> str:
    start = DOC.index(f"## {title}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end != -1 else len(DOC)]


def test_the_workflows_example_runs_and_prints_what_it_says() -> None:
    (code,) = re.findall(r"```python\n(.*?)```", section("Workflows"), re.S)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/runtime.md#workflows", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines == ["bytes: 35", str(["succeeded"] * 4), "stopped 0"]
    claimed = re.findall(r"# (bytes: 35|all succeeded|stopped 0)", code)
    assert claimed == ["bytes: 35", "all succeeded", "stopped 0"]
