"""What an attempt is, counted one way (issue 29, item 4).

An attempt is one try of the task that can go wrong: it ends succeeded, failed (raised, timed
out) or found ``LOST`` (its worker died or stalled past its lease). A hand-back — a worker's
graceful shutdown giving a running task back — is not a try that went wrong: it keeps the
attempt, and the next start runs the same attempt again. ``ctx.attempt``, the history's
``started by ... (attempt N)``, the worker's log lines and ``--max-attempts`` all count the same
thing. Before, every hand-back took an attempt number: a task caught by three rolling restarts
ran as "attempt 4" under "up to 3 attempts".

The process test runs real ``chongming-redis worker`` processes on a real redis-server: two
graceful restarts catch the task running, then two SIGKILLs; with ``--max-attempts=2`` it ends
``LOST`` after exactly two attempts, four runs.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.client.client import Client
from chongming_redis.demo.run import audit
from chongming_redis.model import TaskStatus, Transition
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.pool_app import app as pool_app
from tests.support.redis_server import RedisProc
from tests.test_cli_worker import Worker, wait_until, workers  # noqa: F401 (the fixture)

P, R, L = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.LOST
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _entry(version: int, frm: TaskStatus | None, to: TaskStatus, reason: str) -> Transition:
    return Transition("t", version, frm, to, T0, reason)


def test_the_demo_audit_counts_a_handed_back_run_once() -> None:
    handed = [_entry(1, None, P, "submitted"), _entry(2, P, R, "started by a (attempt 1)"),
              _entry(3, R, P, "handed back at shutdown"),
              _entry(4, P, R, "started by b (attempt 1)")]  # fmt: skip
    assert audit(handed) == (1, "b")
    twice = [*handed[:2], _entry(3, P, R, "started by b (attempt 1)")]
    assert audit(twice) == (2, "b")  # two starts of one attempt with no hand-back between
    assert audit([]) == (0, None)


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_hand_backs_keep_the_attempt_and_max_attempts_counts_the_rest(
    redis_proc: RedisProc,
    namespace: str,
    tmp_path: Path,
    workers: list[Worker],  # noqa: F811
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    runs = tmp_path / "runs"
    common = (f"--redis={redis_proc.url}", f"--namespace={namespace}", "--max-attempts=2",
              "--task-lease=2", "--worker-lease=2", "--retry-backoff=0.1",
              "--grace=0.2")  # fmt: skip
    client = Client(store, app=pool_app)
    task_id = client.submit("work", {"ms": 60_000, "runs_file": str(runs)}).task_id

    def run_once(attempt: int) -> Worker:
        worker = Worker(*common)
        workers.append(worker)
        worker.wait_for(lambda line: f"task {task_id} work started (attempt {attempt})" in line)
        return worker

    for _ in range(2):  # two rolling restarts catch it running: each hands it back
        worker = run_once(1)
        assert worker.stop() == 0
        back = f"task {task_id} work handed back at shutdown: attempt 1 runs again (pending)"
        assert any(back in line for line in worker.lines), worker.lines
        snapshot = store.get(task_id)
        assert snapshot is not None and (snapshot.status, snapshot.attempt) == (P, 1)

    def killed_once_it_ran(attempt: int, runs_before: int) -> None:
        worker = run_once(attempt)  # killed once its function began (its run recorded)
        wait_until(lambda: runs.exists() and len(runs.read_text().splitlines()) > runs_before)
        worker.proc.kill()

    killed_once_it_ran(1, 2)  # the third run dies: LOST, and the policy's second attempt
    killed_once_it_ran(2, 3)  # the second attempt dies too: no third under --max-attempts=2
    last = Worker(*common)
    workers.append(last)

    def lost() -> Any:
        snapshot = store.get(task_id)
        return snapshot is not None and snapshot.status is L

    wait_until(lost, timeout=60)
    final = store.get(task_id)
    assert final is not None and final.attempt == 2
    history = store.history(task_id)
    started = [t.reason for t in history if t.from_status is P and t.to_status is R]
    assert [r.rsplit("(", 1)[-1] if r else r for r in started] == [
        "attempt 1)", "attempt 1)", "attempt 1)", "attempt 2)",
    ]  # fmt: skip
    retries = [t.reason or "" for t in history if (t.reason or "").startswith("retry")]
    assert len(retries) == 1 and retries[0].startswith("retry 2/2 after lost")
    # what each run's function saw as ctx.attempt, recorded outside the store
    attempts = [line.split()[1] for line in runs.read_text().splitlines()]
    assert attempts == ["1", "1", "1", "2"]
    assert last.stop() == 0
    store.close()
