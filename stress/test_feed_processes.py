"""The change feed with real processes: a writer creating, saving, touching and pruning at
random while a reader process follows the feed into SQLite. At the end the reader's view equals
the store — every live task at its final version, every pruned task a tombstone, nothing
missing — also when the reader is killed with SIGKILL at random moments and restarted from its
persisted cursor, and when Redis is killed with kill -9 and restarted mid-read."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chongming_redis import Tombstone
from chongming_redis.feed import SqliteFeedConsumer
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.feed_procs", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
    )


def finish(process: subprocess.Popen[bytes], timeout: float = 120) -> None:
    _, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err.decode()[-2000:]


def assert_reader_equals_store(store: RedisTaskStore, db: Path) -> int:
    """The reader's bindings against the store: live tasks at their final version and
    identity, pruned ids removed. Returns how many ids it compared."""
    bound = SqliteFeedConsumer(db).all_bindings()
    live = {t.task_id: t for t in store.query()}
    cursor, removed = "0", set()
    while page := store.changes(cursor, 256).tasks:  # the ground truth of removals
        for item in page:
            if isinstance(item, Tombstone):
                removed.add(item.task_id)
        cursor = store.changes(cursor, 256).next_cursor
    for task_id, task in live.items():
        b = bound.get(task_id)
        assert b is not None, f"{task_id} missing from the reader"
        assert not b.removed, task_id
        assert (b.name, b.bucket, b.status, b.status_version) == (
            task.name, task.bucket, task.status.value, task.status_version), task_id  # fmt: skip
    for task_id in removed - set(live):
        assert bound[task_id].removed, f"{task_id} was pruned but the reader still has it"
    assert set(bound) == set(live) | removed
    assert SqliteFeedConsumer(db).cursor() == cursor
    return len(bound)


@pytest.fixture
def server(fresh_redis_proc: RedisProc) -> RedisProc:
    return fresh_redis_proc


def test_a_reader_process_following_a_writer_process_ends_equal_to_the_store(
    server: RedisProc, tmp_path: Path, namespace: str
) -> None:
    db, stop = tmp_path / "reader.db", tmp_path / "stop"
    writer = spawn("writer", server.url, namespace, "11", "1500")
    reader = spawn("reader", server.url, namespace, str(db), str(stop))
    finish(writer)
    stop.touch()
    finish(reader)
    store = RedisTaskStore.from_url(server.url, namespace=namespace)
    compared = assert_reader_equals_store(store, db)
    stats = store.feed_stats()
    assert compared > 20 and stats.tombstones > 0, (compared, stats)


def test_a_reader_killed_at_random_moments_resumes_from_its_cursor_and_misses_nothing(
    server: RedisProc, tmp_path: Path, namespace: str
) -> None:
    db, stop = tmp_path / "reader.db", tmp_path / "stop"
    rng = random.Random(5)
    writer = spawn("writer", server.url, namespace, "12", "2500")
    kills = 0
    while writer.poll() is None and kills < 12:
        reader = spawn("reader", server.url, namespace, str(db), str(stop))
        time.sleep(rng.uniform(0.1, 0.6))
        reader.send_signal(signal.SIGKILL)
        reader.communicate()
        kills += 1
    finish(writer)
    stop.touch()
    finish(spawn("reader", server.url, namespace, str(db), str(stop)))
    assert kills >= 3
    store = RedisTaskStore.from_url(server.url, namespace=namespace)
    assert assert_reader_equals_store(store, db) > 20


def test_redis_killed_with_kill_9_mid_read_loses_no_position_and_no_change(
    server: RedisProc, tmp_path: Path, namespace: str
) -> None:
    db, stop = tmp_path / "reader.db", tmp_path / "stop"
    writer = spawn("writer", server.url, namespace, "13", "6000")
    reader = spawn("reader", server.url, namespace, str(db), str(stop))
    restarts = 0
    while writer.poll() is None and restarts < 4:
        time.sleep(0.6)
        store = RedisTaskStore.from_url(server.url, namespace=namespace)
        before = store.feed_stats().head
        store.close()
        server.kill9()
        server.restart()
        restarts += 1
        store = RedisTaskStore.from_url(server.url, namespace=namespace)
        after = store.feed_stats().head
        store.close()
        assert after >= before, f"the feed went back across a restart: {before} -> {after}"
    assert restarts >= 2, "Redis must die while the writer and the reader run"
    finish(writer)
    stop.touch()
    finish(reader)  # exit 3 would mean an invalid cursor or a refused page
    store = RedisTaskStore.from_url(server.url, namespace=namespace)
    assert assert_reader_equals_store(store, db) > 20
