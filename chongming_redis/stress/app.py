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

Once per process, at its first execution, ``stress:<ns>:clocks`` records ``pid -> this
process's wall clock minus the server's`` (seconds): how the ``clock_skew`` fault shows that a
skewed worker really ran tasks with its clock off.

Negative controls (``CHONGMING_STRESS_UNSAFE``), which the checkers must report:

* ``double-run``: each execution runs twice in the same attempt (two nonces, two fenced
  effects);
* ``skip-cas``: the worker starts tasks with a blind write instead of the compare-and-set
  (``blind_start_tasks`` replaces ``RedisTaskStore.start_tasks`` in the worker process): it
  reads the ``PENDING`` tasks of every bucket, then overwrites each as ``RUNNING`` under its
  own lease whatever version is stored by then, so two workers can both start one attempt.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime

import redis
from pydantic import BaseModel, Field

from chongming_redis.errors import StoreError
from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stress.clients import client_for, cluster_from_env, server_time

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


# The app's keys carry the namespace's hash tag, so on Redis Cluster they live in the
# namespace's slot: FENCED_PUSH reads the task hash and writes the effects list in one script.


def runs_key(namespace: str) -> str:
    return "stress:{" + namespace + "}:runs"


def effects_key(namespace: str) -> str:
    return "stress:{" + namespace + "}:effects"


def clocks_key(namespace: str) -> str:
    return "stress:{" + namespace + "}:clocks"


def keys_pattern(namespace: str) -> str:
    """The ``SCAN MATCH`` pattern of the app's keys of a run (braces escaped)."""
    return "stress:\\{" + namespace + "\\}:*"


_clock_recorded = False


def _client() -> redis.Redis:
    url = os.environ[URL_ENV]
    with _lock:
        if url not in _clients:
            _clients[url] = client_for(url, cluster=cluster_from_env(), socket_timeout=5,
                                       socket_connect_timeout=2)  # fmt: skip
        return _clients[url]


#: What ``_retrying`` rides out: a connection lost or reset, a restarting Redis answering
#: LOADING (``BusyLoadingError`` is a ``ConnectionError``); on a cluster a failover
#: (``CLUSTERDOWN``) or a slot migration (``TRYAGAIN``, or redis-py's "TTL exhausted").
PASSING = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError,
           redis.exceptions.TryAgainError)  # fmt: skip


def _retrying(call: Callable[[], object], seconds: float = 15.0) -> None:
    """The side effects ride out the harness's own faults (connection resets, a restarting
    Redis answering LOADING): a repeated push carries the same nonce, so the checkers count
    it once."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            call()
            return
        except PASSING:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _once(ctx: TaskContext, params: Step) -> dict[str, int]:
    namespace = os.environ[NS_ENV]
    record = f"{ctx.task_id}|{ctx.attempt}|{os.getpid()}|{secrets.token_hex(6)}"
    client = _client()
    _record_clock(client, namespace)
    _retrying(lambda: client.rpush(runs_key(namespace), record))
    for i in range(params.steps):
        ctx.checkpoint(current=i, total=params.steps)
        time.sleep(params.ms / 1000)
    ctx.checkpoint(current=params.steps, total=params.steps)
    task_key = "{" + namespace + "}:t:" + ctx.task_id
    args = (task_key, effects_key(namespace), str(ctx.attempt), ctx.owner, record)
    _retrying(lambda: client.eval(FENCED_PUSH, 2, *args))
    return {"attempt": ctx.attempt}


def _record_clock(client: redis.Redis, namespace: str) -> None:
    """Once per process (again only if it failed): ``pid -> wall clock - server clock``."""
    global _clock_recorded
    if _clock_recorded:
        return

    def record() -> None:
        seconds, micros = server_time(client, clocks_key(namespace))
        offset = time.time() - (seconds + micros / 1e6)
        client.hset(clocks_key(namespace), str(os.getpid()), f"{offset:.3f}")

    _retrying(record)
    _clock_recorded = True


def clock_of(client: redis.Redis, namespace: str, pid: int) -> float | None:
    """What ``_record_clock`` recorded for ``pid``, or ``None`` before its first execution."""
    value = client.hget(clocks_key(namespace), str(pid))
    return None if value is None else float(value)


@app.task()
def step(ctx: TaskContext, params: Step) -> dict[str, int]:
    result = _once(ctx, params)
    if os.environ.get(UNSAFE_ENV) == "double-run":
        result = _once(ctx, params)  # deliberately unsafe: the same attempt executes twice
    return result


def blind_start_tasks(
    self: RedisTaskStore,
    *,
    owner: str,
    now: datetime,
    lease_until: datetime,
    buckets: Sequence[int],
    limit: int = 50,
    names: Sequence[str] = (),
) -> list[TaskSnapshot]:
    """UNSAFE (the ``skip-cas`` negative control): ``start_tasks`` without the compare-and-set.
    Every bucket's ``PENDING`` tasks (not only this worker's, so workers race for the same
    task), then per task, after a short pause (the window between a read and a write), a save
    against whatever version is stored *now*: a blind overwrite."""
    query = TaskQuery(statuses=frozenset({TaskStatus.PENDING}), limit=4 * limit)
    started: list[TaskSnapshot] = []
    for snapshot in self.query(query):
        if len(started) >= limit:
            break
        if names and snapshot.name not in names:
            continue
        if snapshot.not_before is not None and snapshot.not_before > now:
            continue
        time.sleep(0.05)
        try:
            current = self.get(snapshot.task_id)
            if current is None:
                continue
            running = dataclasses.replace(
                snapshot, status=TaskStatus.RUNNING, status_version=current.status_version + 1,
                updated_at=now, heartbeat_at=now, lease_owner=owner, lease_until=lease_until,
            )  # fmt: skip
            self.save(running, expect_version=current.status_version)
            self.touch(snapshot.task_id, lease_owner=owner, lease_until=lease_until)
            reason = f"started by {owner} (attempt {snapshot.attempt})"
            self.append(
                Transition(snapshot.task_id, running.status_version, TaskStatus.PENDING,
                           TaskStatus.RUNNING, now, reason)
            )  # fmt: skip
        except StoreError:
            continue
        started.append(running)
    return started


if os.environ.get(UNSAFE_ENV) == "skip-cas":
    RedisTaskStore.start_tasks = blind_start_tasks  # type: ignore[method-assign,assignment]
