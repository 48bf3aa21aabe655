"""The CLI's ``--durability-replicas N`` (``CHONGMING_DURABILITY_REPLICAS``), as a real process.

On a primary with one replica, ``submit --durability-replicas 1`` prints ids the replica holds
when it returns (read from the replica with ``show``); the variable does the same. A worker
with it runs tasks to the end and the replica holds them all once it has exited. With the
replica stopped the submit fails with one line saying how many replicas confirmed. A negative
or non-integer value (flag or variable), a SQLite store, or a worker without ``--redis`` is one
line and exit 1, nothing written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chongming_redis.model import TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.support.replicated_redis import (
    primary_with_replica,
    wait_replicas,
)
from tests.test_cli import APP, ROOT, cli, ok, user_error

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[RedisProc, RedisProc]]:
    request.getfixturevalue("redis_proc")  # skips, or fails in CI, without redis-server
    with primary_with_replica() as servers:
        yield servers


def keys_of(server: RedisProc, namespace: str) -> int:
    with server.client() as client:
        return len(list(client.scan_iter(match="{" + namespace + "}:*")))


def test_submit_waits_for_the_replica(pair: tuple[RedisProc, RedisProc], namespace: str) -> None:
    primary, replica = pair
    given = ok(cli("submit", APP, "work", "--count=3", f"--redis={primary.url}",
                   f"--namespace={namespace}", "--durability-replicas", "1"))  # fmt: skip
    env = {"CHONGMING_DURABILITY_REPLICAS": "1", "CHONGMING_REDIS_URL": primary.url}
    exported = ok(cli("submit", APP, "work", f"--namespace={namespace}", env=env))
    for task_id in given.split() + exported.split():
        shown = ok(cli("show", task_id, "--json", f"--redis={replica.url}",
                       f"--namespace={namespace}"))  # fmt: skip
        assert json.loads(shown)["task"]["task_id"] == task_id


def test_a_submit_no_replica_confirmed_is_one_line(
    pair: tuple[RedisProc, RedisProc], namespace: str
) -> None:
    primary, replica = pair
    replica.sigstop()
    try:
        result = cli("submit", APP, "work", f"--redis={primary.url}", f"--namespace={namespace}",
                     "--durability-replicas=1")  # fmt: skip
    finally:
        replica.sigcont()
    user_error(result, "only 0 of 1 replica(s) confirmed", "outcome is unknown")
    wait_replicas(primary, 1)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "must be 0 or more, not -1"),
        ("abc", "valid integer"),
        ("1.5", "valid integer"),
    ],
)
def test_bad_values_are_one_line(
    pair: tuple[RedisProc, RedisProc], namespace: str, value: str, message: str
) -> None:
    primary, _ = pair
    where = (f"--redis={primary.url}", f"--namespace={namespace}")
    user_error(cli("submit", APP, "work", *where, f"--durability-replicas={value}"),
               "--durability-replicas", message)  # fmt: skip
    env = {"CHONGMING_DURABILITY_REPLICAS": value}
    user_error(cli("tasks", *where, env=env), "CHONGMING_DURABILITY_REPLICAS", message)
    assert keys_of(primary, namespace) == 0


def test_only_redis_takes_it(tmp_path: Path) -> None:
    database = tmp_path / "t.db"
    user_error(cli("submit", APP, "work", f"--store=sqlite://{database}",
                   "--durability-replicas=1"), "--durability-replicas is for Redis")  # fmt: skip
    assert not database.exists()
    user_error(cli("worker", APP, "--durability-replicas=1"), "needs --redis")


def test_a_worker_runs_tasks_with_every_write_confirmed(
    pair: tuple[RedisProc, RedisProc], namespace: str
) -> None:
    """The runtime's writes (the pool's ticks, batched starts and commits, leases) all go
    through ``WAIT``: a worker with the flag runs tasks to the end without one outage line, and
    once it has exited the replica holds every task it finished, with its history."""
    primary, replica = pair
    where = (f"--redis={primary.url}", f"--namespace={namespace}", "--durability-replicas=1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    worker = subprocess.Popen(
        [sys.executable, "-m", "chongming_redis.cli", "worker", APP, *where,
         "--log-level=WARNING", "--worker-lease=2"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ids = ok(cli("submit", APP, "work", "--count=8", *where)).split()
        ok(cli("wait", *ids, *where, "--timeout=60"))
    finally:
        worker.send_signal(signal.SIGINT)
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    warnings = [line for line in stderr.splitlines() if " WARNING " in line]
    assert all("shutting down" in line for line in warnings), stderr  # no outage, no refusal
    store = RedisTaskStore.from_url(replica.url, namespace=namespace, check_server=False)
    for task_id in ids:
        snapshot = store.get(task_id)
        assert snapshot is not None and snapshot.status is TaskStatus.SUCCEEDED
        assert [t.to_status for t in store.history(task_id)][-1] is TaskStatus.SUCCEEDED
    store.close()
