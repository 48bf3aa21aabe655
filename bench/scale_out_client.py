"""The client processes of ``bench.scale_out``: submitters and drainers of a sharded namespace.

A *shard* is a real ``RedisTaskStore`` namespace on its own master (``<ns>.s<k>``: the
prototype's spelling of the designed hash tag ``{ns:s<k>}``, which ``Keys`` refuses because a
namespace may not hold ``:``), holding the buckets ``b`` with ``b mod S == k``
(``docs/scale-out.md``). Every call below is a single-slot script of one shard, the same
scripts the worker runtime runs:

* a **submitter** builds each task the way ``Controller.submit`` does (``new_task``: an id, its
  bucket ``bucket_for(id)``, the first history entry), routes it to the shard of its bucket and
  writes it with ``commit_tasks`` (one task per call, like ``submit``; ``batch`` > 1 groups
  the tasks *per shard*, like ``submit_many`` would have to);
* a **drainer** serves some buckets of one shard: ``start_tasks`` (``PENDING -> RUNNING`` with
  lease and history entry, up to ``limit`` per call), then ``commit_tasks`` of the batch to
  ``SUCCEEDED`` with its history entry, until its buckets hold no ``PENDING`` task. It is the
  runtime's hot path without the rest of a worker (no pool ticks, command polls or reconcile):
  the Redis work per task that scales with masters.

Each process connects, reports ready, waits for the driver's go, does its work and reports its
counts and its own CPU time through a queue (``process_time``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.held import advance
from chongming_redis.runtime.submission import NewTask, new_task
from chongming_redis.stores.redis import RedisTaskStore

TASK_NAME = "noop"
LEASE = timedelta(seconds=60)


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of the namespace: its master's URL, its store namespace, its buckets."""

    index: int
    url: str
    namespace: str
    buckets: tuple[int, ...]

    def store(self) -> RedisTaskStore:
        return RedisTaskStore.from_url(self.url, namespace=self.namespace, check_server=False)


def shard_buckets(num_buckets: int, masters: int) -> list[tuple[int, ...]]:
    """The static map of the design's first step: bucket ``b`` lives in shard ``b mod S``."""
    return [tuple(range(k, num_buckets, masters)) for k in range(masters)]


def split(items: Sequence[int], parts: int) -> list[tuple[int, ...]]:
    """``items`` dealt into ``parts`` disjoint shares (a pool's share per drainer)."""
    return [tuple(items[i::parts]) for i in range(parts)]


def now() -> datetime:
    return datetime.now(timezone.utc)


def submitter(
    name: str, shards: Sequence[Shard], num_buckets: int, count: int, batch: int,
    only: int | None, ready: Queue[Any], go: Event, results: Queue[Any],
) -> None:  # fmt: skip
    """Create ``count`` tasks, each in the shard of its bucket (with ``only``: tasks whose
    bucket is in that shard, the others drawn again); report the ids per shard."""
    stores = [shard.store() for shard in shards]
    policy = BucketPolicy(num_buckets)
    shard_of = {b: shard.index for shard in shards for b in shard.buckets}
    pending: list[list[tuple[TaskSnapshot, int | None, Sequence[Transition]]]] = [
        [] for _ in shards
    ]
    ids: list[list[str]] = [[] for _ in shards]
    calls = 0
    ready.put(name)
    go.wait()
    cpu = time.process_time()
    made = 0
    while made < count:
        snapshot, transition = new_task(
            NewTask(TASK_NAME), None, now=now(), buckets=policy, submitted_by=name
        )
        k = shard_of[snapshot.bucket]
        if only is not None and k != only:
            continue
        made += 1
        pending[k].append((snapshot, None, [transition]))
        ids[k].append(snapshot.task_id)
        if len(pending[k]) >= batch:
            calls += write(stores[k], pending[k])
    for k, items in enumerate(pending):
        if items:
            calls += write(stores[k], items)
    cpu = time.process_time() - cpu
    results.put({"role": "submit", "name": name, "cpu": cpu, "calls": calls, "ids": ids})
    for store in stores:
        store.close()


def write(
    store: RedisTaskStore, items: list[tuple[TaskSnapshot, int | None, Sequence[Transition]]]
) -> int:
    """One ``commit_tasks`` of ``items`` (cleared afterwards); every item must land."""
    errors = store.commit_tasks(items)
    bad = [e for e in errors if e is not None]
    if bad:
        raise RuntimeError(f"{len(bad)} writes refused in {store.namespace}: {bad[0]}")
    items.clear()
    return 1


def drainer(
    name: str, shard: Shard, buckets: tuple[int, ...], limit: int,
    ready: Queue[Any], go: Event, results: Queue[Any],
) -> None:  # fmt: skip
    """Start and finish every ``PENDING`` task of ``buckets`` in ``shard``, ``limit`` at a
    time: one ``start_tasks`` and one ``commit_tasks`` per batch."""
    store = shard.store()
    done = calls = conflicts = 0
    ready.put(name)
    go.wait()
    cpu = time.process_time()
    while buckets:
        at = now()
        started = store.start_tasks(
            owner=name, now=at, lease_until=at + LEASE, buckets=buckets, limit=limit
        )
        calls += 1
        if not started:
            break
        finished = now()
        items = [finish(task, finished) for task in started]
        errors = store.commit_tasks(items)
        calls += 1
        conflicts += sum(1 for e in errors if e is not None)
        done += len(started) - sum(1 for e in errors if e is not None)
    cpu = time.process_time() - cpu
    results.put({"role": "drain", "name": name, "shard": shard.index, "cpu": cpu,
                 "tasks": done, "calls": calls, "conflicts": conflicts})  # fmt: skip
    store.close()


def finish(task: TaskSnapshot, at: datetime) -> tuple[TaskSnapshot, int, list[Transition]]:
    """The runtime's commit of a task that returned: ``RUNNING -> SUCCEEDED``, one version
    up, with its history entry."""
    done = advance(task, TaskStatus.SUCCEEDED, at, result=None)
    entry = Transition(
        task.task_id, done.status_version, TaskStatus.RUNNING, TaskStatus.SUCCEEDED, at
    )
    return done, task.status_version, [entry]
