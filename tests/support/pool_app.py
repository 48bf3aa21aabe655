"""Task types for the pool tests' worker processes: ``tests.support.pool_app:app``.

``work`` sleeps ``ms`` milliseconds (checking in every 10 ms, so a lost lease stops it) and, when
``runs_file`` is given, first appends ``"<task id> <attempt> <worker>"`` to that file: a record,
independent of the store and of the task history, of every time a task function really began
to run (one ``O_APPEND`` write per line, so the lines of concurrent processes never interleave).
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel, Field

from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext

app = App("pool-test")


class Work(BaseModel):
    ms: int = Field(default=10, ge=0, le=60_000)
    runs_file: str | None = None


def record_run(path: str, line: str) -> None:
    """One line, written with a single ``write`` on an ``O_APPEND`` descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@app.task()
def work(ctx: TaskContext, params: Work) -> dict[str, int]:
    if params.runs_file:
        record_run(params.runs_file, f"{ctx.task_id} {ctx.attempt} {ctx.owner}")
    deadline = time.monotonic() + params.ms / 1000
    while True:
        ctx.checkpoint()
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(0.01, left))
    return {"attempt": ctx.attempt}
