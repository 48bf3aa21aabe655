"""Task types for the pool tests' worker processes: ``tests.support.pool_app:app``.

``work`` sleeps ``ms`` milliseconds (checking in every 10 ms, so a lost lease stops it) and, when
``runs_url``/``runs_key`` are given, first appends ``"<task id> <attempt> <worker>"`` to that
Redis list: a record, independent of the task history, of every time a task function really
began to run.
"""

from __future__ import annotations

import threading
import time

import redis
from pydantic import BaseModel, Field

from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext

app = App("pool-test")

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


class Work(BaseModel):
    ms: int = Field(default=10, ge=0, le=60_000)
    runs_url: str | None = None
    runs_key: str | None = None


def _client(url: str) -> redis.Redis:
    with _lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(url, socket_timeout=5)
        return _clients[url]


@app.task()
def work(ctx: TaskContext, params: Work) -> dict[str, int]:
    if params.runs_url and params.runs_key:
        _client(params.runs_url).rpush(params.runs_key, f"{ctx.task_id} {ctx.attempt} {ctx.owner}")
    deadline = time.monotonic() + params.ms / 1000
    while True:
        ctx.checkpoint()
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(0.01, left))
    return {"attempt": ctx.attempt}
