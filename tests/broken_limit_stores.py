"""Broken limits stores: each breaks one rule of ``LimitsStore`` (``stores/extensions.py``).

The scheme of ``tests/broken_extension_stores.py``, which merges ``BROKEN``, ``CAUGHT_BY`` and
``SOUND`` into its own tables: every class is a small subclass of ``InMemoryTaskStore`` that
overrides one private method of ``MemoryLimits`` (or ``record_limits``/``limit_usage``) and
breaks one rule; ``CAUGHT_BY`` names the ``ExtensionsContract`` test
(``testing/extensions/limits.py``) that pins it. The rules that live inside the admission loop
are broken on ``_Admitting``, a rebuild of ``MemoryLimits._admit`` with one hook per rule,
sound as written (``SOUND``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence

from chongming_redis.limits import Concurrency, Limit, LimitUsage, RateLimit, refill
from chongming_redis.model import TaskStatus
from chongming_redis.stores._memory_limits import _HOLDING, refs_of
from chongming_redis.stores.codec import Row
from chongming_redis.stores.memory import InMemoryTaskStore

_ENDED_BADLY = frozenset({TaskStatus.FAILED.value, TaskStatus.STOPPED.value,
                          TaskStatus.LOST.value})  # fmt: skip


def _count(rows: Iterable[Row]) -> dict[str, int]:
    held: dict[str, int] = {}
    for row in rows:
        for ref in refs_of(row):
            held[ref] = held.get(ref, 0) + 1
    return held


# -- definitions ---------------------------------------------------------------------------


class RecordOverwritesAConflict(InMemoryTaskStore):
    """record_limits replaces a conflicting definition silently (always replace=True)."""

    def record_limits(self, definitions: Mapping[str, str],
                      task_limits: Mapping[str, Sequence[str]], *,
                      replace: bool = False) -> None:  # fmt: skip
        super().record_limits(definitions, task_limits, replace=True)


class RecordsOneByOne(InMemoryTaskStore):
    """record_limits writes each definition on its own: a conflict on a later one leaves the
    earlier ones written."""

    def record_limits(self, definitions: Mapping[str, str],
                      task_limits: Mapping[str, Sequence[str]], *,
                      replace: bool = False) -> None:  # fmt: skip
        if not isinstance(definitions, Mapping):
            super().record_limits(definitions, task_limits, replace=replace)
            return
        for limit_id, text in definitions.items():
            super().record_limits({limit_id: text}, {}, replace=replace)
        super().record_limits(definitions, task_limits, replace=replace)


class RecordsDefinitionsBeforeCheckingTypes(InMemoryTaskStore):
    """record_limits writes the definitions, then finds the task types bad."""

    def record_limits(self, definitions: Mapping[str, str],
                      task_limits: Mapping[str, Sequence[str]], *,
                      replace: bool = False) -> None:  # fmt: skip
        with contextlib.suppress(TypeError, ValueError):  # the whole call judges the rest
            super().record_limits(definitions, {}, replace=replace)
        super().record_limits(definitions, task_limits, replace=replace)


class DefinitionsReadAfterClose(InMemoryTaskStore):
    """limit_definitions answers on a closed store (from a cache)."""

    def limit_definitions(self) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        return dict(self._limit_defs), dict(self._limit_types)


class ReplaceKeepsTheOldLimit(InMemoryTaskStore):
    """record_limits(replace=True) records the new text but admits by the old definition."""

    def record_limits(self, definitions: Mapping[str, str],
                      task_limits: Mapping[str, Sequence[str]], *,
                      replace: bool = False) -> None:  # fmt: skip
        kept = dict(self._limits_by_id)
        super().record_limits(definitions, task_limits, replace=replace)
        self._limits_by_id.update(kept)


# -- holders -------------------------------------------------------------------------------


class CountsOnlyRunning(InMemoryTaskStore):
    """A PAUSED task gives its slot away (only RUNNING tasks count as holders)."""

    def _held_counts(self) -> dict[str, int]:
        return _count(r for r in self._tasks.values() if r["status"] == TaskStatus.RUNNING.value)


class NeverFreesOnHandBack(InMemoryTaskStore):
    """A task handed back to PENDING keeps its slot (holders remembered by the lease a start
    gave them, which a save back to PENDING does not clear)."""

    def _held_counts(self) -> dict[str, int]:
        return _count(r for r in self._tasks.values() if r["status"] in _HOLDING
                      or (r["status"] == TaskStatus.PENDING.value and r["lease_owner"]))  # fmt: skip


class FailedTasksKeepTheirSlot(InMemoryTaskStore):
    """A task that FAILED, was STOPPED or found LOST still holds its slot (only a success
    frees it: the solid_queue leak)."""

    def _held_counts(self) -> dict[str, int]:
        return _count(r for r in self._tasks.values()
                      if r["status"] in _HOLDING | _ENDED_BADLY)  # fmt: skip


class CreatedHoldersDoNotCount(InMemoryTaskStore):
    """Only the tasks a start admitted (with a lease) hold slots: one created RUNNING is
    not counted."""

    def _held_counts(self) -> dict[str, int]:
        return _count(r for r in self._tasks.values()
                      if r["status"] in _HOLDING and r["lease_owner"])  # fmt: skip


class AdmitsOneOverMax(InMemoryTaskStore):
    """Off by one: a concurrency ref admits max + 1 holders."""

    def _has_room(self, ref: str, lim: Limit | None, held: dict[str, int], now_us: int) -> bool:
        if isinstance(lim, Concurrency):
            return held.get(ref, 0) <= lim.max
        return super()._has_room(ref, lim, held, now_us)


class UnrecordedRefsLimitedToOne(InMemoryTaskStore):
    """A ref whose limit id is not recorded is treated as a concurrency of one."""

    def _limit_of(self, ref: str) -> Limit | None:
        return super()._limit_of(ref) or Concurrency(max=1)


# -- the rate clock ------------------------------------------------------------------------


class TrustsABackwardClock(InMemoryTaskStore):
    """The bucket's moment follows the caller's now backwards: the time after it refills
    again."""

    def _tokens(self, ref: str, lim: RateLimit, now_us: int) -> tuple[float, int]:
        tokens, at = self._token_buckets.get(ref, (float(lim.burst or 1), now_us))
        return refill(tokens, at, now_us, lim), now_us


class NeverMovesTheRefillMoment(InMemoryTaskStore):
    """Refills from the bucket's first moment every time: tokens are counted twice."""

    def _tokens(self, ref: str, lim: RateLimit, now_us: int) -> tuple[float, int]:
        tokens, at = self._token_buckets.get(ref, (float(lim.burst or 1), now_us))
        return refill(tokens, at, now_us, lim), at


# -- usage ---------------------------------------------------------------------------------


class UsageCountsStaleWaiters(InMemoryTaskStore):
    """limit_usage counts every task a start once passed over, even one that left PENDING."""

    def _still_waiting(self, task_id: str, ref: str, version: int) -> bool:
        return task_id in self._tasks


class UsageKeepsAWaiterThatCameBack(InMemoryTaskStore):
    """limit_usage counts a waiter that left PENDING and was retried back to it, though no
    start has passed it over since (the waiter is judged by its status, not its version)."""

    def _still_waiting(self, task_id: str, ref: str, version: int) -> bool:
        row = self._tasks.get(task_id)
        return row is not None and row["status"] == TaskStatus.PENDING.value


class UsageSortedByRef(InMemoryTaskStore):
    """limit_usage lists the refs by name, not busiest first."""

    def limit_usage(self, *, limit: int = 1000) -> list[LimitUsage]:
        return sorted(super().limit_usage(limit=limit), key=lambda u: u.ref)


class UsageIgnoresTheLimit(InMemoryTaskStore):
    """limit_usage returns every ref whatever its limit."""

    def limit_usage(self, *, limit: int = 1000) -> list[LimitUsage]:
        return super().limit_usage(limit=10_000 if limit in range(1, 10_001) else limit)


# -- the admission loop --------------------------------------------------------------------


class _Admitting(InMemoryTaskStore):
    """``MemoryLimits._admit`` rebuilt with hooks: ``candidates`` (the rows in the order they
    are judged), ``refuse`` (what a refusal does: the row becomes a waiter; ``True`` ends the
    call), ``spend`` (what an admission takes). Sound as written."""

    def _admit(self, ready: Iterable[Row], limit: int, now_us: int) -> list[Row]:
        rows = list(ready)
        held, refused, taken = self._held_counts(), set[str](), list[Row]()
        for row in self.candidates(rows, limit):
            if len(taken) == limit:
                break
            limits = [(ref, self._limit_of(ref)) for ref in refs_of(row)]
            blocking = [ref for ref, lim in limits if ref in refused or
                        not self._has_room(ref, lim, held, now_us)]  # fmt: skip
            if blocking:
                refused.update(blocking)
                if self.refuse(row, limits, blocking, now_us):
                    break
                continue
            for waiters in self._limit_waiters.values():
                waiters.pop(str(row["task_id"]), None)
            self.spend(limits, held, now_us)
            taken.append(row)
        return sorted(taken, key=rows.index)

    def candidates(self, rows: list[Row], limit: int) -> Iterable[Row]:
        return rows

    def refuse(self, row: Row, limits: list[tuple[str, Limit | None]], blocking: list[str],
               now_us: int) -> bool:  # fmt: skip
        for ref in blocking:
            waiters = self._limit_waiters.setdefault(ref, {})
            waiters[str(row["task_id"])] = int(row["status_version"])  # type: ignore[arg-type]
        return False

    def spend(self, limits: list[tuple[str, Limit | None]], held: dict[str, int],
              now_us: int) -> None:  # fmt: skip
        for ref, lim in limits:
            if isinstance(lim, Concurrency):
                held[ref] = held.get(ref, 0) + 1
            elif isinstance(lim, RateLimit):
                tokens, at = self._tokens(ref, lim, now_us)
                self._token_buckets[ref] = (tokens - 1.0, at)


class NewestWaiterFirst(_Admitting):
    """Judges the candidates newest first: a freed slot goes to the latest waiter."""

    def candidates(self, rows: list[Row], limit: int) -> Iterable[Row]:
        return reversed(rows)


class StopsAtTheFirstRefusal(_Admitting):
    """Head-of-line blocking: the first refused task ends the whole call."""

    def refuse(self, row: Row, limits: list[tuple[str, Limit | None]], blocking: list[str],
               now_us: int) -> bool:  # fmt: skip
        super().refuse(row, limits, blocking, now_us)
        return True


class JudgesOnlyTheFirstLimitRows(_Admitting):
    """Looks at the first ``limit`` candidates only: a flooded ref ahead starves the rest."""

    def candidates(self, rows: list[Row], limit: int) -> Iterable[Row]:
        return rows[:limit]


class CandidatesFromTheBestHeadsQueuesOnly(_Admitting):
    """Judges only the queues (bucket and type) of the ``limit`` best candidates: a head its
    limit refuses lets a worse task of those queues start before a better one of another
    type (the Redis start's cut at ``limit`` heads, before it counted passed-over heads)."""

    def candidates(self, rows: list[Row], limit: int) -> Iterable[Row]:
        queues: list[tuple[object, object]] = []
        for row in rows:
            queue = (row["bucket"], row["name"])
            if queue not in queues:
                queues.append(queue)
        kept = set(queues[:limit])
        return [row for row in rows if (row["bucket"], row["name"]) in kept]


class RefusalSpendsAnAttempt(_Admitting):
    """A refused task is written back with its attempt spent (the limiter burns retries)."""

    def refuse(self, row: Row, limits: list[tuple[str, Limit | None]], blocking: list[str],
               now_us: int) -> bool:  # fmt: skip
        row["attempt"] = int(row["attempt"]) + 1  # type: ignore[arg-type]
        return super().refuse(row, limits, blocking, now_us)


class RefusalSpendsATokenOfTheOtherRef(_Admitting):
    """A task its concurrency ref refuses still spends a token of its rate ref."""

    def refuse(self, row: Row, limits: list[tuple[str, Limit | None]], blocking: list[str],
               now_us: int) -> bool:  # fmt: skip
        for ref, lim in limits:
            if ref not in blocking and isinstance(lim, RateLimit):
                tokens, at = self._tokens(ref, lim, now_us)
                self._token_buckets[ref] = (tokens - 1.0, at)
        return super().refuse(row, limits, blocking, now_us)


class HoldersCountedPerBucket(_Admitting):
    """Counts only the holders in the buckets of this call's candidates, not the pool's."""

    def _admit(self, ready: Iterable[Row], limit: int, now_us: int) -> list[Row]:
        rows = list(ready)
        self._buckets = {row["bucket"] for row in rows}
        return super()._admit(rows, limit, now_us)

    def _held_counts(self) -> dict[str, int]:
        buckets = getattr(self, "_buckets", None)
        return _count(r for r in self._tasks.values() if r["status"] in _HOLDING
                      and (buckets is None or r["bucket"] in buckets))  # fmt: skip


SOUND: dict[str, type[InMemoryTaskStore]] = {"_Admitting": _Admitting}

RECORD = "test_record_limits_reads_back_and_refuses_a_conflict_whole"
BAD_RECORD = "test_record_limits_refuses_bad_input_whole_and_a_closed_store"
MAX = "test_concurrency_never_admits_more_than_max_per_key"
WAYS_OUT = "test_every_way_out_of_running_frees_the_slot_in_that_write"
PAUSED = "test_paused_keeps_its_slot_and_a_created_holder_takes_one_pool_wide"
FIFO = "test_a_freed_slot_goes_to_the_oldest_waiter_and_other_keys_go_on"
FLOOD = "test_a_flooded_ref_holds_back_nothing_outside_it"
RATE = "test_a_rate_limit_spends_one_token_per_start_on_the_earlier_clock"
USAGE = "test_limit_usage_counts_holders_and_live_waiters_busiest_first"
UNRECORDED = "test_an_unrecorded_limit_limits_nothing_and_a_lower_max_evicts_no_holder"
TWO_REFS = "test_a_task_with_two_refs_starts_when_both_allow_and_a_refusal_spends_nothing"
HIDES = "test_a_task_its_limit_refuses_hides_no_better_task_of_another_type"

CAUGHT_BY: dict[str, str] = {
    "RecordOverwritesAConflict": RECORD,
    "RecordsOneByOne": RECORD,
    "RecordsDefinitionsBeforeCheckingTypes": BAD_RECORD,
    "DefinitionsReadAfterClose": BAD_RECORD,
    "ReplaceKeepsTheOldLimit": UNRECORDED,
    "CountsOnlyRunning": PAUSED,
    "NeverFreesOnHandBack": WAYS_OUT,
    "FailedTasksKeepTheirSlot": WAYS_OUT,
    "CreatedHoldersDoNotCount": PAUSED,
    "AdmitsOneOverMax": MAX,
    "UnrecordedRefsLimitedToOne": UNRECORDED,
    "TrustsABackwardClock": RATE,
    "NeverMovesTheRefillMoment": RATE,
    "UsageCountsStaleWaiters": USAGE,
    "UsageKeepsAWaiterThatCameBack": USAGE,
    "UsageSortedByRef": USAGE,
    "UsageIgnoresTheLimit": USAGE,
    "NewestWaiterFirst": FIFO,
    "StopsAtTheFirstRefusal": FLOOD,
    "JudgesOnlyTheFirstLimitRows": FLOOD,
    "CandidatesFromTheBestHeadsQueuesOnly": HIDES,
    "RefusalSpendsAnAttempt": MAX,
    "RefusalSpendsATokenOfTheOtherRef": TWO_REFS,
    "HoldersCountedPerBucket": PAUSED,
}

#: Every broken store of this module, by class name.
BROKEN: dict[str, type[InMemoryTaskStore]] = {
    name: cls
    for name, cls in list(globals().items())
    if isinstance(cls, type)
    and issubclass(cls, InMemoryTaskStore)
    and not name.startswith("_")
    and cls is not InMemoryTaskStore
}
