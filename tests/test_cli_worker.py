"""``chongming-redis worker`` (issue 13), run as a real process: its log lines (one line each:
time, level, message; ``--log-level``), the Ctrl-C hint, ``--max-attempts`` and
``--retry-backoff`` reaching the retry policy, the private Redis it names, and a Redis (or
PostgreSQL) outage logged once, summarised, and ended by "reconnected to Redis after N s".
``OutageLog`` itself is checked with a fake clock. The worker end to end also on a SQLite file
and on PostgreSQL (``--store``).
"""

from __future__ import annotations

import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.embedded.redis_server import server_version_text
from chongming_redis.errors import StoreError, StoreUnavailable
from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.loops import OutageLog, every
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.pool_app import app as pool_app
from tests.support.redis_server import RedisProc
from tests.support.store_targets import WITH_VALKEY, StoreTarget
from tests.test_cli import APP, ROOT, cli, ok

LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR) +\S")
CTRL_C = "press Ctrl-C to stop (a second Ctrl-C hands running tasks back at once)"


class Worker:
    """A ``chongming-redis worker`` process whose stderr is read line by line."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chongming_redis.cli", "worker", APP, *args],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for line in self.proc.stderr:
                self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if predicate(line):
                    return line
            left = deadline - time.monotonic()
            assert left > 0, "\n".join(self.lines)
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, "the worker exited:\n" + "\n".join(self.lines)
            self.lines.append(line)

    def stop(self) -> int:
        """SIGINT (Ctrl-C), then every line up to the exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(60)
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        return code


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(10)
        worker.reader.join(10)


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# -- log lines ----------------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.timeout(90)
@pytest.mark.parametrize("target", WITH_VALKEY, indirect=True)
def test_the_worker_logs_one_line_per_record_and_says_how_to_stop(
    target: StoreTarget, workers: list[Worker]
) -> None:
    """End to end on every store: ``worker`` and ``submit`` given its URL, a task run."""
    common = target.cli_args()
    worker = Worker(*common, "--max-attempts=5", "--log-level=info")
    workers.append(worker)
    worker.wait_for(lambda line: line == CTRL_C)
    started = worker.wait_for(lambda line: "up to 5 attempts per task" in line)
    where = "SQLite database " if target.kind == "sqlite" else f"namespace '{target.namespace}'"
    assert where in started, started
    (task_id,) = ok(cli("submit", APP, "work", *common)).split()
    worker.wait_for(lambda line: task_id in line and "succeeded" in line)
    assert worker.stop() == 0
    assert [line for line in worker.lines if line != CTRL_C and not LOG_LINE.match(line)] == []
    assert any(" INFO " in line and task_id in line for line in worker.lines)


@pytest.mark.redis
@pytest.mark.timeout(90)
def test_log_level_warning_hides_the_info_lines(
    redis_proc: RedisProc, namespace: str, workers: list[Worker]
) -> None:
    common = (f"--redis={redis_proc.url}", f"--namespace={namespace}")
    worker = Worker(*common, "--log-level=WARNING")
    workers.append(worker)
    worker.wait_for(lambda line: line == CTRL_C)
    (task_id,) = ok(cli("submit", APP, "work", *common)).split()
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    wait_until(lambda: (t := store.get(task_id)) is not None and t.status is TaskStatus.SUCCEEDED)
    store.close()
    assert worker.stop() == 0
    assert not any(" INFO " in line for line in worker.lines), worker.lines
    assert any(" WARNING " in line and "shutting down" in line for line in worker.lines)


# -- retries ------------------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.timeout(90)
@pytest.mark.parametrize("max_attempts", [1, 2])
def test_max_attempts_and_retry_backoff_reach_the_retry_policy(
    redis_proc: RedisProc, namespace: str, workers: list[Worker], max_attempts: int
) -> None:
    """A task whose holder died (its lease expired an hour ago): with ``--max-attempts 1`` it
    stays LOST; with 2 it gets a second attempt, 15-45 s (a 30 s backoff, ± 50 % jitter)
    after it was marked lost."""
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    store.create(TaskSnapshot("orphan", "work", TaskStatus.RUNNING, 1, long_ago, long_ago,
                              lease_owner="gone", lease_until=long_ago))  # fmt: skip
    worker = Worker(f"--redis={redis_proc.url}", f"--namespace={namespace}", "--task-lease=2",
                    f"--max-attempts={max_attempts}", "--retry-backoff=30")  # fmt: skip
    workers.append(worker)
    wait_until(lambda: len(store.history("orphan")) >= (1 if max_attempts == 1 else 2))
    history = store.history("orphan")
    lost = next(h for h in history if h.to_status is TaskStatus.LOST)
    task = store.get("orphan")
    assert task is not None
    if max_attempts == 1:
        assert task.status is TaskStatus.LOST and task.attempt == 1 and len(history) == 1
    else:
        assert task.status is TaskStatus.PENDING and task.attempt == 2
        assert task.not_before is not None
        assert 15 <= (task.not_before - lost.at).total_seconds() <= 45  # 30 s ± 50 %
    assert worker.stop() == 0
    store.close()


# -- the private Redis --------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.timeout(90)
def test_without_redis_the_worker_names_the_private_redis_it_started(
    workers: list[Worker],
) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server on PATH")  # the redis mark fails this in CI
    worker = Worker()
    workers.append(worker)
    line = worker.wait_for(lambda line: line.startswith("started a private Redis"))
    version = server_version_text(binary)
    assert re.fullmatch(
        rf"started a private Redis {re.escape(version)} \(redis-server from PATH\) at unix://\S+",
        line,
    ), line
    worker.wait_for(lambda line: line == CTRL_C)
    assert worker.stop() == 0


# -- an outage ----------------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", ["Redis", "PostgreSQL"])
def test_an_outage_is_logged_once_and_its_end_as_reconnected(
    request: pytest.FixtureRequest, server: str, namespace: str, workers: list[Worker]
) -> None:
    """A stopped Redis, a SIGKILLed PostgreSQL: one line when it goes, at most a summary per
    interval, one line naming the store when it is back (psycopg's pool says nothing)."""
    if server == "Redis":
        proc: Any = request.getfixturevalue("fresh_redis_proc")
        options = (f"--redis={proc.url}", f"--namespace={namespace}")
    else:
        proc = request.getfixturevalue("fresh_postgres_proc")
        options = (f"--store={proc.dsn}", f"--namespace={namespace}")
    worker = Worker(*options, "--worker-lease=1", "--task-lease=2")
    workers.append(worker)
    worker.wait_for(lambda line: line == CTRL_C)
    # Started (its first pool tick is the last store call of the start): a store lost during
    # the start is a failed start, exit 1, not an outage.
    worker.wait_for(lambda line: "buckets +[0-63]" in line)
    proc.stop() if server == "Redis" else proc.kill9()
    first = worker.wait_for(lambda line: "further failures are summarised" in line)
    assert " WARNING cannot " in first and f"until {server} answers" in first, first
    proc.restart()
    worker.wait_for(lambda line: f"reconnected to {server} after" in line)
    assert worker.stop() == 0
    assert sum("further failures are summarised" in line for line in worker.lines) == 1
    ended = [line for line in worker.lines if f"reconnected to {server} after" in line]
    assert len(ended) == 1 and re.search(
        rf" INFO +reconnected to {server} after [0-9.]+ s \(", ended[0]
    )
    assert [line for line in worker.lines if line != CTRL_C and not LOG_LINE.match(line)] == []


# -- OutageLog with a fake clock ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def outage_log() -> tuple[OutageLog, Clock, list[str]]:
    clock, lines = Clock(), []
    logger = logging.getLogger("test.outage")

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(f"{record.levelname} {record.getMessage()}")

    logger.handlers[:] = [Collect()]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return OutageLog(summary_every=15, logger=logger, clock=clock), clock, lines


def test_the_first_failure_is_logged_then_a_summary_per_interval_then_reconnected() -> None:
    log, clock, lines = outage_log()
    down = StoreUnavailable("connection refused")
    log.succeeded()
    assert lines == []  # no outage, nothing to say
    for _ in range(10):  # ten failures within 5 s
        log.failed("look for work", down)
        clock.now += 0.5
    assert lines == ["WARNING cannot look for work: connection refused (further failures are "
                     "summarised every 15 s until Redis answers)"]  # fmt: skip
    clock.now = 1015.0
    log.failed("claim commands", down)
    assert lines[1] == ("WARNING Redis still unreachable after 15 s (10 more failed call(s); "
                        "last: cannot claim commands: connection refused)")  # fmt: skip
    clock.now = 1020.0
    log.failed("reconcile", down)
    assert len(lines) == 2  # the next summary is due at 1030
    clock.now = 1022.5
    log.succeeded()
    log.succeeded()
    assert lines[2:] == ["INFO reconnected to Redis after 22.5 s (12 failed call(s))"]
    log.failed("reconcile", down)  # a new outage: its first failure is logged again
    assert lines[3].startswith("WARNING cannot reconcile: connection refused")


def test_failures_long_after_the_last_one_start_a_new_outage() -> None:
    """Where nothing reports success (no pool heartbeat), a failure more than two summary
    intervals after the last one is a new outage, not "still unreachable"."""
    log, clock, lines = outage_log()
    down = StoreUnavailable("reset")
    log.failed("reconcile", down)
    clock.now += 31
    log.failed("reconcile", down)
    assert [line.split(":")[0] for line in lines] == ["WARNING cannot reconcile"] * 2


def test_every_reports_unreachable_to_the_outage_log_and_other_errors_each_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log, _, lines = outage_log()
    running, wake = threading.Event(), threading.Event()
    running.set()
    results: list[BaseException | None] = [StoreUnavailable("down"), StoreUnavailable("down"),
                                           StoreError("corrupt"), None, None]  # fmt: skip

    def body() -> None:
        result = results.pop(0)
        if not results:
            running.clear()
        if result is not None:
            raise result

    with caplog.at_level(logging.WARNING, logger="chongming_redis.runtime"):
        every(0, body, running=running, wake=wake, what="look", reaches_store=True, outage=log)
    assert len(lines) == 2 and lines[0].startswith("WARNING cannot look: down (further")
    assert lines[1] == "INFO reconnected to Redis after 0.0 s (2 failed call(s))"
    assert [r.getMessage() for r in caplog.records] == ["cannot look: corrupt"]


def test_a_loop_that_may_not_reach_the_store_does_not_end_an_outage() -> None:
    log, _, lines = outage_log()
    running, wake = threading.Event(), threading.Event()
    running.set()
    results: list[BaseException | None] = [StoreUnavailable("down"), None, None]

    def body() -> None:
        result = results.pop(0)
        if not results:
            running.clear()
        if result is not None:
            raise result

    every(0, body, running=running, wake=wake, what="look for work", outage=log)
    assert len(lines) == 1 and log.in_outage


@pytest.mark.redis
@pytest.mark.timeout(90)
def test_a_quick_second_ctrl_c_hands_a_lone_workers_task_back_at_once(
    redis_proc: RedisProc, namespace: str, workers: list[Worker]
) -> None:
    """A worker without a --processes parent gets every Ctrl-C once: the second one, however
    soon, is not taken for a repeat of the first — the running task goes back at once instead
    of the worker waiting out its 30 s grace."""
    common = (f"--redis={redis_proc.url}", f"--namespace={namespace}")
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    worker = Worker(*common, "--grace=30")
    workers.append(worker)
    worker.wait_for(lambda line: CTRL_C in line)
    task_id = Controller(store, app=pool_app).submit("work", {"ms": 60_000})
    worker.wait_for(lambda line: f"task {task_id} work started" in line)
    began = time.monotonic()
    worker.proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    worker.proc.send_signal(signal.SIGINT)
    worker.proc.wait(25)
    assert time.monotonic() - began < 20  # not the 30 s grace
    task = store.get(task_id)
    # handed back: the same attempt runs again, a hand-back is not a try that went wrong
    assert task is not None and task.status is TaskStatus.PENDING and task.attempt == 1
    store.close()


# -- polling without nudges ---------------------------------------------------------------------


def test_a_worker_on_a_store_without_nudges_polls_every_fifth_of_a_second(
    redis_proc: RedisProc, namespace: str, tmp_path: Path
) -> None:
    """Nudges wake a Redis worker at once (its polls are a fallback: 1 s, 0.5 s); on a store
    without them (SQLite, PostgreSQL, the in-memory store) the poll is the reaction time."""
    from chongming_redis.cli.worker import UNNUDGED_POLL, polling_for
    from chongming_redis.runtime.config import ControllerConfig
    from chongming_redis.stores.memory import InMemoryTaskStore
    from chongming_redis.stores.sqlite import SqliteTaskStore

    config = ControllerConfig(command_poll_interval=0.5, start_poll_interval=1.0)
    redis_store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    assert polling_for(redis_store, config) == config
    redis_store.close()
    for store in (InMemoryTaskStore(), SqliteTaskStore(tmp_path / "t.db")):
        polled = polling_for(store, config)
        assert (polled.start_poll_interval, polled.command_poll_interval) == (UNNUDGED_POLL,) * 2
        assert polled.task_lease == config.task_lease  # nothing else changes
        fast = ControllerConfig(command_poll_interval=0.05, start_poll_interval=0.05)
        assert polling_for(store, fast) == fast  # never slower than asked
        store.close()
