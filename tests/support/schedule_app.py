"""The app of the schedule process tests' workers: ``tests.support.schedule_app:app``, with
one schedule registered (``beat``, every second, ``Overlap.ALLOW``: a tick is never skipped
because the previous tick's task is still running on a loaded machine) whose task does
nothing but return its id."""

from __future__ import annotations

from typing import Any

from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext
from chongming_redis.schedules import Overlap, Schedule

app = App("schedule-test")


@app.task()
def beat(ctx: TaskContext, params: Any) -> str:
    return ctx.task_id


app.schedule(Schedule("beat", "beat", {"from": "schedule_app"}, every=1, overlap=Overlap.ALLOW))
