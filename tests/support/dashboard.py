"""Helpers for the dashboard's tests: tasks of every kind in a store, the ids a rendered list
shows, and the dashboard served by a real uvicorn in a thread (the event streams never end,
so they are read over a real socket, not through the in-process test client)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from html import unescape
from typing import Any
from urllib.parse import unquote

import uvicorn
from starlette.applications import Starlette

from chongming_redis.embedded.redis_server import free_port
from chongming_redis.model import Failure, Progress, TaskSnapshot, TaskStatus
from chongming_redis.stores.protocol import TaskStore

BASE = datetime(2026, 1, 1, tzinfo=timezone.utc)
#: Ids that a careless page would break: a slash, a percent, spaces, markup, a quote.
AWKWARD_IDS = ("a/b", "100%", "x y", "<b>bold</b>", 'quo"te', "t1", "t10", "ünï")


def snapshot(task_id: str, i: int, **fields: Any) -> TaskSnapshot:
    """Task number ``i``: created ``i`` seconds after ``BASE`` (two share each second, so
    ties on ``created_at`` are ordered by id)."""
    at = BASE + timedelta(seconds=i // 2)
    defaults: dict[str, Any] = dict(task_id=task_id, name="resize", status=TaskStatus.PENDING,
                                    status_version=1, created_at=at, updated_at=at)  # fmt: skip
    return TaskSnapshot(**{**defaults, **fields})


def fill(store: TaskStore, n: int = 60) -> list[TaskSnapshot]:
    """``n`` tasks mixing names, statuses, tags, buckets and pipelines, plus the awkward ids."""
    # WAITING needs parents (tests/test_dashboard_pipeline.py covers it): the other seven.
    statuses = [s for s in TaskStatus if s is not TaskStatus.WAITING]
    made = []
    for i in range(n):
        task = snapshot(
            f"task-{i:03d}", i,
            name=("resize", "mail", "mail.send")[i % 3],
            status=statuses[i % len(statuses)],
            tags=frozenset({"io"} if i % 4 == 0 else {"ios"} if i % 4 == 1 else set()),
            bucket=i % 5,
            pipeline_run_id="run-1" if i % 6 == 0 else None,
            progress=Progress(i, 100, "half") if i % 7 == 0 else None,
            failure=Failure("ValueError", "bad <input>", "Traceback ...") if i % 9 == 0 else None,
            params={"i": i},
        )  # fmt: skip
        store.create(task)
        made.append(task)
    for j, task_id in enumerate(AWKWARD_IDS):
        task = snapshot(task_id, n + j, name="odd", tags=frozenset({"<tag>"}))
        store.create(task)
        made.append(task)
    return made


ROW_LINK = re.compile(r'<td class="id"><a href="/tasks/([^"]+)">')


def row_ids(html: str) -> list[str]:
    """The task ids of a rendered list, in order (from each row's link)."""
    return [unquote(unescape(m)) for m in ROW_LINK.findall(html)]


def link(html: str, element_id: str) -> str | None:
    found = re.search(rf'href="([^"]+)" id="{element_id}"', html)
    return None if found is None else unescape(found.group(1))


@contextmanager
def served(app: Starlette) -> Iterator[str]:
    """``app`` on a real uvicorn in a thread; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            lifespan="on", timeout_graceful_shutdown=1)  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the dashboard did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
