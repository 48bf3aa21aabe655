"""``RedisExtensions``: what ``RedisTaskStore`` offers beyond the 14 protocol methods — the
runtime's named extensions (``stores/extensions.py``: batched starts and commits, the server
clock, per-bucket counts, the bucket pool, the nudge channel), what a dashboard reads (the
commands of a task, the command backlog, the workers' last beats), the task policies' duties
(``TaskPoliciesStore``: retention, unique ids) and the change feed — each one script or one
round trip. A base of ``RedisTaskStore`` (on ``_redis.driver.Driver``): each
method drives a plan (``_redis.worker_ops``, ``_redis.dashboard_ops``, ``_redis.ops``) through
``RedisTaskStore._perform`` (``query_page`` lives beside ``query`` there)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from chongming_redis.errors import CorruptRecord, StoreError
from chongming_redis.limits import LimitConflict, LimitUsage
from chongming_redis.model import (
    ChangePage,
    Command,
    CommandBacklog,
    FeedStats,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores import _checks as check
from chongming_redis.stores._redis import dashboard_ops, ops, schedule_ops, worker_ops
from chongming_redis.stores._redis.cluster import ClusterCalls
from chongming_redis.stores._redis.driver import Driver
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores.dependency_store import RELEASE_STEP, check_release_limit

T = TypeVar("T")


class RedisExtensions(Driver[ClusterCalls]):
    _client: redis.Redis

    if TYPE_CHECKING:  # provided by RedisTaskStore

        def _perform(self, plan: ops.Plan[T]) -> T: ...

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
        """Start up to ``limit`` due ``PENDING`` tasks of ``buckets`` in start order (higher
        priority, then due earliest; ``lua/lib/indexes.lua``'s start queues): for each, the
        compare-and-set to ``RUNNING``, the lease, the heartbeat and the history entry, all in
        one script (``lua/start_tasks.lua``). Returns the started tasks as stored.
        ``names``: only tasks of these types (empty: any)."""
        self.prepare_start_order()
        return self._perform(
            worker_ops.start_tasks(self.keys, owner, now, lease_until, buckets, limit, names)
        )

    def commit_and_start(
        self,
        items: Sequence[tuple[TaskSnapshot, int | None, Sequence[Transition]]],
        *,
        owner: str,
        now: datetime,
        lease_until: datetime,
        buckets: Sequence[int],
        limit: int = 50,
        names: Sequence[str] = (),
    ) -> tuple[list[StoreError | None], list[TaskSnapshot] | StoreError]:
        """``CommitStartStore``: ``commit_tasks`` then ``start_tasks`` capped at the tasks it
        moved out of ``RUNNING``, in one script (``lua/commit_start.lua``)."""
        self.prepare_start_order()
        request = worker_ops.StartRequest(owner, now, lease_until, buckets, limit, names)
        return self._perform(worker_ops.commit_start(self.keys, items, request))

    def prepare_start_order(self) -> int:
        """Queue the PENDING tasks of a namespace written before the start queues (once per
        namespace, ``worker_ops.upgrade_start_order``; once per store, one ``HGET``, after
        that). ``start_tasks`` calls it first. Returns the index entries looked at."""
        if getattr(self, "_start_order_ready", False):
            return 0
        looked = self._perform(worker_ops.upgrade_start_order(self.keys))
        self._start_order_ready = True
        return looked

    def commit_tasks(
        self, items: Sequence[tuple[TaskSnapshot, int | None, Sequence[Transition]]]
    ) -> list[StoreError | None]:
        """Save each snapshot (compare-and-set on its expected version, never the lease) and
        append its transitions: one round trip per 100 items (``lua/commit_tasks.lua``). An
        expected version of ``None`` creates the task instead (with its lease, as ``create``).
        Returns, per item, ``None`` when written (or already written by a retried call), or
        the ``ConcurrencyConflict`` / ``TaskAlreadyExists`` / ``UniqueTaken`` it met; such an
        item writes nothing.
        Items must name distinct tasks (each is checked against the state before the call).
        The full contract: ``BatchingStore.commit_tasks`` (``stores/extensions.py``)."""
        return self._perform(ops.commit_tasks(self.keys, items))

    def record_limits(
        self,
        definitions: Mapping[str, str],
        task_limits: Mapping[str, Sequence[str]],
        *,
        replace: bool = False,
    ) -> None:
        """Record the limit definitions and each task type's limit ids, all or nothing
        (``lua/record_limits.lua``): ``LimitConflict`` unless ``replace``."""
        self._perform(_record_limits(self.keys, definitions, task_limits, replace))

    def limit_definitions(self) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        """``(limit id -> definition JSON, task type -> its limit ids)`` as recorded."""
        return self._perform(ops.limit_definitions(self.keys))

    def limit_usage(self, *, limit: int = 1000) -> list[LimitUsage]:
        """The refs with a holder or a live waiter, busiest first (``LimitsStore``): reads
        only (``_limit_usage``)."""
        return self._perform(_limit_usage(self.keys, check.check_usage_limit(limit)))

    # -- schedules (SchedulesStore: one hash, one script) -------------------------------------

    def write_schedule(
        self,
        schedule_id: str,
        state: str,
        *,
        expect_version: int,
        task: TaskSnapshot | None = None,
    ) -> tuple[int, bool]:
        """The compare-and-set of a schedule and its tick's task, one script
        (``lua/write_schedule.lua``)."""
        return self._perform(schedule_ops.write_schedule(self.keys, schedule_id, state,
                                                         expect_version, task))  # fmt: skip

    def schedule_record(self, schedule_id: str) -> tuple[int, str] | None:
        return self._perform(schedule_ops.schedule_record(self.keys, schedule_id))

    def schedule_records(self) -> dict[str, tuple[int, str]]:
        return self._perform(schedule_ops.schedule_records(self.keys))

    def delete_schedule(self, schedule_id: str) -> bool:
        return self._perform(schedule_ops.delete_schedule(self.keys, schedule_id))

    def server_time(self) -> datetime:
        """The Redis server's clock (``TIME``): the one clock every worker agrees on."""
        return self._perform(ops.server_time(self.keys))

    def bucket_counts(self) -> dict[int, dict[TaskStatus, int]]:
        """``{bucket: {status: n}}`` from the counters, without reading any task."""
        return self._perform(dashboard_ops.bucket_counts(self.keys))

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
        plan = worker_ops.pool_tick(self.keys, self.namespace, worker, now, lease_seconds,
                                    num_buckets, wanted, leaving)  # fmt: skip
        return self._perform(plan)

    def recorded_num_buckets(self) -> int | None:
        """``RecordedBucketsStore``: the ``num_buckets`` the first worker recorded."""
        return self._perform(ops.recorded_num_buckets(self.keys))

    def record_task_types(self, names: Collection[str]) -> None:
        """``TaskTypesStore``: add the names a worker runs to ``{ns}:types``."""
        self._perform(worker_ops.record_task_types(self.keys, names))

    def task_types(self) -> frozenset[str]:
        """``TaskTypesStore``: every task type name the namespace's workers recorded."""
        return self._perform(ops.task_types(self.keys))

    def pool_state(self) -> tuple[dict[str, datetime], dict[int, str]]:
        """``({worker: heartbeat expiry}, {bucket: owner})`` as the pool last wrote them."""
        return self._perform(dashboard_ops.pool_state(self.keys))

    def worker_beats(self) -> dict[str, datetime]:
        """``WorkerBeatsStore``: ``{worker: the now of its last pool_tick}`` (ms precision),
        one ``HGETALL``. ``pool_tick.lua`` writes it with ``{ns}:workers`` in the same step, so
        it lists the workers ``pool_state`` lists."""
        return self._perform(dashboard_ops.worker_beats(self.keys))

    # -- what a dashboard reads of the commands --------------------------------------------

    def task_commands(self, task_id: str, *, limit: int = 100) -> list[Command]:
        """``CommandInspectingStore``: the task's newest ``limit`` commands, oldest first, in
        one read-only script (``lua/task_commands.lua``) over ``{ns}:tc:<id>``."""
        return self._perform(dashboard_ops.task_commands(self.keys, task_id, limit))

    def command_backlog(self) -> CommandBacklog:
        """``CommandInspectingStore``: ``ZCARD cq``, ``ZCARD cl`` and the oldest entry of
        ``cq``, in one ``MULTI``/``EXEC`` (one round trip, one consistent moment)."""
        return self._perform(dashboard_ops.command_backlog(self.keys))

    # -- the task policies (``TaskPoliciesStore``; ``lua/lib/policies.lua``) -----------------

    def expire_finished(self, *, now: datetime, limit: int = 100) -> list[str]:
        """Remove up to ``limit`` finished tasks whose retention ran out by ``now``, earliest
        expiry first, as ``prune`` removes them (``lua/expire_finished.lua``, 100 a call, each
        task checked against its own fields). Returns the removed ids."""
        # The batch is read here, so that a test may change it.
        plan = worker_ops.expire_finished(self.keys, now, limit, batch=worker_ops.EXPIRE_BATCH)
        return self._perform(plan)

    def unique_holder(self, unique: str) -> str | None:
        """The unfinished task holding ``unique`` (``{ns}:uq:<unique>``), or ``None``."""
        return self._perform(dashboard_ops.unique_holder(self.keys, unique))

    def expiry_backlog(self, *, now: datetime) -> tuple[int, datetime | None]:
        """``(tasks expired by now, not yet removed; the earliest expiry still kept)`` from
        ``{ns}:expiry`` alone, in one round trip."""
        return self._perform(dashboard_ops.expiry_backlog(self.keys, now))

    # -- dependencies (``DependenciesStore``; ``lua/lib/dependencies.lua``) -----------------

    def release_dependents(self, *, limit: int = RELEASE_STEP) -> int:
        """Apply ended parents' outcomes to up to ``limit`` of the waiting children the write
        ending them left over, in one script (``lua/release_dependents.lua``)."""
        size = check_release_limit(limit)
        return self._perform(worker_ops.release_dependents(self.keys, size))

    def release_backlog(self) -> int:
        """``ZCARD {ns}:drel``: the ended parents still to apply."""
        return self._perform(worker_ops.release_backlog(self.keys))

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
        return self._perform(dashboard_ops.changes(self.keys, after, limit))

    def feed_stats(self) -> FeedStats:
        """The feed's head, size (live tasks + tombstones) and tombstone count."""
        return self._perform(dashboard_ops.feed_stats(self.keys))


def _record_limits(
    keys: Keys, definitions: object, task_limits: object, replace: bool
) -> ops.Plan[None]:
    """Read the recorded definitions of the given ids, then write all in one ``MULTI``: a
    conflict writes nothing. Not one atomic step with the read (two workers recording two
    definitions of one id at the same moment: the later write stands, neither is told)."""
    checked, types = check.check_record_limits(definitions, task_limits)
    if not checked and not types:
        return
    changed: set[str] = set()
    if checked:
        ids = list(checked)
        recorded = yield ops.Read(keys.limits, "hmget", (keys.limits, *ids))
        for limit_id, raw in zip(ids, recorded, strict=True):
            if raw is None or _text(raw) != checked[limit_id]:
                if raw is not None and not replace:
                    raise LimitConflict(limit_id, _text(raw), checked[limit_id])
                changed.add(limit_id)
    writes: list[ops.Read] = []
    if checked:
        writes.append(ops.Read(keys.limits, "hset", (keys.limits, None, None, checked)))
    if changed:
        # A definition written anew (a raised max, say) is read by the next start, which
        # puts back the parked tasks of every ref of its ids (as a holder's end does), so
        # they need not wait for the next holder to end. The same definition again (every
        # worker's start) marks nothing.
        in_use = yield ops.Read(keys.limit_refs, "smembers", (keys.limit_refs,))
        refs = sorted(r for r in map(_text, in_use) if r.split("=", 1)[0] in changed)
        if refs:
            writes.append(ops.Read(keys.limit_freed, "sadd", (keys.limit_freed, *refs)))
    if types:
        by_type = {name: json.dumps(list(ids)) for name, ids in types.items()}
        writes.append(ops.Read(keys.limit_types, "hset", (keys.limit_types, None, None, by_type)))
    yield ops.Transaction(keys.limits, tuple(writes))


def _limit_usage(keys: Keys, size: int) -> ops.Plan[list[LimitUsage]]:
    """Reads only (``lua/lib/limits.lua`` keeps the keys): the registry and the definitions,
    then each ref's holders, parked tasks and passed-over waiters in one ``MULTI``, then the
    waiters' status and version (a waiter another write moved since waits no more). Linear in
    the refs and waiters in use: a dashboard read, never on the start path."""
    listed = yield ops.Read(keys.limit_refs, "smembers", (keys.limit_refs,))
    refs = sorted(_text(r) for r in listed)
    defs = yield ops.Read(keys.limits, "hgetall", (keys.limits,))
    kinds = {_text(k): _kind(keys, _text(k), v) for k, v in defs.items()}
    reads: list[ops.Read] = []
    for ref in refs:
        lh, lp, ln, lw = (keys.limit_holders(ref), keys.limit_parked(ref),
                          keys.limit_unseen(ref), keys.limit_waiters(ref))  # fmt: skip
        reads += [ops.Read(lh, "scard", (lh,)), ops.Read(lp, "zrange", (lp, 0, -1)),
                  ops.Read(ln, "zrange", (ln, 0, -1)),
                  ops.Read(lw, "zrange", (lw, 0, -1, False, True))]  # fmt: skip
    if not reads:
        return []
    results = _checked(reads, (yield ops.Transaction(keys.limit_refs, tuple(reads))))
    waiting: list[set[str]] = []
    asks: list[tuple[int, str, int]] = []  # (ref number, waiter, the version it was passed at)
    for n in range(len(refs)):
        parked, unseen, waiters = results[4 * n + 1 : 4 * n + 4]
        fresh = {_text(i) for i in unseen}
        waiting.append({_text(i) for i in parked} - fresh)
        asks += [(n, _text(raw), int(score)) for raw, score in waiters
                 if _text(raw) not in fresh and _text(raw) not in waiting[n]]  # fmt: skip
    states = [ops.Read(keys.task(t), "hmget", (keys.task(t), "s", "v")) for _, t, _ in asks]
    answers: list[Any] = []
    if states:
        answers = _checked(states, (yield ops.Transaction(keys.limit_refs, tuple(states))))
    for (n, task_id, version), (status, seen) in zip(asks, answers, strict=True):
        if status == b"pending" and seen is not None and int(seen) == version:
            waiting[n].add(task_id)
    usage: list[LimitUsage] = []
    for n, ref in enumerate(refs):
        held = 0 if kinds.get(ref.split("=", 1)[0]) == "rate" else int(results[4 * n])
        if held or waiting[n]:
            usage.append(LimitUsage(ref, held, len(waiting[n])))
    usage.sort(key=lambda u: (-(u.held + u.waiting), u.ref))
    return usage[:size]


def _checked(reads: Sequence[ops.Read], results: list[object]) -> list[Any]:
    for read, result in zip(reads, results, strict=True):
        if isinstance(result, Exception):  # WRONGTYPE: a corrupt record naming its key
            with ops.errors(read.key):
                raise result
    return list(results)


def _kind(keys: Keys, limit_id: str, raw: bytes | str) -> str:
    try:
        return str(json.loads(_text(raw))["kind"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptRecord(keys.limits, limit_id, f"definition malformed: {exc}") from None


def _text(raw: bytes | str) -> str:
    return raw.decode("utf-8") if isinstance(raw, bytes) else raw
