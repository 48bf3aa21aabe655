"""The read commands for people and for scripts (issue 13), run as real processes against the
session's redis-server: ``tasks``, ``show``, ``stats`` and ``reconcile`` print tables with
statuses as words, labelled local and UTC times, progress bars, a history timeline and a
traceback as text; ``--json`` prints one parseable document with the keys ``cli/json_output.py``
documents; ids are never cut in a pipe (nor with ``--wide`` on a terminal); an empty namespace
or a query that matches nothing says so. Also ``submit --delay`` / ``--count``, ``prune`` in
steps, and the durability warning only on the commands that write.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from chongming_redis.model import Failure, Progress, TaskSnapshot, TaskStatus, Transition
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores._redis.server import check_server_settings
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.pool_app import app as pool_app
from tests.support.redis_server import RedisProc
from tests.test_cli import APP, ROOT, cli, ok, user_error

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

T0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
TRACEBACK = 'Traceback (most recent call last):\n  File "tasks.py", line 9\nValueError: [bold]no'
TASK_KEYS = {
    "task_id", "status", "status_version", "name", "bucket", "key", "tags", "pipeline_run_id",
    "attempt", "priority", "created_at", "updated_at", "not_before", "heartbeat_at",
    "lease_owner",
    "lease_until", "progress", "failure",
}  # fmt: skip


@pytest.fixture
def store(redis_proc: RedisProc, namespace: str) -> Iterator[RedisTaskStore]:
    s = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    yield s
    s.close()


@pytest.fixture
def common(redis_proc: RedisProc, namespace: str) -> tuple[str, str]:
    return (f"--redis={redis_proc.url}", f"--namespace={namespace}")


def snapshot(task_id: str, status: TaskStatus = TaskStatus.PENDING, **extra: Any) -> TaskSnapshot:
    fields: dict[str, Any] = {"created_at": T0, "updated_at": T0, "name": "resize", **extra}
    return TaskSnapshot(task_id=task_id, status=status, status_version=1, **fields)


def failed_task(store: RedisTaskStore) -> TaskSnapshot:
    """A task that ran, reported progress and failed, with its three history entries."""
    task = snapshot(
        "job-1", TaskStatus.FAILED, bucket=7, key="user-1", tags=frozenset({"io", "batch"}),
        params={"width": 640}, result={"raw": b"\x00\xff"},
        progress=Progress(6, 10, "resizing"), heartbeat_at=T0 + timedelta(seconds=3),
        failure=Failure("ValueError", "bad frame", TRACEBACK),
        updated_at=T0 + timedelta(seconds=4),
    )  # fmt: skip
    store.create(task)
    for version, (old, new, seconds, reason) in enumerate(
        [
            (None, TaskStatus.PENDING, 0, "submitted by ops"),
            (TaskStatus.PENDING, TaskStatus.RUNNING, 1.5, "started by w-1 (attempt 1)"),
            (TaskStatus.RUNNING, TaskStatus.FAILED, 4, "[red]not markup[/red]"),
        ],
        start=1,
    ):
        store.append(Transition("job-1", version, old, new, T0 + timedelta(seconds=seconds),
                                reason))  # fmt: skip
    return task


# -- show ---------------------------------------------------------------------------------------


def test_show_prints_words_labelled_times_a_bar_a_timeline_and_the_traceback(
    store: RedisTaskStore, common: tuple[str, str]
) -> None:
    failed_task(store)
    shown = ok(cli("show", "job-1", *common, env={"TZ": "Asia/Tokyo"}))
    assert "TaskStatus" not in shown and "datetime" not in shown and "Progress(" not in shown
    lines = {line.split("  ", 1)[0].strip(): line for line in shown.splitlines() if line.strip()}
    assert "failed  (version 1, attempt 1)" in lines["status"]
    assert "2026-01-02 12:04:05 JST (03:04:05 UTC, " in lines["created"]
    assert "bucket" in lines and "(key user-1)" in lines["bucket"]
    assert "batch, io" in lines["tags"]
    assert "████████████░░░░░░░░  60% 6/10  resizing" in lines["progress"]
    assert '{"width": 640}' in lines["params"] and '{"raw": {"base64": "AP8="}}' in lines["result"]
    assert "ValueError: bad frame" in lines["failure"]
    assert TRACEBACK in shown  # the traceback as text, markup-looking text included
    timeline = [line.split() for line in shown.split("history (3 entries, local time JST)")[1]
                .splitlines() if line.strip()][1:]  # fmt: skip
    assert timeline == [
        ["v1", "2026-01-02", "12:04:05.678", "→", "pending", "submitted", "by", "ops"],
        ["v2", "12:04:07.178", "+1.5", "s", "pending", "→", "running", "started", "by", "w-1",
         "(attempt", "1)"],
        ["v3", "12:04:09.678", "+2.5", "s", "running", "→", "failed", "[red]not", "markup[/red]"],
    ]  # fmt: skip


def test_show_json_is_one_document_with_the_documented_keys(
    store: RedisTaskStore, common: tuple[str, str], namespace: str
) -> None:
    failed_task(store)
    doc = json.loads(ok(cli("show", "job-1", "--json", *common)))
    assert set(doc) == {"namespace", "task", "history"} and doc["namespace"] == namespace
    task = doc["task"]
    assert set(task) == TASK_KEYS | {"params", "result", "policies", "parents",
                                     "on_parent_failure", "parent_statuses"}  # fmt: skip
    assert (task["parents"], task["on_parent_failure"], task["parent_statuses"]) == ([], "stop", {})
    assert task["policies"] == {"retry": None, "timeout": None, "deadline": None,
                                "retention": None, "unique": None}  # fmt: skip
    assert task["status"] == "failed" and task["tags"] == ["batch", "io"]
    assert task["created_at"] == "2026-01-02T03:04:05.678000Z"
    assert task["heartbeat_at"] == "2026-01-02T03:04:08.678000Z" and task["lease_until"] is None
    assert task["progress"] == {"current": 6, "total": 10, "message": "resizing"}
    assert task["failure"] == {"error_type": "ValueError", "message": "bad frame",
                               "traceback": TRACEBACK}  # fmt: skip
    assert task["params"] == {"width": 640}
    assert base64.b64decode(task["result"]["raw"]["base64"]) == b"\x00\xff"
    assert [(h["version"], h["from_status"], h["to_status"]) for h in doc["history"]] == [
        (1, None, "pending"), (2, "pending", "running"), (3, "running", "failed"),
    ]  # fmt: skip
    assert doc["history"][1] == {"version": 2, "from_status": "pending", "to_status": "running",
                                 "at": "2026-01-02T03:04:07.178000Z",
                                 "reason": "started by w-1 (attempt 1)"}  # fmt: skip


# -- tasks --------------------------------------------------------------------------------------


def test_a_piped_listing_prints_whole_ids_that_show_then_accepts(
    store: RedisTaskStore, common: tuple[str, str]
) -> None:
    long_ids = [f"{'x' * 150}-{i}" for i in range(3)]
    for i, task_id in enumerate(long_ids):
        store.create(snapshot(task_id, TaskStatus.RUNNING, lease_owner="w" * 90, bucket=i,
                              progress=Progress(i, 4)))  # fmt: skip
    submitted = ok(cli("submit", APP, "work", "--count=2", *common)).split()
    listing = ok(cli("tasks", *common))  # a pipe: no terminal, no COLUMNS
    assert "…" not in listing
    found = [line.split()[1] for line in listing.splitlines() if line.startswith("│ ")]
    assert found == [*long_ids, *submitted]
    for task_id in found:
        assert task_id in ok(cli("show", task_id, *common))


def test_on_a_narrow_terminal_ids_are_cut_unless_wide(
    store: RedisTaskStore, common: tuple[str, str]
) -> None:
    task_id = "y" * 150
    store.create(snapshot(task_id))

    def on_terminal(*args: str) -> str:
        leader, follower = pty.openpty()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
        env.update(COLUMNS="80", LINES="40", TERM="dumb")
        done = subprocess.run([sys.executable, "-m", "chongming_redis.cli", *args],
                              cwd=ROOT, stdout=follower, stderr=subprocess.PIPE, env=env,
                              timeout=60)  # fmt: skip
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the other end is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        assert done.returncode == 0, done.stderr
        return b"".join(chunks).decode()

    assert task_id not in on_terminal("tasks", *common)
    assert task_id in on_terminal("tasks", "--wide", *common)


def test_tasks_json_newest_first_and_the_progress_column(
    store: RedisTaskStore, common: tuple[str, str], namespace: str
) -> None:
    for i in range(3):
        store.create(snapshot(f"t{i}", TaskStatus.RUNNING, created_at=T0 + timedelta(seconds=i),
                              progress=Progress(i + 1, 4, "step")))  # fmt: skip
    doc = json.loads(ok(cli("tasks", "--json", *common)))
    assert doc["namespace"] == namespace
    assert [t["task_id"] for t in doc["tasks"]] == ["t0", "t1", "t2"]
    assert all(set(t) == TASK_KEYS and t["status"] == "running" for t in doc["tasks"])
    assert doc["tasks"][0]["created_at"] == "2026-01-02T03:04:05.678000Z"
    newest = json.loads(ok(cli("tasks", "--json", "--newest-first", "--limit=2", *common)))
    assert [t["task_id"] for t in newest["tasks"]] == ["t2", "t1"]
    table = ok(cli("tasks", "--newest-first", *common))
    assert table.splitlines()[0].strip() == "3 task(s), newest first"
    rows = [line for line in table.splitlines() if line.startswith("│ t")]
    assert [row.split()[1] for row in rows] == ["t2", "t1", "t0"]
    assert "███████░░░  75% 3/4" in rows[0] and "running" in rows[0]
    limited = ok(cli("tasks", "--limit=2", *common))
    assert limited.splitlines()[0].strip() == "2 task(s), the oldest 2 (--limit)"


def test_an_empty_namespace_and_an_empty_match_say_so(
    store: RedisTaskStore, common: tuple[str, str], namespace: str, redis_proc: RedisProc
) -> None:
    empty = f"namespace {namespace!r} on {redis_proc.url} has no tasks"
    assert ok(cli("tasks", *common)) == f"{empty}\n"
    assert ok(cli("tasks", "--status=failed", *common)) == f"{empty}\n"
    assert ok(cli("stats", *common)) == f"{empty}\nno workers have joined this namespace\n"
    user_error(cli("show", "nope", *common), "no task 'nope'", empty)
    assert json.loads(ok(cli("tasks", "--json", *common)))["tasks"] == []
    store.create(snapshot("only"))
    assert ok(cli("tasks", "--status=failed", *common)) == "no tasks match\n"
    assert json.loads(ok(cli("tasks", "--status=failed", "--json", *common)))["tasks"] == []


# -- stats and reconcile ------------------------------------------------------------------------


def test_stats_json_and_tables_with_a_worker(
    store: RedisTaskStore, common: tuple[str, str], namespace: str
) -> None:
    store.create(snapshot("a", bucket=3))
    store.create(snapshot("b", TaskStatus.SUCCEEDED, bucket=3))
    store.create(snapshot("c", TaskStatus.SUCCEEDED, bucket=9))
    worker = Controller(store, app=pool_app, owner="stats-worker")
    worker.join_pool(worker_lease=60).tick()  # joined, holds every bucket; never started
    doc = json.loads(ok(cli("stats", "--json", *common)))
    assert doc["namespace"] == namespace and doc["total"] == 3
    assert doc["counts"] == {"waiting": 0, "pending": 1, "running": 0, "paused": 0, "succeeded": 2,
                             "failed": 0, "stopped": 0, "lost": 0}  # fmt: skip
    assert [(b["bucket"], b["counts"]["pending"], b["counts"]["succeeded"])
            for b in doc["buckets"]] == [(3, 1, 1), (9, 0, 1)]  # fmt: skip
    (entry,) = doc["workers"]
    assert entry["worker"] == "stats-worker" and entry["alive"] is True
    assert entry["buckets"] == list(range(64)) and entry["heartbeat_until"].endswith("Z")
    text = ok(cli("stats", *common))
    assert text.splitlines()[0].strip() == "3 task(s)"
    assert "workers (1 live)" in text
    assert re.search(r"│ stats-worker │ valid for [0-9.]+ s +│ 64: 0-63 │", text), text
    assert re.search(r"│ succeeded +│ +2 │ ██████░░░░  67% 2/3 │", text), text


def test_reconcile_json(store: RedisTaskStore, common: tuple[str, str], namespace: str) -> None:
    nothing = ok(cli("reconcile", *common))
    assert nothing == "nothing to reconcile: no running or paused task's lease has expired\n"
    store.create(snapshot("orphan", TaskStatus.RUNNING, lease_owner="gone", lease_until=T0))
    doc = json.loads(ok(cli("reconcile", "--json", *common)))
    assert doc == {"namespace": namespace, "lost": ["orphan"], "retried": ["orphan"],
                   "stalled": []}  # fmt: skip


# -- submit and prune ---------------------------------------------------------------------------


def test_submit_delay_sets_not_before_and_count_submits_in_batches(
    store: RedisTaskStore, common: tuple[str, str]
) -> None:
    (delayed,) = ok(cli("submit", APP, "work", "--delay=90", *common)).split()
    task = store.get(delayed)
    assert task is not None and task.not_before is not None
    assert 89 <= (task.not_before - task.created_at).total_seconds() <= 90
    many = ok(cli("submit", APP, "work", "--count=250", '--params={"ms": 1}', *common))
    ids = many.splitlines()
    assert len(ids) == len(set(ids)) == 250 and all(re.fullmatch(r"[0-9a-f]{20}", i) for i in ids)
    assert sum(store.counts().values()) == 251
    assert all(t.not_before is None for t in store.query() if t.task_id != delayed)
    tagged = ok(cli("submit", APP, "work", "--count=3", "--delay=30", "--tag=later", *common))
    for task_id in tagged.split():
        stored = store.get(task_id)
        assert stored is not None and stored.not_before is not None
        assert stored.tags == frozenset({"later"})


def test_prune_drops_the_oldest_in_steps_and_keeps_the_newest(
    store: RedisTaskStore, common: tuple[str, str]
) -> None:
    count = 2300  # more than two steps of PRUNE_STEP (1000)
    for i in range(count):
        store.create(snapshot(f"done-{i:05d}", TaskStatus.SUCCEEDED,
                              created_at=T0 + timedelta(seconds=i)))  # fmt: skip
    store.create(snapshot("live", TaskStatus.RUNNING))
    assert ok(cli("prune", "--keep=100", *common)) == f"pruned {count - 100} task(s)\n"
    left = sorted(t.task_id for t in store.query())
    assert left == [*(f"done-{i:05d}" for i in range(count - 100, count)), "live"]
    assert ok(cli("prune", "--keep=100", *common)) == "pruned 0 task(s)\n"


# -- the durability warning -------------------------------------------------------------------


def test_the_durability_warning_is_the_workers_not_every_commands(namespace: str) -> None:
    """Printed once, where it matters (the worker writes every task's progress), not by every
    submit, stop, wait, result or look (issue 30, item 5)."""
    server = RedisProc(extra_args=("--appendonly", "no"))
    try:
        common = (f"--redis={server.url}", f"--namespace={namespace}")
        result = cli("submit", APP, "work", *common)
        (task_id,) = ok(result).split()
        assert result.stderr == "", result.stderr
        for args in (("tasks",), ("show", task_id), ("stats",), ("tasks", "--json"),
                     ("stop", task_id, "--no-wait"), ("result", task_id)):  # fmt: skip
            looked = cli(*args, *common)
            assert looked.returncode in (0, 3), (args, looked.stderr)  # 3: ended, no result
            assert "appendonly" not in looked.stderr, (args, looked.stderr)
        worker = subprocess.Popen(
            [sys.executable, "-m", "chongming_redis.cli", "worker", APP, *common],
            cwd=ROOT, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert worker.stderr is not None
            lines = []
            while not any("worker " in line and " slots" in line for line in lines):
                lines.append(worker.stderr.readline())
                assert lines[-1], "the worker exited: " + "".join(lines)
            assert sum("appendonly is off" in line for line in lines) == 1, lines
        finally:
            worker.terminate()
            worker.communicate(timeout=60)
    finally:
        server.close()


def test_the_durability_warning_is_logged_once_per_process_and_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = (RedisProc(extra_args=("--appendonly", "no")) for _ in range(2))
    try:
        with caplog.at_level(logging.WARNING, logger="chongming_redis.store"):
            for server in (first, first, second, first):
                problems = check_server_settings(server.client())
                assert len(problems) == 1 and "appendonly is off" in problems[0]
        warned = [r.getMessage() for r in caplog.records if "appendonly is off" in r.getMessage()]
        assert len(warned) == 2  # one per server
    finally:
        first.close()
        second.close()
