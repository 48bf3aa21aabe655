"""The change feed of a sharded namespace, prototyped as a relay (``docs/scale-out.md``).

Each shard keeps its own feed exactly as today (``lua/lib/feed.lua``: positions issued in the
same script as the write, so a shard's feed never skips). One **relay** process per namespace
reads every shard's feed after its relay cursor and appends the items to one **global feed**
in the directory slot (``bench/scale_out_relay.lua``: new global positions from one head, the
task's older global item dropped, the shard's relay cursor moved, all in one step). Readers
page through the global feed with the one canonical decimal cursor they have today, and each
live item's state is read from its shard when the page is read.

Two details make it never skip:

* the relay reads a shard's head and the chunks after its cursor in **one** script
  (``bench/scale_out_relay_read.lua``): chunks read by separate commands could miss positions
  issued in between in an earlier chunk while a later chunk moves the cursor past them;
* a shard position that the snapshot does not hold (at or below the head it read) was
  superseded (its task moved on to a later position, or became a tombstone there), so the
  cursor may pass it.

What it costs is what ``bench.scale_out --feed`` measures: global items per task (the relay
coalesces a task's writes between two of its reads), the directory master's CPU per task, and
how far the global feed lags the shards when the writes stop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import redis
from redis.commands.core import Script

from bench.scale_out_client import Shard
from chongming_redis.stores._redis.keys import Keys

RELAY_SCRIPT = Path(__file__).with_name("scale_out_relay.lua")
READ_SCRIPT = Path(__file__).with_name("scale_out_relay_read.lua")
CHUNK = 128
CHUNKS_PER_READ = 3  # a global page reads three chunks (the prototype's reader)
BATCH = 256
#: The relay's pause after a pass: longer batches fewer reads and coalesces more of a task's
#: writes into one global item, for a longer lag.
INTERVAL = 0.005


def item_id(value: bytes) -> str:
    """The task id of a shard feed item: ``t<id>``, or a tombstone ``r<removed_at> <bucket>
    <name length> <name><id>`` (``lua/lib/feed.lua``)."""
    if value[:1] == b"t":
        return value[1:].decode()
    _, _, length, rest = value[1:].split(b" ", 3)
    return rest[int(length) :].decode()


def read_shard(
    read: Script, keys: Keys, after: int, limit: int = BATCH
) -> tuple[list[tuple[int, bytes]], int]:
    """The items after ``after`` (at most ``limit``, position order) and the cursor they reach,
    read in one script (``bench/scale_out_relay_read.lua``): one atomic snapshot of the
    shard's head and chunks."""
    reply = read(keys=[keys.root], args=[after, limit])
    items = [(int(reply[i]), reply[i + 1]) for i in range(2, len(reply), 2)]
    return items, int(reply[1])


@dataclass
class RelayReport:
    items: int  # global items appended
    calls: int  # relay_append calls
    cpu: float  # the relay's own CPU seconds
    lag: float  # seconds from the stop signal until every shard was relayed to its head
    passes: int  # rounds over every shard (each one read per shard)


def relay(
    shards: Sequence[Shard], directory_url: str, root: str, stop: Event,
    ready: Queue[Any], go: Event, results: Queue[Any],
) -> None:  # fmt: skip
    """Relay every shard's feed into the global feed until ``stop`` is set and every shard is
    relayed up to its head."""
    directory = redis.Redis.from_url(directory_url)
    append = directory.register_script(RELAY_SCRIPT.read_text())
    sources = [(client.register_script(READ_SCRIPT.read_text()), keys)
               for client, keys in shard_clients(shards)]  # fmt: skip
    cursors = [0] * len(shards)
    items = calls = passes = 0
    ready.put("relay")
    go.wait()
    cpu = time.process_time()
    stopped_at: float | None = None
    while True:
        passes += 1
        moved = full = False
        for k, (read, keys) in enumerate(sources):
            batch, cursor = read_shard(read, keys, cursors[k])
            if cursor == cursors[k]:
                continue
            args: list[Any] = [k, cursors[k], cursor]
            for _, value in batch:
                args.extend((item_id(value), value))
            reply = append(keys=[root], args=args)
            if reply[0] != b"OK":
                raise RuntimeError(f"relay cursor of shard {k} moved under the relay: {reply}")
            cursors[k], items, calls, moved = cursor, items + len(batch), calls + 1, True
            full = full or len(batch) == BATCH
        if stop.is_set() and stopped_at is None:
            stopped_at = time.perf_counter()
            continue  # one more full pass after the stop, then until nothing moves
        if stopped_at is not None and not moved:
            break
        if not full:
            time.sleep(INTERVAL)
    lag = time.perf_counter() - (stopped_at or time.perf_counter())
    report = RelayReport(items, calls, time.process_time() - cpu, lag, passes)
    results.put({"role": "relay", **report.__dict__})


ShardClients = Sequence[tuple[redis.Redis, Keys]]


def shard_clients(shards: Sequence[Shard]) -> list[tuple[redis.Redis, Keys]]:
    return [(redis.Redis.from_url(s.url), Keys(s.namespace)) for s in shards]


def read_global(
    directory: redis.Redis, root: str, shards: ShardClients, after: int, limit: int = BATCH
) -> tuple[list[tuple[str, dict[bytes, bytes]]], int]:
    """One page of the global feed: (task id, task hash read from its shard now) per live item
    (a live item whose task is gone is skipped: its tombstone comes later), and the cursor."""
    first = after // CHUNK
    pipe = directory.pipeline(transaction=True)
    pipe.hget(root + "gfeed", "head")
    for n in range(first, first + CHUNKS_PER_READ):
        pipe.hgetall(f"{root}gfc:{n}")
    head_raw, *chunks = pipe.execute()
    head = int(head_raw or 0)
    items = sorted((int(p), v) for chunk in chunks for p, v in chunk.items() if int(p) > after)[
        :limit
    ]
    cursor = (
        items[-1][0] if len(items) == limit else min(head, (first + CHUNKS_PER_READ) * CHUNK - 1)
    )
    wanted: dict[int, list[str]] = {}
    for _, value in items:
        shard, kind_id = value.split(b":", 1)
        if kind_id[:1] == b"t":
            wanted.setdefault(int(shard), []).append(kind_id[1:].decode())
    page: list[tuple[str, dict[bytes, bytes]]] = []
    for k, ids in wanted.items():
        client, keys = shards[k]
        shard_pipe = client.pipeline(transaction=False)
        for task_id in ids:
            shard_pipe.hgetall(keys.task(task_id))
        page.extend((i, f) for i, f in zip(ids, shard_pipe.execute()) if f)
    return page, max(after, cursor)


@dataclass
class FeedCheck:
    pages: int
    live: int  # live items read from the global feed
    distinct: int
    succeeded: int
    ms_per_page: float


def check_global_feed(directory: redis.Redis, root: str, shards: Sequence[Shard]) -> FeedCheck:
    """Read the whole global feed from "0": every task should be in it once, SUCCEEDED."""
    sources = shard_clients(shards)
    cursor, pages, live = 0, 0, list[str]()
    succeeded = 0
    started = time.perf_counter()
    while True:
        page, next_cursor = read_global(directory, root, sources, cursor)
        if next_cursor == cursor:
            break
        pages += 1 if page else 0
        live.extend(task_id for task_id, _ in page)
        succeeded += sum(1 for _, fields in page if fields.get(b"s") == b"succeeded")
        cursor = next_cursor
    seconds = time.perf_counter() - started
    return FeedCheck(pages, len(live), len(set(live)), succeeded, seconds / max(1, pages) * 1e3)


@dataclass
class FeedCost:
    """What the relay cost in one round."""

    tasks: int
    items: int  # global items appended
    calls: int  # relay_append calls
    directory_cpu: float  # seconds of the directory master's CPU, submit to caught up
    relay_cpu: float  # seconds of the relay process's own CPU
    lag: float
    check: FeedCheck
    directory_bytes: int = 0  # the directory master's used_memory growth (the global feed)
    passes: int = 0
    read_item_us: float = 0.0  # shard CPU per item the relay reads (measured alone, after)
    read_empty_us: float = 0.0  # shard CPU per read that finds nothing new
    shards: int = 0

    def shard_read_us(self) -> float:
        """The relay's reads on the shards, per task: its items and its passes, at the costs
        measured alone (during the round they drown in this machine's noise)."""
        empty = self.passes * self.shards * self.read_empty_us  # an upper bound: some found items
        return (self.items * self.read_item_us + empty) / max(1, self.tasks)

    def per_task(self, value: float) -> float:
        return value / max(1, self.tasks)


class RelayRun:
    """A relay process over one round: started before the submit phase, stopped after the
    drain, then the global feed is read from "0" and checked."""

    def __init__(self, context: Any, shards: Sequence[Shard], directory: redis.Redis, url: str):
        self.shards, self.directory = shards, directory
        self.root = "{" + shards[0].namespace.rsplit(".", 1)[0] + "}:"
        self.stop, self.go = context.Event(), context.Event()
        self.ready, self.results = context.Queue(), context.Queue()
        self.proc = context.Process(
            target=relay,
            args=(shards, url, self.root, self.stop, self.ready, self.go, self.results),
        )

    def start(self) -> None:
        self.proc.start()
        self.ready.get(timeout=60)
        self.cpu = directory_cpu(self.directory)
        self.memory = int(self.directory.info("memory")["used_memory"])
        self.go.set()

    def finish(self, tasks: int) -> FeedCost:
        self.stop.set()
        report = self.results.get(timeout=600)
        self.proc.join(30)
        cpu = directory_cpu(self.directory) - self.cpu
        memory = int(self.directory.info("memory")["used_memory"]) - self.memory
        check = check_global_feed(self.directory, self.root, self.shards)
        item_us, empty_us = read_costs(self.shards)
        return FeedCost(tasks, report["items"], report["calls"], cpu, report["cpu"],
                        report["lag"], check, memory, report["passes"], item_us, empty_us,
                        len(self.shards))  # fmt: skip


def read_costs(shards: Sequence[Shard], empty_reads: int = 300) -> tuple[float, float]:
    """Shard CPU (µs) per item of a relay read, re-reading every shard's feed from 0 with the
    relay's script, and per read that finds nothing (at the head)."""
    sources = shard_clients(shards)
    reads = [(client, client.register_script(READ_SCRIPT.read_text()), keys)
             for client, keys in sources]  # fmt: skip
    before = sum(directory_cpu(client) for client, _, _ in reads)
    items, heads = 0, []
    for _, read, keys in reads:
        cursor = 0
        while True:
            batch, next_cursor = read_shard(read, keys, cursor)
            items += len(batch)
            if next_cursor == cursor:
                break
            cursor = next_cursor
        heads.append(cursor)
    middle = sum(directory_cpu(client) for client, _, _ in reads)
    for (_, read, keys), head in zip(reads, heads):
        for _ in range(empty_reads):
            read_shard(read, keys, head)
    after = sum(directory_cpu(client) for client, _, _ in reads)
    return (middle - before) / max(1, items) * 1e6, (after - middle) / (
        empty_reads * len(reads)
    ) * 1e6


def directory_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
