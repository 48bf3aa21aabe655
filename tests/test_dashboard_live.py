"""The live pages' event streams over a real socket: a change in the store reaches the page
through the change feed (counts, a list row, a task's status and history), a running task's
progress reaches its page although ``touch`` never moves it in the feed, a list page learns of
matching tasks it does not show, and the hub counts each finished task once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from html import unescape
from typing import Any

import httpx
import pytest

from chongming_redis.dashboard import create_app
from chongming_redis.dashboard.hub import FeedHub, Throughput
from chongming_redis.model import Progress, TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.dashboard import fill, served, snapshot
from tests.support.redis_server import RedisProc

pytestmark = pytest.mark.timeout(120)
Patch = dict[str, str]


@pytest.fixture
def store(memory_or_redis_store: TaskStore) -> TaskStore:
    return memory_or_redis_store


@pytest.fixture
def base(store: TaskStore) -> Iterator[str]:
    with served(create_app(store, namespace="live", feed_interval=0.05)) as url:
        yield url


def patches_until(
    url: str, done: Callable[[Patch], bool], *, act: Callable[[], None] | None = None,
    timeout: float = 15.0,
) -> list[Patch]:  # fmt: skip
    """Read ``url``'s stream until a patch satisfies ``done``; ``act`` runs after the first
    patch (the page as loaded)."""
    seen: list[Patch] = []
    deadline = time.monotonic() + timeout
    with httpx.stream("GET", url, timeout=httpx.Timeout(5.0, read=timeout)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "patch":
                patch: Patch = json.loads(line[6:])
                seen.append(patch)
                if len(seen) == 1 and act is not None:
                    act()
                elif done(patch):
                    return seen
            if time.monotonic() > deadline:
                break
    raise AssertionError(f"no such patch within {timeout} s; got {[sorted(p) for p in seen]}")


def advance(store: TaskStore, task_id: str, **changes: Any) -> TaskSnapshot:
    task = store.get(task_id)
    assert task is not None
    moved = task.evolve(status_version=task.status_version + 1,
                        updated_at=datetime.now(timezone.utc), **changes)  # fmt: skip
    store.save(moved, expect_version=task.status_version)
    return moved


def test_the_overview_counts_follow_a_change(base: str, store: TaskStore) -> None:
    fill(store, 10)
    total, running = sum(store.counts().values()), store.counts()[TaskStatus.RUNNING]
    patches = patches_until(
        f"{base}/events/overview",
        lambda p: (
            f'<b data-status="running">{running + 1}</b>' in p.get("counts", "")
            and f'<b data-status="total">{total + 1}</b>' in p["counts"]
        ),
        act=lambda: store.create(snapshot("late", 99, status=TaskStatus.RUNNING)),
    )
    assert f'<b data-status="total">{total}</b>' in patches[0]["counts"]


def test_a_task_page_follows_status_history_and_progress(base: str, store: TaskStore) -> None:
    store.create(snapshot("job", 0))

    def run_it() -> None:
        advance(store, "job", status=TaskStatus.RUNNING)
        store.touch("job", progress=Progress(3, 4, "three of four"))

    progressed = lambda p: "three of four" in p.get("task-progress", "")  # noqa: E731
    patches = patches_until(f"{base}/events/task?id=job", progressed, act=run_it)
    assert "No progress reported" in patches[0]["task-progress"]
    statuses = "".join(p.get("task-summary", "") for p in patches)
    assert 'data-status="running"' in statuses
    final = patches_until(f"{base}/events/task?id=job",
                          lambda p: 'data-status="succeeded"' in p.get("task-summary", ""),
                          act=lambda: advance(store, "job", status=TaskStatus.SUCCEEDED,
                                              result={"ok": 1}))  # fmt: skip
    assert any('"ok": 1' in unescape(p.get("task-outcome", "")) for p in final)


def test_a_pruned_task_page_says_so_and_the_stream_ends(base: str, store: TaskStore) -> None:
    store.create(snapshot("gone", 0, status=TaskStatus.SUCCEEDED))
    store.create(snapshot("kept", 1, status=TaskStatus.SUCCEEDED))
    patches = patches_until(f"{base}/events/task?id=gone",
                            lambda p: "no longer exists" in p.get("alert", ""),
                            act=lambda: store.prune(keep_terminal=1))  # fmt: skip
    assert patches[-1]["alert"]


def test_a_list_page_updates_its_rows_and_counts_new_matching_tasks(
    base: str, store: TaskStore
) -> None:
    fill(store, 20)
    shown = [t.task_id for t in store.query(TaskQuery(name="resize"))][:5]

    def change() -> None:
        advance(store, shown[2], status=TaskStatus.LOST)
        store.create(snapshot("new-match", 200))  # pending, matches the page's filters
        store.create(snapshot("new-other", 201, name="elsewhere"))  # does not match

    got: set[str] = set()

    def both_seen(patch: Patch) -> bool:  # the two changes may come in one patch or in two
        got.update(k for k in patch if k in ("list-notice", "row-2"))
        return got == {"list-notice", "row-2"}

    patches = patches_until(
        f"{base}/events/tasks?order=oldest&limit=5&name=resize",
        both_seen,
        act=change,
        timeout=15,
    )
    rows = {k: v for p in patches for k, v in p.items() if k.startswith("row-")}
    assert 'data-status="lost"' in rows["row-2"]
    notice = next(p["list-notice"] for p in reversed(patches) if "list-notice" in p)
    assert notice.startswith("1 other task")  # new-match; not new-other, not the shown row


def test_a_bad_list_stream_is_a_400(base: str) -> None:
    assert httpx.get(f"{base}/events/tasks?status=bogus").status_code == 400
    assert httpx.get(f"{base}/events/task").status_code == 400


# -- the hub -------------------------------------------------------------------------------------


def test_throughput_counts_each_finish_once_in_its_bin() -> None:
    meter = Throughput(window=60, bin_seconds=10)
    now = datetime(2026, 1, 1, 0, 1, 0, tzinfo=timezone.utc)
    done = snapshot("a", 0, status=TaskStatus.SUCCEEDED, updated_at=now - timedelta(seconds=15))
    meter.add(done)
    meter.add(done)  # the same finish read twice
    meter.add(snapshot("b", 0, status=TaskStatus.RUNNING, updated_at=now))  # not finished
    meter.add(snapshot("c", 0, status=TaskStatus.FAILED, updated_at=now - timedelta(seconds=5)))
    series = meter.series(now)
    assert len(series) == 6 and sum(n for _, n in series) == 2
    assert [n for _, n in series[-3:]] == [1, 1, 0]  # 00:00:40, 00:00:50, the current bin
    assert meter.per_second(now, seconds=10) == 0.1  # the last whole bin only


def test_the_hub_seeds_from_recent_positions_and_hands_every_change_to_each_subscriber() -> None:
    import asyncio

    store = InMemoryTaskStore()
    for i in range(30):
        store.create(snapshot(f"old-{i}", i, status=TaskStatus.SUCCEEDED,
                              updated_at=datetime.now(timezone.utc)))  # fmt: skip

    async def scenario() -> tuple[int, list[str], list[str]]:
        hub = FeedHub(store, interval=0.01, seed_positions=10)
        a, b = hub.subscribe(), hub.subscribe()
        assert await hub.step() is False  # seeded, caught up
        store.create(snapshot("fresh", 50))
        assert await hub.step() is True
        assert await hub.step() is False
        got_a = [i.task_id for i in await a.queue.get()]
        got_b = [i.task_id for i in await b.queue.get()]
        return sum(n for _, n in hub.throughput.series(datetime.now(timezone.utc))), got_a, got_b

    seeded, got_a, got_b = asyncio.run(scenario())
    assert seeded == 10  # only the last ten positions were read back
    assert got_a == got_b == ["fresh"]


def test_a_page_loaded_inside_a_hub_batch_gets_only_what_came_after_its_load() -> None:
    """The hub behind the feed reads positions 1..12 as one batch; a page that loaded at
    position 8 already shows 1..8: it is handed 9..12 only (else it would count tasks it
    shows, or that were there when it loaded, as changed since), a page older than the
    batch all of it, a page newer than the batch nothing."""
    import asyncio

    store = InMemoryTaskStore()

    async def scenario() -> tuple[list[str], list[str], bool]:
        hub = FeedHub(store, interval=0.01, seed_positions=0)
        assert await hub.step() is False  # caught up with an empty feed
        for i in range(12):
            store.create(snapshot(f"t{i:02d}", i))
        inside, before, after = hub.subscribe(), hub.subscribe(), hub.subscribe()
        inside.since, before.since, after.since = 8, 0, 12
        assert await hub.step() is True
        got_inside = [i.task_id for i in await inside.queue.get()]
        got_before = [i.task_id for i in await before.queue.get()]
        return got_inside, got_before, after.queue.empty()

    got_inside, got_before, after_empty = asyncio.run(scenario())
    assert got_inside == ["t08", "t09", "t10", "t11"]
    assert got_before == [f"t{i:02d}" for i in range(12)]
    assert after_empty


def test_a_reset_or_an_overflow_reaches_a_stream_as_reset() -> None:
    import asyncio

    from chongming_redis.dashboard.events import RESET, next_batch

    async def scenario() -> list[object]:
        hub = FeedHub(InMemoryTaskStore())
        sub = hub.subscribe()
        got: list[object] = [await next_batch(sub, 0.01)]  # nothing: None
        hub._publish((), 0)  # the feed followed again from a new head
        got.append(await next_batch(sub, 0.01))
        item = snapshot("a", 0)
        for _ in range(65):  # one more than the queue holds
            hub._publish((item,), 1)
        got.append(await next_batch(sub, 0.01))
        return got

    none, reset, overflow = asyncio.run(scenario())
    assert none is None and reset is RESET and overflow is RESET


@pytest.mark.redis
def test_a_task_that_does_not_decode_does_not_stop_the_feed(
    redis_proc: RedisProc, namespace: str
) -> None:
    import asyncio

    from chongming_redis.stores._redis.keys import Keys

    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    for i in range(5):
        store.create(snapshot(f"t{i}", i))
    server = redis_proc.client()
    server.hset(Keys(namespace).task("t2"), "c", "not-a-time")  # written by something else

    async def scenario() -> list[str]:
        hub = FeedHub(store, seed_positions=0)
        sub = hub.subscribe()
        seen: list[str] = []
        for _ in range(50):
            await hub.step()
            while not sub.queue.empty():
                seen += [i.task_id for i in sub.queue.get_nowait()]
        store.create(snapshot("after", 9))
        for _ in range(10):
            await hub.step()
            while not sub.queue.empty():
                seen += [i.task_id for i in sub.queue.get_nowait()]
        return seen

    hub_seen = asyncio.run(scenario())
    assert "after" in hub_seen  # live updates go on past the bad record
    assert "t2" not in hub_seen
    server.close()
    store.drop_namespace()
    store.close()
