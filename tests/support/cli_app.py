"""Task types for the CLI's real-process tests: ``tests.support.cli_app:app``."""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from chongming_redis import App, TaskContext

app = App("cli-test")


class Spin(BaseModel):
    seconds: float = 60.0


class Fail(BaseModel):
    message: str = "failed on purpose"


@app.task()
def spin(ctx: TaskContext, params: Spin) -> str:
    """Checks in every 10 ms until ``seconds`` pass (or a stop / pause arrives)."""
    deadline = time.monotonic() + params.seconds
    while time.monotonic() < deadline:
        ctx.checkpoint(current=round(time.monotonic() - deadline + params.seconds, 2),
                       total=params.seconds)  # fmt: skip
        time.sleep(0.01)
    return "spun"


@app.task()
def echo(ctx: TaskContext, params: Any) -> dict[str, Any]:
    return {"echo": params}


@app.task()
def fail(ctx: TaskContext, params: Fail) -> None:
    raise ValueError(params.message)
