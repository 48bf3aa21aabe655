"""Task types nobody runs are reported (``runtime/stranded.py``): by ``stats`` (a warning line,
``stranded`` in ``--json``) and by a worker's log, instead of waiting in silence."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.runtime.app import App
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.stranded import describe, stranded_types
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[1]


def pending(task_id: str, name: str, age: float, **fields: object) -> TaskSnapshot:
    created = NOW - timedelta(seconds=age)
    return TaskSnapshot(task_id, name, TaskStatus.PENDING, 1, created, created, **fields)  # type: ignore[arg-type]


def seed(store: object) -> None:
    for task in (
        pending("s1", "send", 300), pending("s2", "send", 90), pending("s3", "send", 10),
        pending("r1", "resize", 61),
        pending("late", "report", 600, not_before=NOW + timedelta(seconds=30)),  # not due
        pending("due", "report", 600, not_before=NOW - timedelta(seconds=5)),  # due 5 s ago
    ):  # fmt: skip
        store.create(task)  # type: ignore[attr-defined]
    done = pending("d1", "send", 900).evolve(status=TaskStatus.SUCCEEDED, status_version=2)
    store.create(done)  # type: ignore[attr-defined]


def test_types_whose_due_tasks_waited_past_the_threshold_are_reported_longest_first() -> None:
    store = InMemoryTaskStore()
    seed(store)
    found = stranded_types(store, NOW)
    assert [(s.name, s.waiting, s.longest.total_seconds()) for s in found] == [
        ("send", 2, 300.0), ("resize", 1, 61.0)
    ]  # fmt: skip
    assert [s.name for s in stranded_types(store, NOW, ignore={"send"})] == ["resize"]
    assert stranded_types(store, NOW, after=timedelta(minutes=10)) == []
    assert stranded_types(InMemoryTaskStore(), NOW) == []
    line = describe(found[0])
    assert line.startswith("2 pending task(s) of type 'send' have been due for up to 300 s")


def test_a_worker_logs_the_types_it_does_not_run_and_not_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemoryTaskStore()
    seed(store)
    app = App()

    @app.task("send")
    def send(ctx: object, params: object) -> None:
        return None

    worker = Controller(store, app=app, owner="w1")
    worker.clock.now = lambda: NOW  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="chongming_redis.runtime"):
        worker._stranded.tick(worker.clock.now())
        worker._stranded.tick(worker.clock.now())  # at most once a minute
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "type 'resize'" in lines[0] and lines[0].startswith("w1: ")


def test_stats_prints_a_warning_line_and_json_lists_them(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite3"
    store = SqliteTaskStore(path)
    now = datetime.now(UTC)
    created = now - timedelta(seconds=120)
    store.create(TaskSnapshot("s1", "send", TaskStatus.PENDING, 1, created, created))
    store.create(TaskSnapshot("n1", "noop", TaskStatus.PENDING, 1, now, now))
    store.close()
    command = [sys.executable, "-m", "chongming_redis.cli", "stats", f"--store=sqlite://{path}"]
    shown = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "warning: 1 pending task(s) of type 'send' have been due for up to 12" in shown.stdout
    assert "'noop'" not in shown.stdout
    as_json = subprocess.run([*command, "--json"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    (entry,) = json.loads(as_json.stdout)["stranded"]
    assert entry["name"] == "send" and entry["waiting"] == 1 and entry["longest_seconds"] >= 120
