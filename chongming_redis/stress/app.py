"""The task type the stress workers run: ``chongming_redis.stress.app:app``.

``step`` does ``steps`` checkpoints ``ms`` milliseconds apart and records two side effects in
lists outside the namespace's keys, so every execution is visible independently of the task
history:

* ``stress:<ns>:runs``: ``"<task>|<attempt>|<pid>|<nonce>"``, pushed when the function begins
  (unfenced: a record that this process began this attempt);
* ``stress:<ns>:effects``: the same record, pushed at the end by a *fenced* script that writes
  only while the task is still ``running`` in this attempt under this worker's lease
  (the pattern the docs recommend for side effects that must happen at most once per attempt).

``nonce`` is unique per execution, so a redis-py retry of a push whose reply was lost is not
mistaken for a second execution (the checkers count distinct nonces).

Negative control: ``CHONGMING_STRESS_UNSAFE=double-run`` makes each execution run twice in
the same attempt (two nonces, two fenced effects): the checkers must report it.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable

import redis
from pydantic import BaseModel, Field

from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext

app = App("stress")

UNSAFE_ENV = "CHONGMING_STRESS_UNSAFE"
URL_ENV = "CHONGMING_STRESS_URL"
NS_ENV = "CHONGMING_STRESS_NAMESPACE"

# KEYS[1] task hash, KEYS[2] effects list; ARGV[1] attempt, ARGV[2] owner, ARGV[3] record.
FENCED_PUSH = """
local v = redis.call('HMGET', KEYS[1], 's', 'at', 'lo')
if v[1] ~= 'running' or v[2] ~= ARGV[1] or v[3] ~= ARGV[2] then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[3])
return 1
"""

_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


class Step(BaseModel):
    steps: int = Field(default=5, ge=1, le=1000)
    ms: int = Field(default=40, ge=0, le=10_000)


def runs_key(namespace: str) -> str:
    return f"stress:{namespace}:runs"


def effects_key(namespace: str) -> str:
    return f"stress:{namespace}:effects"


def _client() -> redis.Redis:
    url = os.environ[URL_ENV]
    with _lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)
        return _clients[url]


def _retrying(call: Callable[[], object], seconds: float = 15.0) -> None:
    """The side effects ride out the harness's own faults (connection resets, a restarting
    Redis answering LOADING): a repeated push carries the same nonce, so the checkers count
    it once."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            call()
            return
        except (redis.ConnectionError, redis.TimeoutError):  # BusyLoadingError included
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _once(ctx: TaskContext, params: Step) -> dict[str, int]:
    namespace = os.environ[NS_ENV]
    record = f"{ctx.task_id}|{ctx.attempt}|{os.getpid()}|{secrets.token_hex(6)}"
    client = _client()
    _retrying(lambda: client.rpush(runs_key(namespace), record))
    for i in range(params.steps):
        ctx.checkpoint(current=i, total=params.steps)
        time.sleep(params.ms / 1000)
    ctx.checkpoint(current=params.steps, total=params.steps)
    task_key = "{" + namespace + "}:t:" + ctx.task_id
    args = (task_key, effects_key(namespace), str(ctx.attempt), ctx.owner, record)
    _retrying(lambda: client.eval(FENCED_PUSH, 2, *args))
    return {"attempt": ctx.attempt}


@app.task()
def step(ctx: TaskContext, params: Step) -> dict[str, int]:
    result = _once(ctx, params)
    if os.environ.get(UNSAFE_ENV) == "double-run":
        result = _once(ctx, params)  # deliberately unsafe: the same attempt executes twice
    return result
