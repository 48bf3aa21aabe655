"""The app of the workflow process tests' workers: ``tests.support.workflow_app:app``. ``node``
sleeps ``params["sleep"]`` seconds (checkpointing), fails when ``params["fail"]`` is set
(never retried: ``NonRetryable``) and returns its parents' results with its own name, so a
join's result shows what it saw."""

from __future__ import annotations

import time
from typing import Any

from chongming_redis.policy import NonRetryable
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext

app = App("workflow-test")


@app.task()
def node(ctx: TaskContext, params: Any) -> Any:
    until = time.monotonic() + float(params.get("sleep", 0))
    while time.monotonic() < until:
        ctx.checkpoint()
        time.sleep(0.05)
    if params.get("fail"):
        raise NonRetryable("failed on purpose")
    return {"name": params["name"], "saw": sorted(ctx.parent_results())}
