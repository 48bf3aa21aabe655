"""``StoreAdapter``: each store's extensions are resolved once, and a store with none of them
(``MinimalStore``: the 14 protocol methods of an ``InMemoryTaskStore`` and nothing else) runs
the whole runtime through the fallbacks with the same results and a gapless history."""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from chongming_redis import InMemoryTaskStore, TaskSnapshot, TaskStatus, Transition
from chongming_redis.errors import ConcurrencyConflict, TaskAlreadyExists
from chongming_redis.policy import RetryPolicy
from chongming_redis.runtime.app import App, UnknownTask
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.store_adapter import StoreAdapter
from chongming_redis.stores.extensions import EXTENSIONS
from chongming_redis.stores.protocol import PROTOCOL_METHODS, TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.test_controller import (
    FAST,
    chain,
    moves,
    ticker,
    unfinished_commands,
    wait_command_done,
    wait_history,
    wait_status,
)

P, R, PA = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED
OK, FAILED, STOPPED = TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.STOPPED
T0 = datetime(2024, 3, 10, 12, 0, 0, 123456, tzinfo=timezone.utc)
BUILT_IN = {
    "BatchingStore",
    "FencedTouchStore",
    "ServerClockStore",
    "BucketCountingStore",
    "CommandReadingStore",
    "TaskTypesStore",
    "PagedQueryStore",
    "CommandInspectingStore",
    "TaskPoliciesStore",
}
REDIS_ONLY = {"BucketPoolStore", "NudgeStore", "RecordedBucketsStore", "WorkerBeatsStore"}


class MinimalStore:
    """The 14 protocol methods of an ``InMemoryTaskStore`` (``inner``), nothing more."""

    def __init__(self) -> None:
        self.inner = InMemoryTaskStore()


def _forward(name: str) -> Callable[..., Any]:
    @functools.wraps(getattr(InMemoryTaskStore, name))
    def forward(self: MinimalStore, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    return forward


for _name in PROTOCOL_METHODS:
    setattr(MinimalStore, _name, _forward(_name))


def task(task_id: str, status: TaskStatus = P, version: int = 1, **fields: Any) -> TaskSnapshot:
    created = T0 + timedelta(seconds=fields.pop("created", 0))
    return TaskSnapshot(task_id, fields.pop("name", "job"), status, version, created, created,
                        **fields)  # fmt: skip


def entry(task_id: str, version: int, to: TaskStatus = P) -> Transition:
    return Transition(task_id, version, None if version == 1 else P, to, T0, "x")


# -- which extensions -------------------------------------------------------------------------


#: The extensions added after the adapter's first ones, which every built-in store implements.
LATER = {
    "LimitsStore",
    "SchedulesStore",
    "DependenciesStore",
    "TaskSchemasStore",
    "CommitStartStore",
}


def test_the_adapter_resolves_each_extension_of_each_store(
    redis_proc: RedisProc, namespace: str
) -> None:
    minimal = MinimalStore()
    assert isinstance(minimal, TaskStore)
    assert not any(isinstance(minimal, proto) for proto in EXTENSIONS.values())
    redis_store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    expected: list[tuple[Any, set[str]]] = [
        (InMemoryTaskStore(), BUILT_IN | LATER),
        (redis_store, BUILT_IN | REDIS_ONLY | LATER),
        (minimal, set()),
    ]
    for store, names in expected:
        adapter = StoreAdapter(store)
        assert adapter.extensions == names, store
        assert adapter.batching is ("BatchingStore" in names)
        assert (adapter.pool is store) is ("BucketPoolStore" in names)
        assert (adapter.nudge is store) is ("NudgeStore" in names)
        assert (adapter.server_time() is None) is ("ServerClockStore" not in names)
        controller = Controller(store)
        assert controller.adapter.extensions == names
        if "BucketPoolStore" not in names:
            with pytest.raises(TypeError, match="BucketPoolStore"):
                controller.join_pool()
    redis_store.close()


# -- the fallbacks give what the extensions give ----------------------------------------------


def test_commit_without_batching_reports_the_same_per_item_errors_and_writes() -> None:
    plain, batching = MinimalStore(), InMemoryTaskStore()
    for store in (plain, batching):
        store.create(task("a", R, 3))
        store.create(task("b"))
        store.create(task("c"))
        store.touch("b", lease_owner="w1", lease_until=T0)
        items = [
            (task("a", OK, 5), 2, [entry("a", 5, OK)]),  # stale: a conflict, nothing written
            (task("b", R, 2, lease_owner="x", lease_until=T0), 1, [entry("b", 2, R)]),
            (task("new"), None, [entry("new", 1)]),
            (task("c", R), None, [entry("c", 1)]),  # exists
        ]
        errors = [type(e) for e in StoreAdapter(store).commit(items)]
        assert errors == [ConcurrencyConflict, type(None), type(None), TaskAlreadyExists]
    assert plain.query() == batching.query()
    assert plain.get("b").lease_owner == "w1", "a save never writes the lease"
    for task_id in ("a", "b", "c", "new"):
        assert plain.history(task_id) == batching.history(task_id)
    assert StoreAdapter(plain).bucket_counts() == batching.bucket_counts()


def test_start_without_batching_starts_the_same_tasks_the_same_way() -> None:
    plain, batching = MinimalStore(), InMemoryTaskStore()
    for store in (plain, batching):
        store.create(task("late", created=1, not_before=T0 + timedelta(hours=1)))
        store.create(task("other", created=2, name="other"))
        store.create(task("b9", created=3, bucket=9))
        store.create(task("c", created=4, attempt=2))
        store.create(task("d", created=5))
        store.create(task("e", created=6))
    now, until = T0 + timedelta(seconds=100), T0 + timedelta(seconds=130)
    args: dict[str, Any] = {"now": now, "lease_until": until, "buckets": {0}, "num_buckets": 16,
                            "limit": 2, "names": {"job"}}  # fmt: skip
    plain_started = StoreAdapter(plain, owner="w1").start(**args)
    batch_started = StoreAdapter(batching, owner="w1").start(**args)
    assert [s.snapshot for s in plain_started] == [s.snapshot for s in batch_started]
    assert [s.snapshot.task_id for s in plain_started] == ["c", "d"]
    assert all(s.leased and not s.unwritten for s in plain_started + batch_started)
    for store in (plain, batching):
        assert store.history("c") == [Transition("c", 2, P, R, now, "started by w1 (attempt 2)")]
        assert store.get("c").lease_until == until
    assert StoreAdapter(plain, owner="w1").start(**{**args, "buckets": None, "limit": 5}) != []


def test_a_fallback_start_finds_due_tasks_behind_many_delayed_ones_in_start_order() -> None:
    """Without batching the runtime lists PENDING tasks oldest first; 8 buckets each with 50
    delayed tasks in front of two due ones (one of priority 3): every due task starts, in the
    start order of the batching reference, none of the delayed ones (the window grows)."""
    plain, batching = MinimalStore(), InMemoryTaskStore()
    later = T0 + timedelta(hours=1)
    for store in (plain, batching):
        for b in range(8):
            for i in range(50):
                store.create(task(f"late-{b}-{i}", created=i / 100, bucket=b, not_before=later))
            store.create(task(f"due-{b}", created=10 + b, bucket=b))
            store.create(task(f"vip-{b}", created=20 + b, bucket=b, priority=3))
    now, until = T0 + timedelta(seconds=100), T0 + timedelta(seconds=130)
    args: dict[str, Any] = {"now": now, "lease_until": until, "buckets": set(range(8)),
                            "num_buckets": 8, "limit": 5, "names": set()}  # fmt: skip
    rounds = []
    for _ in range(4):
        plain_started = [s.snapshot.task_id for s in StoreAdapter(plain, owner="w").start(**args)]
        batch_started = [s.snapshot.task_id for s in StoreAdapter(batching).start(**args)]
        assert plain_started == batch_started
        rounds.append(plain_started)
    assert rounds[0] == [f"vip-{b}" for b in range(5)]
    assert rounds[1] == ["vip-5", "vip-6", "vip-7", "due-0", "due-1"]
    assert rounds[2] == [f"due-{b}" for b in range(2, 7)] and rounds[3] == ["due-7"]
    assert plain.counts()[P] == 400


def test_a_fallback_start_puts_a_newer_higher_priority_first() -> None:
    plain = MinimalStore()
    for i in range(8):
        plain.create(task(f"old{i}", created=i))
    plain.create(task("vip", created=100, priority=100))
    args: dict[str, Any] = {"now": T0 + timedelta(seconds=200), "buckets": None,
                            "lease_until": T0 + timedelta(seconds=300), "num_buckets": 1,
                            "limit": 1, "names": set()}  # fmt: skip
    assert [s.snapshot.task_id for s in StoreAdapter(plain).start(**args)] == ["vip"]
    assert [s.snapshot.task_id for s in StoreAdapter(plain).start(**args)] == ["old0"]


def test_touch_without_the_fence_is_a_plain_touch_that_reports_success() -> None:
    plain = MinimalStore()
    plain.create(task("a", R, 3))
    assert StoreAdapter(plain).touch_fenced("a", expect_version=1, lease_owner="zombie")
    assert plain.get("a").lease_owner == "zombie", "without the fence, nothing is fenced off"


# -- a whole runtime on a store without extensions --------------------------------------------


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def minimal(gate: threading.Event) -> Iterator[tuple[MinimalStore, Callable[..., Controller]]]:
    store = MinimalStore()
    made: list[Controller] = []

    def factory(**options: Any) -> Controller:
        controller = Controller(store, **{**FAST, **options})
        made.append(controller)
        return controller

    yield store, factory
    gate.set()
    for controller in made:
        if controller._running.is_set():
            controller.shutdown(grace=0, hand_back="stop")


def gapless(store: Any, task_id: str) -> list[tuple[int, TaskStatus | None, TaskStatus]]:
    history = store.history(task_id)
    assert [t.version for t in history] == list(range(1, len(history) + 1)), history
    for before, after in itertools.pairwise(history):
        assert after.from_status is before.to_status, history
    assert history[-1].version == store.get(task_id).status_version
    return moves(history)


def test_a_store_without_extensions_runs_submits_and_finishes_tasks(minimal: Any) -> None:
    store, make = minimal
    worker = make(retry=RetryPolicy(max_attempts=2, base_delay=0.05, retry_on=(Exception,)))
    assert not worker.adapter.batching and worker.adapter.extensions == frozenset()

    @worker.task()
    def double(ctx: TaskContext, params: Any) -> int:
        return int(params["n"]) * 2

    @worker.task()
    def flaky(ctx: TaskContext, params: Any) -> str:
        if ctx.attempt == 1:
            raise ConnectionError("first try fails")
        return "second try"

    worker.start()
    assert not worker.runner.group_commit
    one = worker.submit("double", {"n": 1}, key="k1")
    many = worker.submit_many("double", [{"n": n} for n in range(2, 7)])
    retried = worker.submit("flaky")
    for task_id, n in zip([one, *many], range(1, 7)):
        assert wait_status(store, task_id, OK).result == 2 * n
        wait_history(store, task_id, 3)
        assert gapless(store, task_id) == chain(P, R, OK)
    done = wait_status(store, retried, OK)
    assert (done.result, done.attempt) == ("second try", 2)
    wait_history(store, retried, 6)
    assert gapless(store, retried) == chain(P, R, FAILED, P, R, OK)
    with pytest.raises(UnknownTask):
        worker.submit_many("nope", [{}])

    counts = worker.bucket_counts()
    assert sum(per[OK] for per in counts.values()) == 7
    assert counts == StoreAdapter(store.inner).bucket_counts()


def test_a_store_without_extensions_pauses_resumes_and_stops_through_commands(
    minimal: Any, gate: threading.Event
) -> None:
    store, make = minimal
    app = App()
    counter = [0]
    app.task("tick")(ticker(counter, gate))
    worker = make(app=app, owner="holder")
    client = make(app=app, owner="client")  # never started: a pure client
    worker.start()
    task_id = client.submit("tick")
    assert wait_status(store, task_id, R).lease_owner == "holder"

    for send, status, outcome in ((client.pause, PA, "paused"), (client.resume, R, "resumed"),
                                  (client.stop, STOPPED, "stopped")):  # fmt: skip
        sent = send(task_id)
        wait_status(store, task_id, status)
        assert wait_command_done(store.inner, sent.removeprefix("sent:")).outcome == outcome
    wait_history(store, task_id, 5)
    assert gapless(store, task_id) == chain(P, R, PA, R, STOPPED)
    assert unfinished_commands(store) == []

    paused_early = client.submit("tick", not_before=datetime(2100, 1, 1, tzinfo=timezone.utc))
    assert client.pause(paused_early).startswith("sent:")
    wait_status(store, paused_early, PA)
    assert client.stop(paused_early).startswith("sent:")
    wait_status(store, paused_early, STOPPED)
    assert gapless(store, paused_early) == chain(P, PA, STOPPED)


# -- moved from test_store_extensions.py: batching on Redis, end to end ----------------------


def test_submit_many_creates_every_task_with_its_history_in_few_round_trips(
    redis_proc: RedisProc, namespace: str
) -> None:
    app = App("batch")

    @app.task()
    def noop(ctx, params):  # type: ignore[no-untyped-def]
        return None

    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = Controller(store, app=app, owner="submitter")
    ids = client.submit_many("noop", [{"i": i} for i in range(250)])
    assert len(set(ids)) == 250
    assert store.counts()[P] == 250
    assert [h.to_status for h in store.history(ids[-1])] == [P]
    with pytest.raises(UnknownTask):
        client.submit_many("nope", [{}])
    assert store.counts()[P] == 250
    store.close()
