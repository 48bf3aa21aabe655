"""Processes for the change-feed tests: a writer that creates, saves, touches and prunes at
random, and a reader that follows the feed into a SQLite consumer.

    python -m tests.support.feed_procs writer URL NAMESPACE SEED OPS
    python -m tests.support.feed_procs reader URL NAMESPACE DB STOPFILE

Both ride out a Redis restart (``StoreUnavailable``, ``LOADING``): they wait and go on. The
reader stops once STOPFILE exists and it has read an empty page after that; it exits 3 on a
refused page or an invalid cursor (what the tests must never see).
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from chongming_redis import (
    InvalidCursor,
    StoreError,
    StoreUnavailable,
    TaskSnapshot,
    TaskStatus,
)
from chongming_redis.feed import FeedReader, PageRejected, SqliteFeedConsumer
from chongming_redis.stores.redis import RedisTaskStore

STATUSES = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.FAILED)


def open_store(url: str, namespace: str) -> RedisTaskStore:
    while True:
        try:
            return RedisTaskStore.from_url(url, namespace=namespace, socket_timeout=2, retries=1)
        except StoreError:
            time.sleep(0.1)


def writer(url: str, namespace: str, seed: int, ops: int) -> None:
    rng = random.Random(seed)
    store = open_store(url, namespace)
    made = 0
    for _ in range(ops):
        now = datetime.now(timezone.utc)
        roll = rng.random()
        try:
            if roll < 0.35 or made == 0:
                made += 1
                task_id = f"t{rng.randrange(made + 5)}"  # sometimes a pruned id again
                name = rng.choice(("etl", "mail", "report"))
                snapshot = TaskSnapshot(task_id, name, rng.choice(STATUSES), 1, now, now,
                                        bucket=rng.randrange(4))  # fmt: skip
                store.create(snapshot)
            elif roll < 0.8:
                current = store.get(f"t{rng.randrange(made + 5)}")
                if current is not None:
                    version = current.status_version + rng.choice((1, 2))  # versions may jump
                    moved = replace(current, status=rng.choice(STATUSES), updated_at=now,
                                    status_version=version)  # fmt: skip
                    store.save(moved, expect_version=current.status_version)
            elif roll < 0.9:
                store.touch(f"t{rng.randrange(made + 5)}", heartbeat_at=now)
            else:
                store.prune(keep_terminal=rng.randrange(4))
        except StoreUnavailable:
            time.sleep(0.2)
        except StoreError:
            pass  # an existing id, a conflict after a retried write, LOADING: go on
        if rng.random() < 0.05:
            time.sleep(0.01)


def reader(url: str, namespace: str, db: str, stop_file: str) -> int:
    store = open_store(url, namespace)
    follower = FeedReader(store, SqliteFeedConsumer(db), limit=rng_limit(db))
    while True:
        stopping = Path(stop_file).exists()
        try:
            count = follower.step()
        except (PageRejected, InvalidCursor) as exc:
            print(f"reader refused: {exc!r}", file=sys.stderr, flush=True)
            return 3
        except StoreError:
            time.sleep(0.1)
            continue
        if count == 0:
            if stopping:
                return 0
            time.sleep(0.02)


def rng_limit(db: str) -> int:
    """A small page size (several pages per catch-up), different from run to run."""
    return random.Random(db).choice((1, 3, 7, 16))


def main(argv: list[str]) -> int:
    role, url, namespace = argv[0], argv[1], argv[2]
    if role == "writer":
        writer(url, namespace, int(argv[3]), int(argv[4]))
        return 0
    return reader(url, namespace, argv[3], argv[4])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
