"""The chongming-redis app the workers run: one no-op task (``chongming-redis worker
bench.peers.chongming_app:app``)."""

from __future__ import annotations

from typing import Any

from bench.peers.mark import mark
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext

app = App("bench-peers")


@app.task()
def noop(ctx: TaskContext, params: Any) -> None:
    mark()
