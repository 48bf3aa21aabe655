"""The task type the stress workers run: ``chongming_redis.stress.app:app``.

``step`` does ``steps`` checkpoints ``ms`` milliseconds apart and records two side effects in
lists outside the namespace's keys, so every execution is visible independently of the task
history:

* ``stress:<ns>:runs``: ``"<task>|<attempt>|<owner>|<nonce>"``, pushed when the function
  begins (unfenced: a record that this worker began this attempt; ``owner`` is the worker's
  lease owner, one per process, so a run is told from the same attempt's run after a
  hand-back, which keeps the attempt);
* ``stress:<ns>:effects``: the same record, pushed at the end by a *fenced* script that writes
  only while the task is still ``running`` in this attempt under this worker's lease
  (the pattern the docs recommend for side effects that must happen at most once per run).

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
  own lease whatever version is stored by then, so two workers can both start one attempt;
* ``ignore-policies``: the workers ignore the task policies (``ignore_policies``: more
  attempts than allowed, no timeout enforced, retention cut a minute short) and the driver
  deletes each unique record it creates (``harness``), so a unique id gets a second task.

The task policies (issue 25) have their own types, a small share of the load
(``producer.workload``): ``flaky`` (a ``RetryPolicy``; fails on purpose while ``attempt <
fail_until``), ``slow`` (a ``timeout``, overrun silently or at checkpoints), ``brief`` (a
retention of a few seconds); the unique submits use ``step``. So have the limits (issue 26):
``limited`` (``Concurrency(2, per="key")``) and ``rated`` (``RateLimit(1, per=1.0,
burst=1)``), whose functions also record the server's ``TIME`` as they begin
(``stress:<ns>:began``: ``<task>|<attempt>|<owner>|<s>|<us>``, after the start landed:
``limit_checks``). A fourth control, ``ignore-limits``: the workers never record the limit
definitions (``RedisTaskStore.record_limits`` does nothing), so the store's start limits
nothing (a ref whose limit id is not recorded limits nothing). A fifth, ``ignore-parents``: the
driver submits the dependencies' graphs (``producer.graph_clumps``) without their edges, as a
store that keeps none would run them (``dependency_checks``). A sixth, ``two-step-save``: the
workers' Redis store does its compare-and-set as a read, a compare, a pause and a blind write,
and has no batched calls, so every task move is such a save (``stress/two_step.py``).

Last of all, once every control above has patched what it patches, ``oplog.install()`` wraps
the store methods this process really calls: with ``CHONGMING_STRESS_OPLOG`` set (the harness
sets it for its workers), each store call is recorded for the linearizability check
(``stress/oplog.py``).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

import redis
from pydantic import BaseModel, Field

from chongming_redis.errors import StoreError
from chongming_redis.limits import Concurrency, RateLimit
from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus, Transition
from chongming_redis.policy import RetryPolicy, TaskTimeout
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext
from chongming_redis.schedules import Schedule
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stress import oplog, sql_records, two_step
from chongming_redis.stress.clients import client_for, cluster_from_env, server_time

app = App("stress")

UNSAFE_ENV = "CHONGMING_STRESS_UNSAFE"
URL_ENV = "CHONGMING_STRESS_URL"
NS_ENV = "CHONGMING_STRESS_NAMESPACE"
#: On a SQL store: the store's URL, where the fenced effects go (``sql_records``); the other
#: records (runs, began, clocks) go to the private side Redis at ``URL_ENV``.
STORE_ENV = "CHONGMING_STRESS_STORE_URL"
#: In a soak (``stress/soak.py``): the tick tasks' retention (seconds), so they are removed
#: while it runs like the driver's tasks, which carry theirs.
SOAK_RETENTION_ENV = "CHONGMING_STRESS_SOAK_RETENTION"

# KEYS[1] task hash, KEYS[2] effects list; ARGV[1] attempt, ARGV[2] owner, ARGV[3] record.
FENCED_PUSH = """
local v = redis.call('HMGET', KEYS[1], 's', 'at', 'lo')
if v[1] ~= 'running' or v[2] ~= ARGV[1] or v[3] ~= ARGV[2] then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[3])
return 1
"""

# KEYS[1] runs list, KEYS[2] began list; ARGV[1] the runs record, ARGV[2]
# "<task>|<attempt>|<owner>".
TIMED_BEGIN = """
redis.call('RPUSH', KEYS[1], ARGV[1])
local now = redis.call('TIME')
redis.call('RPUSH', KEYS[2], ARGV[2] .. '|' .. now[1] .. '|' .. now[2])
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


def began_key(namespace: str) -> str:
    return "stress:{" + namespace + "}:began"


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


def _once(ctx: TaskContext, params: Step, timed: bool = False) -> dict[str, int]:
    record = _began(ctx, timed)
    _steps(ctx, params)
    _fenced_effect(ctx, record)
    return {"attempt": ctx.attempt}


def _began(ctx: TaskContext, timed: bool = False) -> str:
    """Push this execution's "began" record (unfenced), and with ``timed`` the server's
    ``TIME`` beside it (``began_key``) in the same script; returns the record."""
    namespace = os.environ[NS_ENV]
    record = f"{ctx.task_id}|{ctx.attempt}|{ctx.owner}|{secrets.token_hex(6)}"
    client = _client()
    _record_clock(client, namespace)
    if timed:
        keys = (runs_key(namespace), began_key(namespace))
        at = f"{ctx.task_id}|{ctx.attempt}|{ctx.owner}"
        _retrying(lambda: client.eval(TIMED_BEGIN, 2, *keys, record, at))
    else:
        _retrying(lambda: client.rpush(runs_key(namespace), record))
    return record


def _steps(ctx: TaskContext, params: Step) -> None:
    for i in range(params.steps):
        ctx.checkpoint(current=i, total=params.steps)
        time.sleep(params.ms / 1000)
    ctx.checkpoint(current=params.steps, total=params.steps)


def _fenced_effect(ctx: TaskContext, record: str) -> None:
    namespace = os.environ[NS_ENV]
    store_url = os.environ.get(STORE_ENV)
    if store_url:  # a SQL store: the fence is a transaction in the store's own database
        sql_records.fenced_insert(store_url, namespace, ctx.task_id, ctx.attempt, ctx.owner,
                                  record)  # fmt: skip
        return
    client = _client()
    task_key = "{" + namespace + "}:t:" + ctx.task_id
    args = (task_key, effects_key(namespace), str(ctx.attempt), ctx.owner, record)
    _retrying(lambda: client.eval(FENCED_PUSH, 2, *args))


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


# -- the task policies (issue 25): a small share of the producer's load (producer.workload) --


class Flaky(Exception):
    """What ``flaky`` raises on purpose (its policy retries it)."""


#: ``flaky``'s policy: three attempts, short backoffs (``retry_on`` by class).
FLAKY_POLICY = RetryPolicy(max_attempts=3, base_delay=0.2, max_delay=1.0, jitter=0.1,
                           retry_on=(Flaky,))  # fmt: skip
#: ``slow``'s timeout (seconds) and policy: a timed-out attempt is retried once.
SLOW_TIMEOUT = 1.0
SLOW_POLICY = RetryPolicy(max_attempts=2, base_delay=0.2, max_delay=1.0, jitter=0.1,
                          retry_on=(TaskTimeout,))  # fmt: skip
#: How long a ``silent`` attempt sleeps without a checkpoint: longer than its timeout plus the
#: checkers' slack (``policy_report.PolicyRun.timeout_slack``, 5 s with the harness's
#: workers), so a worker that did not enforce the timeout is caught (``ignore-policies``).
SILENT_SECONDS = 9.0
#: ``brief``'s retention (seconds): its finished tasks are removed during the run.
BRIEF_RETENTION = 3.0


class FlakyParams(Step):
    #: the first attempt that succeeds: attempts before it raise ``Flaky`` (past the policy's
    #: three attempts, the task ends FAILED)
    fail_until: int = Field(default=1, ge=1, le=100)


class SlowParams(BaseModel):
    #: how an attempt overruns its timeout: sleeping without a checkpoint (its worker ends it
    #: ``timeout_grace`` later), checkpointing (the checkpoint raises TaskTimeout), or not
    mode: Literal["silent", "checkpoints", "quick"] = "quick"
    #: attempts from this one on are quick
    until: int = Field(default=2, ge=1, le=100)


@app.task(retry=FLAKY_POLICY)
def flaky(ctx: TaskContext, params: FlakyParams) -> dict[str, int]:
    """Fails (``Flaky``) while ``attempt < fail_until``, then runs as ``step``."""
    if ctx.attempt < params.fail_until:
        _began(ctx)
        ctx.checkpoint()
        raise Flaky(f"attempt {ctx.attempt} fails on purpose (until {params.fail_until})")
    return _once(ctx, params)


@app.task(timeout=SLOW_TIMEOUT, retry=SLOW_POLICY)
def slow(ctx: TaskContext, params: SlowParams) -> dict[str, int]:
    """Overruns its timeout in its mode while ``attempt < until``; else a quick step."""
    if params.mode == "quick" or ctx.attempt >= params.until:
        return _once(ctx, Step(steps=3, ms=50))
    record = _began(ctx)
    if params.mode == "silent":
        ctx.checkpoint()
        time.sleep(SILENT_SECONDS)  # no checkpoint: its worker ends it; this result is dropped
    else:
        _steps(ctx, Step(steps=int(SILENT_SECONDS * 10), ms=100))  # raises TaskTimeout at 1 s
    ctx.checkpoint()
    _fenced_effect(ctx, record)
    return {"attempt": ctx.attempt}


@app.task(retention=BRIEF_RETENTION)
def brief(ctx: TaskContext, params: Step) -> dict[str, int]:
    """``step`` with a retention of a few seconds."""
    return _once(ctx, params)


# -- the limits (issue 26): a small share of the load too (producer.workload) --------------

#: ``limited``'s limit: at most 2 at once per ``key``; ``rated``'s: one start a second.
LIMITED = Concurrency(2, per="key")
RATED = RateLimit(1, per=1.0, burst=1)


class Keyed(Step):
    key: str = Field(default="k0", min_length=1, max_length=20)


@app.task(limits=[LIMITED])
def limited(ctx: TaskContext, params: Keyed) -> dict[str, int]:
    """``step`` under ``LIMITED``."""
    return _once(ctx, params, timed=True)


@app.task(limits=[RATED])
def rated(ctx: TaskContext, params: Step) -> dict[str, int]:
    """``step`` under ``RATED``."""
    return _once(ctx, params, timed=True)


@app.task(retention=float(os.environ.get(SOAK_RETENTION_ENV) or 0) or None)
def beat(ctx: TaskContext, params: Any) -> str:
    """The task of ``BEAT``'s ticks (``stress/schedule_checks.py`` judges them)."""
    return ctx.task_id


#: Fired by whichever worker holds its bucket, through every fault of the run.
BEAT = app.schedule(Schedule("stress-beat", "beat", every=1))


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


def ignore_policies() -> None:
    """UNSAFE (the ``ignore-policies`` negative control), in a worker process: each task gets
    two attempts more than its frozen policy allows, no timeout is enforced (not at a
    checkpoint, not by its worker, not by a reconcile) and finished tasks expire a minute
    before their retention ran out."""
    from chongming_redis.runtime import reconcile
    from chongming_redis.runtime.writer import TaskWriter

    own_policy = TaskWriter.policy_of

    def policy_of(self: TaskWriter, snapshot: TaskSnapshot) -> RetryPolicy:
        policy = own_policy(self, snapshot)
        return dataclasses.replace(policy, max_attempts=policy.max_attempts + 2)

    expire = RedisTaskStore.expire_finished

    def expire_early(self: RedisTaskStore, *, now: datetime, limit: int = 100) -> list[str]:
        return expire(self, now=now + timedelta(seconds=60), limit=limit)

    TaskWriter.policy_of = policy_of  # type: ignore[method-assign]
    TaskWriter.overdue = lambda self, held: False  # type: ignore[method-assign]
    TaskContext.set_timeout = lambda self, seconds, started: None  # type: ignore[method-assign]
    reconcile.overdue_in_store = lambda snapshot, now, grace: False  # type: ignore[attr-defined]
    RedisTaskStore.expire_finished = expire_early  # type: ignore[method-assign,assignment]


def _record_nothing(self: RedisTaskStore, *args: object, **kwargs: object) -> None:
    """UNSAFE (the ``ignore-limits`` negative control): ``record_limits`` that records
    nothing, so the store's start limits nothing."""


if os.environ.get(UNSAFE_ENV) == "ignore-limits":
    RedisTaskStore.record_limits = _record_nothing  # type: ignore[method-assign,assignment]
if os.environ.get(UNSAFE_ENV) == "skip-cas":
    RedisTaskStore.start_tasks = blind_start_tasks  # type: ignore[method-assign,assignment]
elif os.environ.get(UNSAFE_ENV) == "ignore-policies":
    ignore_policies()
elif os.environ.get(UNSAFE_ENV) == "two-step-save" and URL_ENV in os.environ:
    two_step.install()  # the workers' store only (URL_ENV: set for the workers alone)
oplog.install()  # last: it must wrap what the patches above left
