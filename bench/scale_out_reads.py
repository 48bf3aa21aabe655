"""Cross-shard reads of ``bench.scale_out``: ``counts`` and ``query`` fanned out to every shard
and merged, as ``docs/scale-out.md`` designs them, with what each costs in the same run.

* ``counts``: one ``counts()`` per shard, summed. Each shard's counters are exact at the
  moment it is read; the sum is not one snapshot of the whole namespace.
* ``query``: the keyset page of every shard from the same cursor ``(created_at, task_id)``,
  merged in that order, the first ``limit`` kept; the next cursor is the last task returned.
  The order is a total order over the tasks themselves (not over writes), so the same cursor
  means the same thing on every shard and paging never skips nor repeats a task whatever the
  number of shards: ``walk`` pages through a whole status and checks exactly that. The price:
  a page reads up to ``limit`` tasks from *every* shard to return ``limit`` (S times the work
  of one shard, whatever S).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import redis

from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores.redis import RedisTaskStore

PAGE = 50


def fanout_counts(stores: Sequence[RedisTaskStore]) -> dict[TaskStatus, int]:
    total = dict.fromkeys(TaskStatus, 0)
    for store in stores:
        for status, n in store.counts().items():
            total[status] += n
    return total


def order(task: TaskSnapshot) -> tuple[datetime, str]:
    return task.created_at, task.task_id


def fanout_page(
    stores: Sequence[RedisTaskStore], query: TaskQuery, after: tuple[datetime, str] | None
) -> tuple[list[TaskSnapshot], int]:
    """The merged page and how many tasks the shards returned to make it."""
    pages = [store.query_page(query, after=after) for store in stores]
    merged = heapq.merge(*pages, key=order)
    limit = query.limit or PAGE
    return [task for _, task in zip(range(limit), merged)], sum(len(p) for p in pages)


def walk(stores: Sequence[RedisTaskStore], status: TaskStatus) -> tuple[int, int, bool]:
    """Page through every task of ``status``: (pages, tasks, every task once and in order)."""
    query = TaskQuery(statuses=frozenset({status}), limit=PAGE)
    after: tuple[datetime, str] | None = None
    seen: list[tuple[datetime, str]] = []
    pages = 0
    while True:
        page, _ = fanout_page(stores, query, after)
        if not page:
            break
        pages += 1
        seen.extend(order(task) for task in page)
        after = order(page[-1])
    expected = sum(store.counts()[status] for store in stores)
    once_in_order = len(seen) == expected == len(set(seen)) and seen == sorted(seen)
    return pages, len(seen), once_in_order


@dataclass
class ReadCost:
    masters: int
    counts_ms: float  # wall time of one merged counts, sequential round trips
    counts_us: float  # Redis CPU of one merged counts, all masters
    page_ms: float
    page_us: float
    page_fetched: float  # tasks the shards returned per merged page of PAGE
    walk_pages: int
    walk_tasks: int
    walk_ok: bool


def cpu_of(clients: Sequence[redis.Redis]) -> float:
    total = 0.0
    for client in clients:
        info = client.info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def timed(
    clients: Sequence[redis.Redis], repeats: int, call: Callable[[], object]
) -> tuple[float, float]:
    """(ms of wall time, µs of Redis CPU over the masters) per call."""
    cpu = cpu_of(clients)
    started = time.perf_counter()
    for _ in range(repeats):
        call()
    wall = time.perf_counter() - started
    return wall / repeats * 1e3, (cpu_of(clients) - cpu) / repeats * 1e6


def measure_reads(
    stores: Sequence[RedisTaskStore], clients: Sequence[redis.Redis], repeats: int
) -> ReadCost:
    counts_ms, counts_us = timed(clients, repeats, lambda: fanout_counts(stores))
    query = TaskQuery(statuses=frozenset({TaskStatus.SUCCEEDED}), limit=PAGE)
    fetched: list[int] = []

    def first_page() -> None:
        fetched.append(fanout_page(stores, query, None)[1])

    page_ms, page_us = timed(clients, repeats, first_page)
    pages, tasks, ok = walk(stores, TaskStatus.SUCCEEDED)
    return ReadCost(
        masters=len(stores), counts_ms=counts_ms, counts_us=counts_us, page_ms=page_ms,
        page_us=page_us, page_fetched=sum(fetched) / len(fetched), walk_pages=pages,
        walk_tasks=tasks, walk_ok=ok,
    )  # fmt: skip
