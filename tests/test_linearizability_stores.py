"""The linearizability check bites on real stores: recorded clients racing on a real Redis and
on the in-memory store are linearizable; the ``skip-cas`` blind start (``stress/app.py``) and a
store whose save checks and writes in two steps are not (the negative controls of issue 29)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.errors import ConcurrencyConflict
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.sqlite import SqliteTaskStore
from chongming_redis.stress import app as stress_app
from chongming_redis.stress import oplog
from chongming_redis.stress.app import blind_start_tasks
from tests.support.redis_server import RedisProc

NOW = datetime.now(timezone.utc)
TASKS = [f"t{i}" for i in range(8)]


class TwoStepSaveStore(InMemoryTaskStore):
    """BROKEN on purpose: ``save`` reads and compares the version, then, a moment later, writes
    whatever is stored by then (a check-then-act race, no compare-and-set)."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        current = self.get(snapshot.task_id)
        actual = None if current is None else current.status_version
        if actual != expect_version:
            raise ConcurrencyConflict(snapshot.task_id, expect_version, actual)
        time.sleep(0.02)  # the window between the check and the write
        with self._lock:  # an unconditional write of what the model sees
            row = self._tasks[snapshot.task_id]
            row.update(status=snapshot.status.value, status_version=snapshot.status_version)


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[oplog.Recorder]:
    made = oplog.Recorder(tmp_path / "ops")
    yield made
    made.close()


Opener = Callable[[], Any]


def _opener(kind: str, recorder: oplog.Recorder, request: pytest.FixtureRequest,
            namespace: str, **methods: Any) -> Opener:  # fmt: skip
    """A function opening one more client of one shared store, its calls recorded."""
    if kind == "redis":
        server: RedisProc = request.getfixturevalue("redis_proc")
        cls: Any = oplog.record_class(type("RecordedRedis", (RedisTaskStore,), methods), recorder)
        return lambda: cls.from_url(server.url, namespace=namespace)
    if kind == "sqlite":
        path = request.getfixturevalue("tmp_path") / "tasks.db"
        sqlite_cls: Any = oplog.record_class(type("RecordedSqlite", (SqliteTaskStore,), methods),
                                             recorder)  # fmt: skip
        return lambda: sqlite_cls(path)
    base = TwoStepSaveStore if kind == "two-step" else InMemoryTaskStore
    shared = oplog.record_class(type("RecordedMemory", (base,), methods), recorder)()
    return lambda: shared


def _report(recorder: oplog.Recorder, store: Any) -> dict[str, Any]:
    recorder.close()
    finals = {t: store.get(t) for t in TASKS}
    histories = {t: store.history(t) for t in TASKS}
    return oplog.check_dir(recorder.directory, histories, final_snapshots=finals)


def _in_threads(*bodies: Callable[[], None]) -> None:
    """Run each body in its own thread; re-raise the first error any of them met."""
    errors: list[BaseException] = []

    def run(body: Callable[[], None]) -> None:
        try:
            body()
        except BaseException as exc:
            errors.append(exc)
            raise

    threads = [threading.Thread(target=run, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]


def _create_all(store: Any) -> None:
    for task_id in TASKS:
        store.create(TaskSnapshot(task_id, "step", TaskStatus.PENDING, 1, NOW, NOW))


def _starter(open_store: Opener, owner: str, delay: float) -> Callable[[], None]:
    def start() -> None:
        store = open_store()
        time.sleep(delay)
        store.start_tasks(owner=owner, now=NOW, lease_until=NOW + timedelta(seconds=30),
                          buckets=[0], limit=50)  # fmt: skip

    return start


@pytest.mark.parametrize(("kind", "blind"), [("redis", True), ("redis", False), ("memory", False)])
def test_two_starters_racing_over_the_same_pending_tasks(
    kind: str, blind: bool, recorder: oplog.Recorder, request: pytest.FixtureRequest,
    namespace: str,
) -> None:  # fmt: skip
    methods = {"start_tasks": blind_start_tasks} if blind else {}
    open_store = _opener(kind, recorder, request, namespace, **methods)
    store = open_store()
    _create_all(store)
    # The blind start reads the PENDING tasks, then writes each 50 ms apart; the second starter,
    # 25 ms behind, reads the same list and overwrites each task the first one started.
    _in_threads(_starter(open_store, "A", 0.0), _starter(open_store, "B", 0.025))
    report = _report(recorder, store)
    assert report["histories"] == len(TASKS) and report["unknown"] == []
    if not blind:
        assert report["violations"] == []
        return
    assert report["violations"], "the blind start must be reported as not linearizable"
    assert {v["kind"] for v in report["violations"]} == {"not_linearizable"}
    text = "\n".join(report["violations"][0]["example"])
    assert "start by A" in text and "start by B" in text


def _cas_saver(open_store: Opener, barrier: threading.Barrier, rounds: int) -> Callable[[], None]:
    """Each round, every saver reads one task at the same moment and saves the next version
    from what it read: exactly one may win each round."""

    def save_rounds() -> None:
        store = open_store()
        for i in range(rounds):
            task_id = TASKS[i % len(TASKS)]
            barrier.wait(timeout=30)
            seen = store.get(task_id)
            status = TaskStatus.RUNNING if seen.status_version % 2 else TaskStatus.PENDING
            after = dataclasses.replace(seen, status=status, status_version=seen.status_version + 1)
            with contextlib.suppress(ConcurrencyConflict):  # the round's losers
                store.save(after, expect_version=seen.status_version)

    return save_rounds


@pytest.mark.parametrize("kind", ["two-step", "memory", "redis", "sqlite"])
def test_concurrent_compare_and_set_saves(
    kind: str, recorder: oplog.Recorder, request: pytest.FixtureRequest, namespace: str
) -> None:
    open_store = _opener(kind, recorder, request, namespace)
    store = open_store()
    _create_all(store)
    savers, rounds = 3, 12
    barrier = threading.Barrier(savers)
    _in_threads(*[_cas_saver(open_store, barrier, rounds) for _ in range(savers)])
    report = _report(recorder, store)
    assert report["histories"] == len(TASKS) and report["unknown"] == []
    assert report["operations"] >= len(TASKS) + 2 * savers * rounds
    if kind != "two-step":
        assert report["violations"] == []
        return
    assert report["violations"], "a save that checks and writes in two steps must be caught"
    example = "\n".join(report["violations"][0]["example"])
    assert "save v1 -> v2" in example and "-> ok" in example


STARTER = """
import os, sys, time
from datetime import datetime, timedelta, timezone
import chongming_redis.stress.app  # applies CHONGMING_STRESS_UNSAFE (skip-cas) first
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stress import oplog
oplog.install()  # after the control: it wraps what the process really calls
store = RedisTaskStore.from_url(sys.argv[1], namespace=sys.argv[2])
time.sleep(max(0.0, (int(sys.argv[3]) - time.monotonic_ns()) / 1e9))
now = datetime.now(timezone.utc)
store.start_tasks(owner=sys.argv[4], now=now, lease_until=now + timedelta(seconds=30),
                  buckets=[0], limit=50)
"""


@pytest.mark.parametrize("unsafe", ["skip-cas", ""])
def test_worker_processes_recorded_through_the_environment(
    unsafe: str, tmp_path: Path, redis_proc: RedisProc, namespace: str
) -> None:
    """The wiring the harness uses: separate processes, ``install()`` from the environment,
    ``CHONGMING_STRESS_UNSAFE=skip-cas`` applied by the app module; bounds on CLOCK_MONOTONIC
    compared across processes."""
    directory = tmp_path / "ops"
    recorder = oplog.Recorder(directory)  # the producer, in this process
    producer: Any = oplog.record_class(type("RecordedRedis", (RedisTaskStore,), {}), recorder)
    store: Any = producer.from_url(redis_proc.url, namespace=namespace)
    _create_all(store)
    env = {**os.environ, oplog.OPLOG_ENV: str(directory), stress_app.UNSAFE_ENV: unsafe}
    start_at = time.monotonic_ns() + 2_000_000_000  # both processes imported by then
    starters = [subprocess.Popen([sys.executable, "-c", STARTER, redis_proc.url, namespace,
                                  str(start_at + delay), owner], env=env)
                for owner, delay in (("A", 0), ("B", 25_000_000))]  # fmt: skip
    assert [p.wait(timeout=60) for p in starters] == [0, 0]
    store.close()
    recorder.close()
    check = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    report = oplog.check_dir(directory, {t: check.history(t) for t in TASKS},
                             final_snapshots={t: check.get(t) for t in TASKS})  # fmt: skip
    check.close()
    assert report["processes"] == 3 and report["histories"] == len(TASKS)
    assert bool(report["violations"]) is (unsafe == "skip-cas")
