"""The bucket pool reacts to a join or a leave by a nudge, not at its next tick.

Every worker here has a 60 s worker lease, so its pool ticks only every 20 s: a share that moves
within the few seconds these tests wait moved because of a ``{ns}:nudge:pool`` message (the
newcomer announces itself, the owner sheds and announces, the newcomer takes). Without the
nudges each of these tests waits out its deadline and fails. A lost nudge costs one tick, never
correctness; ``tests/test_pool.py`` drives the ticks by hand for that.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chongming_redis.runtime.app import App
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.context import TaskContext
from chongming_redis.runtime.controller import Controller
from chongming_redis.runtime.pool import BucketPool
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

NUM_BUCKETS = 16
SLOW_TICKS = 60.0  # worker lease: a tick every 20 s
DEADLINE = 8.0  # far below one tick, far above a few round trips on a busy machine


def noop_app() -> App:
    app = App("nudges")

    @app.task()
    def noop(ctx: TaskContext, params: Any) -> None:
        return None

    return app


@pytest.fixture
def start_worker(redis_proc: RedisProc, namespace: str) -> Iterator[Callable[[str], Controller]]:
    started: list[Controller] = []

    def start(name: str) -> Controller:
        store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
        controller = Controller(store, app=noop_app(), owner=name,
                                buckets=BucketPolicy(NUM_BUCKETS))  # fmt: skip
        controller.join_pool(worker_lease=SLOW_TICKS)
        controller.start()
        started.append(controller)
        return controller

    yield start
    for controller in started:
        controller.shutdown(grace=1)
        controller.store.close()


def pool_of(controller: Controller) -> BucketPool:
    assert controller.bucket_pool is not None
    return controller.bucket_pool


def wait_for(predicate: Callable[[], bool], what: str) -> float:
    """Seconds until ``predicate`` holds; fails after ``DEADLINE``."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > DEADLINE:
            raise AssertionError(f"no {what} within {DEADLINE}s: the pool nudge did not arrive")
        time.sleep(0.005)
    return time.monotonic() - started


def shares(store: RedisTaskStore) -> Counter[str]:
    return Counter(store.pool_state()[1].values())


@pytest.mark.redis
def test_a_newcomer_gets_its_share_of_a_running_pool_without_waiting_for_a_tick(
    start_worker: Callable[[str], Controller],
) -> None:
    first = start_worker("n-first")
    assert pool_of(first).held == frozenset(range(NUM_BUCKETS))  # alone: every bucket
    second = start_worker("n-second")
    took = wait_for(lambda: len(pool_of(second).held) == NUM_BUCKETS // 2, "share for the newcomer")
    wait_for(lambda: len(pool_of(first).held) == NUM_BUCKETS // 2, "shed by the old owner")
    # What each believes is what the store says, and what each starter serves.
    assert shares(first.store) == {"n-first": NUM_BUCKETS // 2, "n-second": NUM_BUCKETS // 2}
    assert pool_of(first).held.isdisjoint(pool_of(second).held)
    assert second.serve_buckets == pool_of(second).held
    assert first.serve_buckets == pool_of(first).held
    print(f"\nnewcomer had its {NUM_BUCKETS // 2} buckets {took * 1000:.0f} ms after joining")


@pytest.mark.redis
def test_a_leavers_buckets_are_taken_at_once_and_only_they_move(
    start_worker: Callable[[str], Controller],
) -> None:
    workers = [start_worker(f"l-{i}") for i in range(3)]
    wait_for(lambda: sorted(shares(workers[0].store).values()) == [5, 5, 6], "a settled pool")
    wait_for(lambda: all(len(pool_of(w).held) in (5, 6) for w in workers), "settled views")
    before = dict(workers[0].store.pool_state()[1])
    leaver = workers.pop()
    leaver.shutdown(grace=1)  # leaves the pool: releases its buckets and announces it
    wait_for(
        lambda: sum(len(pool_of(w).held) for w in workers) == NUM_BUCKETS, "the leaver's buckets"
    )
    after = workers[0].store.pool_state()[1]
    assert set(after.values()) == {"l-0", "l-1"}
    moved = {b for b in range(NUM_BUCKETS) if after[b] != before[b]}
    assert moved == {b for b, w in before.items() if w == "l-2"}
