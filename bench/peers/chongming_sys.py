"""chongming-redis: submitted through a ``Controller`` (one task per call, or ``submit_many``:
up to 100 per round trip), run by ``chongming-redis worker APP --redis URL --namespace NS
--processes P`` and nothing else (4 slots per process, 64 buckets; ``--processes 1`` runs the
worker in the CLI's own process, ``--processes 2`` a parent that starts two children).
Afterwards every task's history is read back: exactly one ``PENDING -> RUNNING``, ending
``SUCCEEDED``."""

from __future__ import annotations

import time
from typing import Any

from bench.peers.harness import BIN, System

TASK = "noop"
SPEC = "bench.peers.chongming_app:app"


def _submitter(url: str, namespace: str) -> Any:
    """The one place that knows how a client submits (today a ``Controller``)."""
    from bench.peers.chongming_app import app
    from chongming_redis.runtime.controller import Controller
    from chongming_redis.stores.redis import RedisTaskStore

    store = RedisTaskStore.from_url(url, namespace=namespace, check_server=False)
    return Controller(store, app=app, owner="bench-submit")


def _close(submitter: Any) -> None:
    submitter.notifier.close()
    submitter.store.close()


def enqueue_one_by_one(url: str, namespace: str, n: int) -> tuple[float, list[str]]:
    submitter = _submitter(url, namespace)
    try:
        started = time.perf_counter()
        ids = [submitter.submit(TASK, None) for _ in range(n)]
        return time.perf_counter() - started, ids
    finally:
        _close(submitter)


def enqueue_bulk(url: str, namespace: str, n: int) -> tuple[float, list[str]]:
    submitter = _submitter(url, namespace)
    try:
        started = time.perf_counter()
        ids = submitter.submit_many(TASK, [None] * n)
        return time.perf_counter() - started, ids
    finally:
        _close(submitter)


def worker_command(url: str, namespace: str, processes: int) -> list[str]:
    return [str(BIN / "chongming-redis"), "worker", SPEC, "--redis", url,
            "--namespace", namespace, "--processes", str(processes)]  # fmt: skip


def check(url: str, namespace: str, ids: list[str], n: int) -> dict[str, Any]:
    """Every task's history: exactly one ``PENDING -> RUNNING`` and a last entry
    ``SUCCEEDED``; plus the store's own count of ``SUCCEEDED`` tasks."""
    from chongming_redis.model import TaskStatus
    from chongming_redis.stores.redis import RedisTaskStore

    store = RedisTaskStore.from_url(url, namespace=namespace, check_server=False)
    violations: list[str] = []
    try:
        for task_id in ids:
            history = store.history(task_id)
            starts = sum(1 for t in history if t.from_status is TaskStatus.PENDING
                         and t.to_status is TaskStatus.RUNNING)  # fmt: skip
            last = history[-1].to_status if history else None
            if starts != 1 or last is not TaskStatus.SUCCEEDED:
                violations.append(f"{task_id}: {starts} starts, last {last}")
        succeeded = store.counts()[TaskStatus.SUCCEEDED]
    finally:
        store.close()
    good = len(ids) - len(violations)
    return {"exactly_once": good, "checked": len(ids), "succeeded": succeeded,
            "violations": violations[:20], "ok": good == n == len(ids) == succeeded,
            "line": f"exactly once: {good}/{n} (store counts {succeeded} SUCCEEDED)"}  # fmt: skip


SYSTEM = System(
    name="chongming",
    module="chongming_redis",
    packages=("chongming-redis",),
    enqueue_one_by_one=enqueue_one_by_one,
    enqueue_bulk=enqueue_bulk,
    worker_command=worker_command,
    check=check,
    bulk_note="Controller.submit_many",
)
