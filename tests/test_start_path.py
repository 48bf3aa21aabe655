"""The start path through real ``chongming-redis worker`` processes, as a new user runs them, on
Redis, a SQLite file and PostgreSQL (issue 24's defects, each once a black-box finding):

1. tasks not yet due in front of due ones never stall them;
2. ``RUNNING`` means a slot runs the task: never more ``RUNNING`` than slots, the recorded
   start close to when the function began;
3. a free slot of another worker takes one key's backlog (work conservation);
4. two apps in one namespace each run their own tasks, none stranded;
5. one key's backlog fills every free slot at once;
6. priorities: a higher priority starts first.

Every check counts outcomes and orders events; none times a run against a budget.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.client.client import Client
from chongming_redis.embedded.workers import WorkerProcesses
from chongming_redis.model import TaskStatus
from chongming_redis.stress.checkers import START
from tests.support.store_targets import STORE_KINDS, StoreTarget

ROOT = Path(__file__).resolve().parents[1]

APP_SOURCE = """
import time
from chongming_redis import App

app = App("tasks")


@app.task("noop")
def noop(ctx, params):
    return {"began": time.time()}


@app.task("hold")
def hold(ctx, params):
    began = time.time()
    deadline = began + params["seconds"]
    while time.time() < deadline:
        ctx.checkpoint()
        time.sleep(0.01)
    return {"began": began, "ended": time.time()}


mail = App("mail")


@mail.task("send")
def send(ctx, params):
    return {"began": time.time()}
"""


class Workers:
    """``chongming-redis worker`` processes (``embedded.workers.WorkerProcesses``, one per app)
    on one store target, stopped at the end."""

    def __init__(self, tmp: Path, target: StoreTarget) -> None:
        self.tmp, self.target = tmp, target
        (tmp / "startapp.py").write_text(APP_SOURCE, "utf-8")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
        self.env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(ROOT)])
        self.apps: dict[str, WorkerProcesses] = {}

    def start(self, app: str = "startapp:app", *args: str) -> None:
        if app not in self.apps:
            logs = self.tmp / app.replace(":", "-")
            logs.mkdir()
            self.apps[app] = WorkerProcesses(app, self.target.url, self.target.namespace,
                                             logdir=logs, env=self.env, cwd=self.tmp)  # fmt: skip
        self.apps[app].spawn(["--grace", "5", *args])

    def logs(self) -> str:
        return "\n".join(p.read_text("utf-8", "replace") for p in self.tmp.glob("*/worker-*.log"))

    def stop(self) -> None:
        for workers in self.apps.values():
            workers.stop_all(timeout=30)


@pytest.fixture(params=STORE_KINDS)
def target(request: pytest.FixtureRequest, tmp_path: Path, namespace: str) -> Iterator[Any]:
    from tests.support.store_targets import store_target

    yield from store_target(request, request.param, tmp_path, namespace)


@pytest.fixture
def workers(tmp_path: Path, target: StoreTarget) -> Iterator[Workers]:
    started = Workers(tmp_path, target)
    yield started
    started.stop()


@pytest.fixture
def client(target: StoreTarget) -> Iterator[Client]:
    opened = Client(target.open(), num_buckets=64, owns_store=True)
    yield opened
    opened.close()


def wait_until(check: Callable[[], bool], what: str, workers: Workers, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{workers.logs()}"
        time.sleep(0.05)


def succeeded(client: Client, ids: list[str]) -> bool:
    return all((s := client.get(t)) is not None and s.status is TaskStatus.SUCCEEDED for t in ids)


def starter_of(client: Client, task_id: str) -> str:
    (start,) = [e for e in client.history(task_id) if START.match(e.reason or "")]
    match = START.match(start.reason or "")
    assert match is not None
    return match["owner"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tasks_not_yet_due_in_front_never_stall_the_due_ones(
    workers: Workers, client: Client
) -> None:
    """400 tasks delayed by 10 minutes, then 200 due ones: a worker with the defaults runs
    the 200 and leaves the 400 alone (before, not one of the 200 had started after 15 s)."""
    delayed = [h.task_id for h in client.submit_many("noop", [None] * 400, delay=600)]
    due = [h.task_id for h in client.submit_many("noop", [None] * 200)]
    workers.start()
    wait_until(lambda: succeeded(client, due), "the 200 due tasks", workers)
    assert client.stats()[TaskStatus.PENDING] == 400
    assert all((s := client.get(t)) is not None and s.status is TaskStatus.PENDING for t in delayed)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_running_never_counts_more_tasks_than_slots_and_a_start_is_when_the_function_began(
    workers: Workers, client: Client
) -> None:
    """A worker (4 slots) warmed up on quick tasks, then given 4 tasks of 3 s and 6 quick ones:
    the store never shows more than 4 ``RUNNING`` (before: 10, the quick ones recorded
    ``RUNNING`` 8 s before their function began), and each quick task's recorded start is at
    most a moment before its function began."""
    workers.start()
    warm = [h.task_id for h in client.submit_many("noop", [None] * 50)]
    wait_until(lambda: succeeded(client, warm), "the warm-up", workers)
    long = [h.task_id for h in client.submit_many("hold", [{"seconds": 3}] * 4)]
    quick = [h.task_id for h in client.submit_many("noop", [None] * 6)]
    most = 0
    while not succeeded(client, long + quick):
        most = max(most, client.stats()[TaskStatus.RUNNING])
        time.sleep(0.01)
    assert 1 <= most <= 4, most
    for task_id in quick:
        snapshot = client.get(task_id)
        assert snapshot is not None and isinstance(snapshot.result, dict)
        (start,) = [e for e in client.history(task_id) if START.match(e.reason or "")]
        waited = snapshot.result["began"] - start.at.timestamp()
        assert waited < 1.0, f"{task_id} was RUNNING {waited:.2f}s before its function began"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_free_worker_takes_one_keys_backlog_from_the_busy_owner(
    workers: Workers, client: Client
) -> None:
    """Two workers of 4 slots, 8 tasks of 4 s with one key (one bucket, one owner): all 8 run
    at once, on both workers (before: all on the owner, 4 at a time, the other idle)."""
    workers.start()
    workers.start()
    wait_until(lambda: len(client.store.pool_state()[0]) == 2, "two pool members", workers)
    ids = [h.task_id for h in client.submit_many("hold", [{"seconds": 4}] * 8, key="one-key")]
    wait_until(lambda: succeeded(client, ids), "the 8 tasks", workers)
    results = [s.result for s in (client.get(t) for t in ids) if s is not None]
    assert max(r["began"] for r in results) < min(r["ended"] for r in results), "all 8 at once"
    assert len({starter_of(client, t) for t in ids}) == 2


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_apps_in_one_namespace_each_run_their_tasks_and_strand_none(
    workers: Workers, client: Client
) -> None:
    """``worker startapp:app`` beside ``worker startapp:mail`` in one namespace: each bucket
    has one owner, which runs one of the two apps; every task still runs (before: tasks of
    the other app in a worker's buckets waited until that worker left)."""
    workers.start("startapp:app")
    workers.start("startapp:mail")
    wait_until(lambda: len(client.store.pool_state()[0]) == 2, "two pool members", workers)
    noops = [h.task_id for h in client.submit_many("noop", [None] * 20)]
    sends = [h.task_id for h in client.submit_many("send", [None] * 20)]
    wait_until(lambda: succeeded(client, noops + sends), "both apps' tasks", workers)
    assert len({starter_of(client, t) for t in noops}) == 1
    assert len({starter_of(client, t) for t in sends}) == 1
    assert {starter_of(client, noops[0])} != {starter_of(client, sends[0])}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_one_keys_backlog_fills_every_free_slot_at_once(workers: Workers, client: Client) -> None:
    """16 tasks of one key and 16 free slots: all 16 run at once (before: two per second)."""
    ids = [h.task_id for h in client.submit_many("hold", [{"seconds": 3}] * 16, key="k")]
    workers.start("startapp:app", "--concurrency", "16")
    wait_until(lambda: succeeded(client, ids), "the 16 tasks", workers)
    results = [s.result for s in (client.get(t) for t in ids) if s is not None]
    assert max(r["began"] for r in results) < min(r["ended"] for r in results), "all 16 at once"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_higher_priority_starts_first_on_a_busy_worker(workers: Workers, client: Client) -> None:
    """One slot, a backlog of 10 priority-0 tasks and, submitted after them, 3 of priority 5:
    the 3 run before the rest of the backlog (the one already running aside)."""
    low = [h.task_id for h in client.submit_many("hold", [{"seconds": 0.2}] * 10)]
    high = [h.task_id for h in client.submit_many("hold", [{"seconds": 0.2}] * 3, priority=5)]
    assert {s.priority for s in (client.get(t) for t in high) if s is not None} == {5}
    workers.start("startapp:app", "--concurrency", "1")
    wait_until(lambda: succeeded(client, low + high), "the 13 tasks", workers)
    began = {t: s.result["began"] for t in low + high if (s := client.get(t)) is not None}
    order = sorted(began, key=began.__getitem__)
    assert set(order[:3]) == set(high), order
