"""Task policies through real ``chongming-redis worker`` processes, as a new user runs them, on
Redis, a SQLite file and PostgreSQL (issue 25): retries counted and their backoff gaps read
from the history; timeouts of a checkpointing task, a silent thread, an ``async def`` task and
a process task, after which the worker goes on; retention removing a finished task; and
producer processes racing one unique id, of which exactly one creates a task.

Every check counts outcomes and orders events; none times a run against a budget.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from chongming_redis.client.client import Client
from chongming_redis.model import TaskStatus
from tests import test_start_path
from tests.test_start_path import Workers, wait_until

# The start-path tests' fixtures: ``target`` (redis, sqlite, postgres), ``workers``, ``client``.
target, workers, client = test_start_path.target, test_start_path.workers, test_start_path.client

APP_SOURCE = """
import asyncio
import time
from chongming_redis import App, RetryPolicy

app = App("policies")
NONE = RetryPolicy(max_attempts=1)


class Flaky(Exception):
    pass


@app.task("flaky", retry=RetryPolicy(max_attempts=3, base_delay=0.2, jitter=0.0,
                                     retry_on=(Flaky,)))
def flaky(ctx, params):
    if ctx.attempt < 3:
        raise Flaky(f"attempt {ctx.attempt}")
    return {"attempt": ctx.attempt}


@app.task("checkpoints", timeout=0.5, retry=NONE)
def checkpoints(ctx, params):
    while True:
        ctx.checkpoint()
        time.sleep(0.02)


@app.task("silent", timeout=0.5, retry=NONE)
def silent(ctx, params):
    time.sleep(6)  # no checkpoint: its worker ends it, then discards this result
    return "too late"


@app.task("sleeps", timeout=0.5, retry=NONE)
async def sleeps(ctx, params):
    await asyncio.sleep(60)


@app.task("spins", timeout=0.5, retry=NONE, isolation="process")
def spins(ctx, params):
    while True:
        pass


@app.task("quick", retention=1.0)
def quick(ctx, params):
    return "done"


@app.task("kept")
def kept(ctx, params):
    return "kept"
"""

PRODUCER = """
import sys
from chongming_redis.client.client import Client
from chongming_redis.stores.urls import open_store_url

url, namespace, unique = sys.argv[1:4]
store = open_store_url(url, namespace=namespace)
with Client(store, num_buckets=64, owns_store=True) as client:
    handle = client.submit("kept", {}, unique=unique)
    print(handle.task_id, handle.created)
"""


def _start(workers: Workers, tmp: Path) -> None:
    (tmp / "policyapp.py").write_text(APP_SOURCE, "utf-8")
    workers.start("policyapp:app", "--concurrency", "4")


def _final(client: Client, task_id: str) -> Any:
    snapshot = client.get(task_id)
    return None if snapshot is None or not snapshot.status.is_terminal else snapshot


def test_a_failing_task_is_retried_by_its_policy_with_the_backoff_in_its_history(
    workers: Workers, client: Client, tmp_path: Path
) -> None:
    _start(workers, tmp_path)
    task_id = client.submit("flaky").task_id
    wait_until(lambda: _final(client, task_id) is not None, "the flaky task", workers)
    done = client.get(task_id)
    assert done is not None and (done.status, done.attempt) == (TaskStatus.SUCCEEDED, 3)
    history = client.history(task_id)
    starts = [e for e in history if e.to_status is TaskStatus.RUNNING]
    fails = [e for e in history if e.to_status is TaskStatus.FAILED]
    assert len(starts) == 3 and len(fails) == 2  # no attempt beyond max_attempts
    for failure, next_start, wait in zip(fails, starts[1:], (0.2, 0.4)):
        assert (next_start.at - failure.at).total_seconds() >= wait - 0.005, (failure, wait)


def test_every_kind_of_task_past_its_timeout_fails_and_the_worker_goes_on(
    workers: Workers, client: Client, tmp_path: Path
) -> None:
    _start(workers, tmp_path)
    ids = {name: client.submit(name).task_id for name in ("checkpoints", "silent", "sleeps",
                                                           "spins")}  # fmt: skip
    wait_until(lambda: all(_final(client, i) for i in ids.values()), "the timeouts", workers)
    for name, task_id in ids.items():
        ended = client.get(task_id)
        assert ended is not None and ended.status is TaskStatus.FAILED, name
        assert ended.failure is not None and ended.failure.error_type == "TaskTimeout", name
        assert ended.attempt == 1, name
        started = next(e for e in client.history(task_id) if e.to_status is TaskStatus.RUNNING)
        # ended after its timeout, and within timeout + grace + reconcile interval + slack
        assert 0.5 <= (ended.updated_at - started.at).total_seconds() < 0.5 + 2 + 5 + 5, name
    after = client.submit("kept").task_id
    wait_until(lambda: _final(client, after) is not None, "a task after the timeouts", workers)
    assert client.get(after).status is TaskStatus.SUCCEEDED  # type: ignore[union-attr]
    silent = client.get(ids["silent"])
    assert silent is not None and silent.result is None  # its late "too late" was discarded


def test_a_finished_task_past_its_retention_is_removed_and_the_others_kept(
    workers: Workers, client: Client, tmp_path: Path
) -> None:
    _start(workers, tmp_path)
    short, long = client.submit("quick").task_id, client.submit("kept").task_id
    wait_until(lambda: _final(client, long) is not None, "the kept task", workers)
    wait_until(lambda: client.get(short) is None, "the expired task to be removed", workers)
    assert client.history(short) == []
    kept = client.get(long)
    assert kept is not None and kept.status is TaskStatus.SUCCEEDED
    assert kept.retention == 7 * 86400.0  # the default, frozen at submit


def test_producer_processes_racing_one_unique_id_create_exactly_one_task(
    client: Client, target: Any, tmp_path: Path
) -> None:
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER, "utf-8")
    races = [subprocess.Popen([sys.executable, str(script), target.url, target.namespace,
                               "invoice-42"], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]  # fmt: skip
    answers = [race.communicate(timeout=60)[0].split() for race in races]
    assert all(race.returncode == 0 for race in races)
    assert len({task_id for task_id, _ in answers}) == 1  # every producer got the one task
    assert sorted(created for _, created in answers) == ["False"] * 5 + ["True"]
    assert len(client.list(limit=100)) == 1
