"""The demo behind ``chongming-redis demo``.

For now it walks one task through the store protocol on a Redis server it starts itself when
``redis-server`` is on PATH, and on the in-memory store otherwise: create, a versioned save, a
rejected stale save, a command claimed and completed, and the audit history read back.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

from rich.console import Console
from rich.table import Table

from chongming_redis.errors import ConcurrencyConflict
from chongming_redis.model import (
    Command,
    CommandKind,
    Progress,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.protocol import TaskStore


def walk_through(store: TaskStore, console: Console) -> None:
    now = datetime.now(timezone.utc)
    task = TaskSnapshot(
        "demo-1",
        "resize-image",
        TaskStatus.PENDING,
        1,
        now,
        now,
        tags=frozenset({"io", "images"}),
        params={"width": 640},
    )
    store.create(task)
    store.append(Transition(task.task_id, 1, None, TaskStatus.PENDING, now, "submitted"))
    running = dataclasses.replace(task, status=TaskStatus.RUNNING, status_version=2)
    store.save(running, expect_version=1)
    store.append(Transition(task.task_id, 2, TaskStatus.PENDING, TaskStatus.RUNNING, now))
    store.touch(task.task_id, progress=Progress(3, 10, "resizing"), heartbeat_at=now)
    try:
        store.save(dataclasses.replace(task, status_version=2), expect_version=1)
    except ConcurrencyConflict as exc:
        console.print(f"[yellow]stale writer refused:[/] {exc}")
    store.submit_command(Command("cmd-1", task.task_id, CommandKind.STOP, now, issued_by="demo"))
    (claimed,) = store.claim_commands(now=now, lease_seconds=30)
    console.print(
        f"claimed {claimed.kind.value} for {claimed.task_id}, lease until "
        f"{claimed.lease_until:%H:%M:%S}"
    )
    stopped = dataclasses.replace(running, status=TaskStatus.STOPPED, status_version=3)
    store.save(stopped, expect_version=2)
    store.append(Transition(task.task_id, 3, TaskStatus.RUNNING, TaskStatus.STOPPED, now, "cmd-1"))
    store.complete_command("cmd-1", now=now, outcome="stopped")

    table = Table(title=f"history of {task.task_id}")
    for column in ("version", "from", "to", "reason"):
        table.add_column(column)
    for entry in store.history(task.task_id):
        table.add_row(
            str(entry.version),
            str(entry.from_status or "-"),
            str(entry.to_status),
            entry.reason or "",
        )
    console.print(table)
    console.print({status.value: n for status, n in store.counts().items() if n})


def run_demo() -> None:
    console = Console()
    console.rule("chongming-redis demo (in-memory store)")
    walk_through(InMemoryTaskStore(), console)
