"""``RedisExtensions``: what ``RedisTaskStore`` offers beyond the 14 protocol methods — the
runtime's named extensions (``stores/extensions.py``: batched starts and commits, the server
clock, per-bucket counts, the bucket pool, the nudge channel), what a dashboard reads (the
commands of a task, the command backlog, the workers' last beats) and the change feed — each
one script or one round trip. A mixin: ``RedisTaskStore`` provides the script calls and
decoders it uses (``query_page`` lives beside ``query`` there)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from chongming_redis.errors import CorruptRecord, StoreError
from chongming_redis.model import (
    ChangePage,
    Command,
    CommandBacklog,
    FeedStats,
    TaskSnapshot,
    TaskStatus,
    Tombstone,
    Transition,
)
from chongming_redis.stores import _checks as check
from chongming_redis.stores._feed import check_page_limit, decode_tombstone, page_of, parse_cursor
from chongming_redis.stores._redis import ops
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores._redis.replies import text as _text
from chongming_redis.stores._redis.rows import pairs, token
from chongming_redis.stores.codec import decode_dt, encode_dt

T = TypeVar("T")


class RedisExtensions:
    keys: Keys
    _client: redis.Redis

    if TYPE_CHECKING:  # provided by RedisTaskStore

        @property
        def namespace(self) -> str: ...
        def counts(self) -> dict[TaskStatus, int]: ...
        def _run(
            self, name: str, keys: Sequence[str], args: Sequence[Any], **about: Any
        ) -> list[Any]: ...
        def _read(self, key: str, call: Callable[[redis.Redis], T]) -> T: ...
        def _check_open(self) -> None: ...
        def _perform(self, plan: ops.Plan[T]) -> T: ...
        def _decode_task(self, task_id: str, fields: dict[bytes, bytes]) -> TaskSnapshot: ...

    # -- batched starts and commits (one round trip each) -----------------------------------

    def start_tasks(
        self,
        *,
        owner: str,
        now: datetime,
        lease_until: datetime,
        buckets: Sequence[int],
        limit: int = 50,
        names: Sequence[str] = (),
    ) -> list[TaskSnapshot]:
        """Start up to ``limit`` ``PENDING`` tasks of ``buckets`` whose ``not_before`` has
        passed, oldest first: for each, the compare-and-set to ``RUNNING``, the lease, the
        heartbeat and the history entry, all in one script (``lua/start_tasks.lua``). Returns
        the started tasks as stored. ``names``: only tasks of these types (empty: any)."""
        wanted, names = check.check_start(owner, now, lease_until, buckets, limit, names)
        memo = token()
        memo_ms = max(1000, math.ceil((lease_until - now).total_seconds() * 1000))
        keys = [self.keys.root, self.keys.start_memo(memo)]
        args = [owner, encode_dt(now), encode_dt(lease_until), limit, memo, memo_ms,
                len(wanted), *wanted, len(names), *names]  # fmt: skip
        reply = self._run("start_tasks", keys, args)
        return [
            self._decode_task(_text(reply[i]), pairs(reply[i + 1])) for i in range(1, len(reply), 2)
        ]

    def commit_tasks(
        self, items: Sequence[tuple[TaskSnapshot, int | None, Sequence[Transition]]]
    ) -> list[StoreError | None]:
        """Save each snapshot (compare-and-set on its expected version, never the lease) and
        append its transitions: one round trip per 100 items (``lua/commit_tasks.lua``). An
        expected version of ``None`` creates the task instead (with its lease, as ``create``).
        Returns, per item, ``None`` when written (or already written by a retried call), or
        the ``ConcurrencyConflict`` / ``TaskAlreadyExists`` it met; such an item writes nothing.
        Items must name distinct tasks (each is checked against the state before the call).
        The full contract: ``BatchingStore.commit_tasks`` (``stores/extensions.py``)."""
        return self._perform(ops.commit_tasks(self.keys, items))

    def server_time(self) -> datetime:
        """The Redis server's clock (``TIME``): the one clock every worker agrees on."""
        return self._perform(ops.server_time(self.keys))

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        """``{bucket: {status: n}}`` from the counters, without reading any task."""
        key = self.keys.counts
        raw = self._read(key, lambda c: c.hgetall(key))
        result: dict[int, dict[TaskStatus, int]] = {}
        for field, value in raw.items():
            status, _, bucket = _text(field).partition(":")
            if bucket:
                per = result.setdefault(int(bucket), dict.fromkeys(TaskStatus, 0))
                per[TaskStatus(status)] = int(value)
        return result

    def pool_tick(
        self,
        *,
        worker: str,
        now: datetime,
        lease_seconds: float,
        num_buckets: int,
        wanted: Sequence[int],
        leaving: bool = False,
    ) -> tuple[list[int], list[str]]:
        """One worker's heartbeat and bucket leases in one step (``lua/pool_tick.lua``).
        Returns ``(buckets this worker now holds, live workers)``; raises ``StoreError`` when
        the namespace recorded another ``num_buckets``."""
        k = self.keys
        keys = [k.workers, k.bucket_owner, k.bucket_until, k.meta, k.worker_beats]
        now_ms = encode_dt(now) // 1000
        args = [worker, now_ms, max(1, round(lease_seconds * 1000)), num_buckets,
                "1" if leaving else "0", len(wanted), *wanted]  # fmt: skip
        reply = self._run(
            "pool_tick", keys, args, namespace=self.namespace, num_buckets=num_buckets
        )
        return [int(b) for b in reply[1]], [_text(w) for w in reply[2]]

    def recorded_num_buckets(self) -> int | None:
        """``RecordedBucketsStore``: the ``num_buckets`` the first worker recorded."""
        return self._perform(ops.recorded_num_buckets(self.keys))

    def record_task_types(self, names: Collection[str]) -> None:
        """``TaskTypesStore``: add the names a worker runs to ``{ns}:types``."""
        self._perform(ops.record_task_types(self.keys, names))

    def task_types(self) -> frozenset[str]:
        """``TaskTypesStore``: every task type name the namespace's workers recorded."""
        return self._perform(ops.task_types(self.keys))

    def pool_state(self) -> tuple[dict[str, datetime], dict[int, str]]:
        """``({worker: heartbeat expiry}, {bucket: owner})`` as the pool last wrote them."""
        k = self.keys
        workers: list[tuple[bytes, float]] = self._read(
            k.workers,
            lambda c: c.zrange(k.workers, 0, -1, withscores=True),  # type: ignore[arg-type,return-value]
        )
        owners: dict[bytes, bytes] = self._read(
            k.bucket_owner,
            lambda c: c.hgetall(k.bucket_owner),  # type: ignore[arg-type,return-value]
        )
        return (
            {_text(w): decode_dt(int(score) * 1000) for w, score in workers},
            {int(b): _text(w) for b, w in owners.items()},
        )

    def worker_beats(self) -> dict[str, datetime]:
        """``WorkerBeatsStore``: ``{worker: the now of its last pool_tick}`` (ms precision),
        one ``HGETALL``. ``pool_tick.lua`` writes it with ``{ns}:workers`` in the same step, so
        it lists the workers ``pool_state`` lists."""
        key = self.keys.worker_beats
        raw: dict[bytes, bytes] = self._read(key, lambda c: c.hgetall(key))  # type: ignore[arg-type,return-value]
        beats: dict[str, datetime] = {}
        for worker, value in raw.items():
            try:
                beats[_text(worker, key)] = decode_dt(int(value) * 1000)
            except ValueError:
                raise CorruptRecord(key, _text(worker), f"{value!r} is not a time") from None
        return beats

    # -- what a dashboard reads of the commands --------------------------------------------

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        """``CommandInspectingStore``: the task's newest ``limit`` commands, oldest first, in
        one read-only script (``lua/task_commands.lua``) over ``{ns}:tc:<id>``."""
        newest = check.check_task_commands(task_id, limit)
        keys = [self.keys.task_commands(task_id), self.keys.root]
        reply = self._run("task_commands", keys, [newest])
        return [
            ops.decode_command(self.keys, _text(reply[i]), pairs(reply[i + 1]))
            for i in range(1, len(reply), 2)
        ]

    def command_backlog(self) -> CommandBacklog:
        """``CommandInspectingStore``: ``ZCARD cq``, ``ZCARD cl`` and the oldest entry of
        ``cq``, in one ``MULTI``/``EXEC`` (one round trip, one consistent moment)."""
        k = self.keys
        replies = self._read(k.command_queue, lambda c: _backlog_reads(c, k))
        for key, result in zip((k.command_queue, k.command_leases, k.command_queue), replies):
            if isinstance(result, Exception):  # WRONGTYPE: a corrupt record naming its key
                with ops.errors(key):
                    raise result
        unclaimed, leased, oldest = replies
        try:
            first = decode_dt(int(oldest[0][1])) if oldest else None
        except ValueError as exc:
            raise CorruptRecord(k.command_queue, None, f"score: {exc}") from None
        return CommandBacklog(int(unclaimed), int(leased), first)

    # -- clean-up (not TaskStore) ----------------------------------------------------------

    def drop_namespace(self) -> int:
        """Delete every key of this namespace (a demo's or a test's, at its end); how many.
        Not part of ``TaskStore``: nothing else may be running on the namespace. On Redis
        Cluster the scan covers every master."""
        self._check_open()
        pattern, dropped = self.keys.glob(), 0
        with ops.errors():
            batch: list[bytes] = []
            for key in self._client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) == 500:
                    dropped += self._client.unlink(*batch)
                    batch.clear()
            if batch:
                dropped += self._client.unlink(*batch)
        return dropped

    @property
    def client(self) -> redis.Redis:
        """The redis-py client (for the runtime's pub/sub nudges)."""
        return self._client

    @property
    def publishes_work(self) -> bool:
        """``create.lua`` and ``commit_tasks.lua`` publish ``{ns}:nudge:work`` themselves."""
        return True

    # -- the change feed -------------------------------------------------------------------

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        """One page of the change feed (``ChangeFeed.changes``; ``lua/changes.lua``)."""
        position, size = parse_cursor(after), check_page_limit(limit)
        keys = [self.keys.root, self.keys.feed]
        reply = self._run("changes", keys, [position, size], after=position)
        items: list[TaskSnapshot | Tombstone] = []
        for i in range(2, len(reply), 3):
            value: bytes = reply[i + 1]
            if value[:1] == b"t":
                items.append(self._decode_task(_text(value[1:]), pairs(reply[i + 2])))
            else:
                chunk = self.keys.feed_chunk(int(reply[i]) // 128)
                items.append(decode_tombstone(value[1:], chunk))
        last = int(reply[len(reply) - 3]) if items else None
        return page_of(items, last, position)

    def feed_stats(self) -> FeedStats:
        """The feed's head, size (live tasks + tombstones) and tombstone count."""
        key = self.keys.feed
        head, tombs = self._read(key, lambda c: c.hmget(key, "head", "tombs"))
        tasks = sum(self.counts().values())
        tombstones = int(tombs or 0)
        return FeedStats(int(head or 0), tasks + tombstones, tombstones)


def _backlog_reads(client: redis.Redis, k: Keys) -> list[Any]:
    """The three reads of ``command_backlog`` as one transaction; a failed read (a key of the
    wrong type) comes back as its exception, in its place."""
    pipe = client.pipeline(transaction=True)
    pipe.zcard(k.command_queue)
    pipe.zcard(k.command_leases)
    pipe.zrange(k.command_queue, 0, 0, withscores=True)
    return pipe.execute(raise_on_error=False)
