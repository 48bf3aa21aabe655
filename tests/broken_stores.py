"""Deliberately broken stores: each breaks exactly one promise of the ``TaskStore`` contract.

Every class is a small subclass of ``InMemoryTaskStore`` that reintroduces one pitfall of the
store guide (§2, §8, §9) or one bug seen in real backends. ``test_contract_teeth.py`` runs the
whole ``StoreContract`` against each and requires at least one failure: a contract that passes
a broken store has no teeth. Signatures stay exactly the protocol's, so a failure always points
at the broken behaviour, never at a changed signature.
"""

from __future__ import annotations

import unicodedata
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from chongming_redis.errors import (
    CommandNotFound,
    ConcurrencyConflict,
    StoreError,
    TaskAlreadyExists,
)
from chongming_redis.model import (
    Command,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores import _checks as check
from chongming_redis.stores.codec import (
    Row,
    command_to_row,
    encode_dt,
    row_to_snapshot,
    row_to_transition,
    snapshot_to_row,
    transition_to_row,
)
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.validation import check_int

# -- create ----------------------------------------------------------------------------------


class CreateOverwrites(InMemoryTaskStore):
    """create silently replaces an existing task (the rerun-while-running pitfall)."""

    def create(self, snapshot: TaskSnapshot) -> None:
        row = snapshot_to_row(check.check_snapshot(snapshot))
        with self._open():
            self._tasks[snapshot.task_id] = row


class CreateNormalisesIds(InMemoryTaskStore):
    """create treats NFC and NFD spellings of an id as the same task."""

    def create(self, snapshot: TaskSnapshot) -> None:
        wanted = unicodedata.normalize("NFC", check.check_snapshot(snapshot).task_id)
        with self._open():
            taken = {unicodedata.normalize("NFC", t) for t in self._tasks}
        if wanted in taken:
            raise TaskAlreadyExists(snapshot.task_id)
        super().create(snapshot)


# -- save ------------------------------------------------------------------------------------


class SaveIgnoresVersion(InMemoryTaskStore):
    """save writes whatever version is stored: no compare-and-set at all."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        check.check_save(snapshot, expect_version)
        with self._open():
            current = self._tasks.get(snapshot.task_id)
            if current is None:
                raise ConcurrencyConflict(snapshot.task_id, expect_version, None)
            row = snapshot_to_row(snapshot)
            row["lease_owner"], row["lease_until"] = current["lease_owner"], current["lease_until"]
            self._tasks[snapshot.task_id] = row


class SaveOnlyPlusOne(InMemoryTaskStore):
    """save accepts only ``expect_version + 1`` (the write-through buffer can never catch up)."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        check.check_save(snapshot, expect_version)
        if snapshot.status_version != expect_version + 1:
            with self._open():
                current = self._tasks.get(snapshot.task_id)
            actual = None if current is None else current["status_version"]
            raise ConcurrencyConflict(snapshot.task_id, expect_version, actual)  # type: ignore[arg-type]
        super().save(snapshot, expect_version=expect_version)


class SaveRetriesConflicts(InMemoryTaskStore):
    """save retries a conflict against the version it found (hides the second writer)."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        try:
            super().save(snapshot, expect_version=expect_version)
        except ConcurrencyConflict as conflict:
            if conflict.actual is None or conflict.actual >= snapshot.status_version:
                raise
            super().save(snapshot, expect_version=conflict.actual)


class SaveSwallowsConflicts(InMemoryTaskStore):
    """save ignores a version mismatch silently instead of raising."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        try:
            super().save(snapshot, expect_version=expect_version)
        except ConcurrencyConflict:
            return


class SaveMisreportsConflicts(InMemoryTaskStore):
    """save raises a conflict but names the wrong versions (expected as actual)."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        try:
            super().save(snapshot, expect_version=expect_version)
        except ConcurrencyConflict as conflict:
            raise ConcurrencyConflict(conflict.task_id, expect_version, expect_version) from None


class SaveUpsertsMissing(InMemoryTaskStore):
    """save of a missing task creates it instead of reporting a conflict."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        check.check_save(snapshot, expect_version)
        with self._open():
            if snapshot.task_id not in self._tasks:
                self._tasks[snapshot.task_id] = snapshot_to_row(snapshot)
                return
        super().save(snapshot, expect_version=expect_version)


class SaveAllowsGoingBack(InMemoryTaskStore):
    """save does not refuse a new version that is not above ``expect_version``."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        check.check_snapshot(snapshot)
        check_int(expect_version, "expect_version")
        if snapshot.status_version > expect_version:
            super().save(snapshot, expect_version=expect_version)
            return
        with self._open():
            current = self._tasks.get(snapshot.task_id)
            actual = None if current is None else current["status_version"]
            if current is None or actual != expect_version:
                raise ConcurrencyConflict(snapshot.task_id, expect_version, actual)  # type: ignore[arg-type]
            row = snapshot_to_row(snapshot)
            row["lease_owner"], row["lease_until"] = current["lease_owner"], current["lease_until"]
            self._tasks[snapshot.task_id] = row


class SaveClobbersLease(InMemoryTaskStore):
    """save writes the whole snapshot, lease columns included (the reconcile-kills-it bug)."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        super().save(snapshot, expect_version=expect_version)
        with self._open():
            row = self._tasks[snapshot.task_id]
            row["lease_owner"] = snapshot.lease_owner
            row["lease_until"] = (
                None if snapshot.lease_until is None else encode_dt(snapshot.lease_until)
            )


class SaveFillsAnEmptyLease(InMemoryTaskStore):
    """save keeps a stored lease, but writes the snapshot's lease where none is stored."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        super().save(snapshot, expect_version=expect_version)
        with self._open():
            row = self._tasks[snapshot.task_id]
            if row["lease_owner"] is None and snapshot.lease_owner is not None:
                row["lease_owner"] = snapshot.lease_owner
            if row["lease_until"] is None and snapshot.lease_until is not None:
                row["lease_until"] = encode_dt(snapshot.lease_until)


class SaveSkipsHeartbeat(InMemoryTaskStore):
    """save treats progress and heartbeat as touch-only columns and keeps the stored ones."""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        check.check_save(snapshot, expect_version)
        with self._open():
            current = dict(self._tasks.get(snapshot.task_id) or {})
        super().save(snapshot, expect_version=expect_version)
        with self._open():
            for column in ("heartbeat_at", "progress_current", "progress_total"):
                self._tasks[snapshot.task_id][column] = current.get(column)


# -- get -------------------------------------------------------------------------------------


class GetRaisesOnMissing(InMemoryTaskStore):
    """get raises for a missing task instead of returning None."""

    def get(self, task_id: str) -> TaskSnapshot | None:
        found = super().get(task_id)
        if found is None:
            raise KeyError(task_id)
        return found


class GetAcceptsEmptyIds(InMemoryTaskStore):
    """get skips id validation: an empty or oversized id is a silent miss."""

    def get(self, task_id: str) -> TaskSnapshot | None:
        with self._open():
            row = self._tasks.get(task_id)
        return None if row is None else row_to_snapshot(row)


class ParamsShared(InMemoryTaskStore):
    """create keeps the caller's params object, so later mutation leaks into the store."""

    def __init__(self) -> None:
        super().__init__()
        self._params: dict[str, Any] = {}

    def create(self, snapshot: TaskSnapshot) -> None:
        super().create(snapshot)
        self._params[snapshot.task_id] = snapshot.params

    def get(self, task_id: str) -> TaskSnapshot | None:
        found = super().get(task_id)
        if found is None or task_id not in self._params:
            return found
        return replace(found, params=self._params[task_id])


class TimesLoseMicroseconds(InMemoryTaskStore):
    """datetimes are kept as milliseconds (a float-seconds or ms-score backend)."""

    def create(self, snapshot: TaskSnapshot) -> None:
        super().create(_to_millis(check.check_snapshot(snapshot)))

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        check.check_save(snapshot, expect_version)
        super().save(_to_millis(snapshot), expect_version=expect_version)


class TimesStoredAsLocalWallClock(InMemoryTaskStore):
    """datetimes are written as the local wall clock of UTC+2, then read back as UTC."""

    def create(self, snapshot: TaskSnapshot) -> None:
        check.check_snapshot(snapshot)
        shift = timedelta(hours=2)
        super().create(
            replace(
                snapshot,
                created_at=snapshot.created_at + shift,
                updated_at=snapshot.updated_at + shift,
            )
        )


class DropsTraceback(InMemoryTaskStore):
    """the round trip loses ``failure.traceback``."""

    def create(self, snapshot: TaskSnapshot) -> None:
        failure = check.check_snapshot(snapshot).failure
        if failure is not None:
            snapshot = replace(snapshot, failure=replace(failure, traceback=None))
        super().create(snapshot)


class DropsNotBefore(InMemoryTaskStore):
    """the round trip loses ``not_before`` (a field beyond the minimum set)."""

    def create(self, snapshot: TaskSnapshot) -> None:
        super().create(replace(check.check_snapshot(snapshot), not_before=None))


class BigIntsBecomeFloats(InMemoryTaskStore):
    """params go through a double (JSON in a scripting language): 2**62 loses precision."""

    def create(self, snapshot: TaskSnapshot) -> None:
        check.check_snapshot(snapshot)
        super().create(replace(snapshot, params=_floaty(snapshot.params)))


class OversizedParamsDropped(InMemoryTaskStore):
    """a payload over the limit is silently dropped instead of refused."""

    def create(self, snapshot: TaskSnapshot) -> None:
        try:
            super().create(snapshot)
        except ValueError:
            super().create(replace(snapshot, params=None))


class HalfWrittenOnBadParams(InMemoryTaskStore):
    """the task row is written before the params fail to encode (a half-written task)."""

    def create(self, snapshot: TaskSnapshot) -> None:
        try:
            super().create(snapshot)
        except TypeError:
            super().create(replace(snapshot, params=None))
            raise


# -- query and counts ------------------------------------------------------------------------


class QueryTagSubstring(InMemoryTaskStore):
    """tag matches as a substring of the encoded tag list (``io`` hits ``ios``)."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        q = check.check_query(query)
        found = super().query(replace(q, tag=None, limit=None))
        if q.tag is not None:
            found = [s for s in found if q.tag in ",".join(sorted(s.tags))]
        return found if q.limit is None else found[: q.limit]


class QueryNamePrefixExact(InMemoryTaskStore):
    """name_prefix is compared for equality."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        q = check.check_query(query)
        if q.name_prefix is None:
            return super().query(q)
        return super().query(replace(q, name=q.name_prefix, name_prefix=None))


class QueryNameAsPrefix(InMemoryTaskStore):
    """name is matched as a prefix."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        q = check.check_query(query)
        if q.name is None:
            return super().query(q)
        return [s for s in super().query(replace(q, name=None)) if s.name.startswith(q.name)]


class QueryNamePrefixAsGlob(InMemoryTaskStore):
    """name_prefix becomes a glob pattern (``MATCH prefix*`` / ``LIKE 'prefix%'`` unescaped)."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        import fnmatch

        q = check.check_query(query)
        if q.name_prefix is None:
            return super().query(q)
        found = super().query(replace(q, name_prefix=None, limit=None))
        found = [s for s in found if fnmatch.fnmatchcase(s.name, q.name_prefix + "*")]
        return found if q.limit is None else found[: q.limit]


class QueryIgnoresStatuses(InMemoryTaskStore):
    """the statuses filter is ignored."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return super().query(replace(check.check_query(query), statuses=None))


class QueryIgnoresBuckets(InMemoryTaskStore):
    """the buckets filter is ignored."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return super().query(replace(check.check_query(query), buckets=None))


class QueryIgnoresPipeline(InMemoryTaskStore):
    """the pipeline_run_id filter is ignored."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return super().query(replace(check.check_query(query), pipeline_run_id=None))


class QueryIgnoresNewestFirst(InMemoryTaskStore):
    """newest_first is ignored: always oldest first."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return super().query(replace(check.check_query(query), newest_first=False))


class QueryOrdersById(InMemoryTaskStore):
    """results are ordered by task_id instead of created_at."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        q = check.check_query(query)
        found = super().query(replace(q, limit=None))
        found.sort(key=lambda s: s.task_id, reverse=q.newest_first)
        return found if q.limit is None else found[: q.limit]


class QueryTiesInInsertionOrder(InMemoryTaskStore):
    """created_at ties keep insertion order instead of being broken by task_id."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        q = check.check_query(query)
        with self._open():
            order = {task_id: i for i, task_id in enumerate(self._tasks)}
        found = super().query(replace(q, limit=None, newest_first=False))
        found.sort(key=lambda s: (s.created_at, order[s.task_id]))
        if q.newest_first:
            found.sort(key=lambda s: s.created_at, reverse=True)
        return found if q.limit is None else found[: q.limit]


class QueryIgnoresLimit(InMemoryTaskStore):
    """limit is ignored."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return super().query(replace(check.check_query(query), limit=None))


class QueryLimitZeroMeansAll(InMemoryTaskStore):
    """``if q.limit:`` treats limit 0 as no limit."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        q = check.check_query(query)
        return super().query(q if q.limit else replace(q, limit=None))


class QueryLimitBeforeOrdering(InMemoryTaskStore):
    """limit cuts the unordered (insertion-order) rows, then the cut is sorted."""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        q = check.check_query(query)
        if q.limit is None:
            return super().query(q)
        with self._open():
            order = list(self._tasks)
        found = super().query(replace(q, limit=None))
        matching = {s.task_id for s in found}
        allowed = set([t for t in order if t in matching][: q.limit])
        return [s for s in found if s.task_id in allowed]


class CountsMissingZeros(InMemoryTaskStore):
    """counts has only the statuses that occur."""

    def counts(self) -> dict[TaskStatus, int]:
        return {status: n for status, n in super().counts().items() if n}


class CountsStale(InMemoryTaskStore):
    """counts is a counter bumped on create only, so save and prune make it stale."""

    def __init__(self) -> None:
        super().__init__()
        self._counter = dict.fromkeys(TaskStatus, 0)

    def create(self, snapshot: TaskSnapshot) -> None:
        super().create(snapshot)
        self._counter[snapshot.status] += 1

    def counts(self) -> dict[TaskStatus, int]:
        super().counts()
        return dict(self._counter)


# -- history ---------------------------------------------------------------------------------


class AppendDuplicates(InMemoryTaskStore):
    """append is a plain insert: a replay adds a second row."""

    def __init__(self) -> None:
        super().__init__()
        self._rows: dict[str, list[Row]] = {}

    def append(self, transition: Transition) -> None:
        super().append(transition)
        self._rows.setdefault(transition.task_id, []).append(transition_to_row(transition))

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        super().history(task_id, since_version=since_version)
        rows = sorted(self._rows.get(task_id, []), key=lambda r: r["version"])  # type: ignore[arg-type,return-value]
        return [row_to_transition(r) for r in rows if r["version"] > since_version]  # type: ignore[operator]


class AppendLastWins(InMemoryTaskStore):
    """append of an existing (task_id, version) replaces it (upsert instead of ignore)."""

    def append(self, transition: Transition) -> None:
        super().append(transition)
        with self._open():
            self._history[transition.task_id][transition.version] = transition_to_row(transition)


class HistoryUnsorted(InMemoryTaskStore):
    """history comes back in append order."""

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        super().history(task_id, since_version=since_version)
        with self._open():
            rows = list(self._history.get(task_id, {}).values())
        return [row_to_transition(r) for r in rows if r["version"] > since_version]  # type: ignore[operator]


class HistoryIgnoresSinceVersion(InMemoryTaskStore):
    """since_version is ignored."""

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        check_int(since_version, "since_version")
        return super().history(task_id)


class HistorySinceInclusive(InMemoryTaskStore):
    """since_version is inclusive (``>=``): the poller sees its last entry twice."""

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        check_int(since_version, "since_version")
        return super().history(task_id, since_version=max(0, since_version - 1))


class HistoryUnknownRaises(InMemoryTaskStore):
    """history of a task with no entries raises KeyError."""

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        found = super().history(task_id, since_version=since_version)
        with self._open():
            if task_id not in self._history:
                raise KeyError(task_id)
        return found


# -- touch -----------------------------------------------------------------------------------


class TouchBumpsVersion(InMemoryTaskStore):
    """touch increments status_version (progress turns every save into a conflict)."""

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )
        with self._open():
            row = self._tasks.get(task_id)
            if row is not None:
                row["status_version"] = int(row["status_version"]) + 1  # type: ignore[arg-type]


class TouchMissingRaises(InMemoryTaskStore):
    """touch of a missing task raises (a late heartbeat becomes an error)."""

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        check.check_touch(task_id, progress, heartbeat_at, lease_owner, lease_until)
        with self._open():
            if task_id not in self._tasks:
                raise KeyError(task_id)
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


class TouchMissingCreates(InMemoryTaskStore):
    """touch of a missing task creates a stub (an upsert: HSET on a missing key)."""

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        check.check_touch(task_id, progress, heartbeat_at, lease_owner, lease_until)
        with self._open():
            missing = task_id not in self._tasks
        if missing:
            moment = datetime(1970, 1, 1, tzinfo=timezone.utc)
            stub = TaskSnapshot(task_id, "unknown", TaskStatus.PENDING, 0, moment, moment)
            super().create(stub)
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


class TouchRequiresProgressAndHeartbeat(InMemoryTaskStore):
    """touch demands progress and heartbeat together (arguments not independently optional)."""

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        check.check_touch(task_id, progress, heartbeat_at, lease_owner, lease_until)
        if (progress is None) != (heartbeat_at is None):
            raise ValueError("touch needs progress and heartbeat_at together")
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


class TouchDropsLease(InMemoryTaskStore):
    """touch ignores lease_owner / lease_until (an old two-argument touch)."""

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        super().touch(task_id, progress=progress, heartbeat_at=heartbeat_at)


class TouchDerivesHeartbeat(InMemoryTaskStore):
    """touch treats a lease renewal as a heartbeat (the two signals are merged)."""

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        if heartbeat_at is None and lease_until is not None:
            heartbeat_at = lease_until
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


class TouchClearsOmitted(InMemoryTaskStore):
    """touch writes all four fields, so an omitted argument erases the stored value."""

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )
        if all(arg is None for arg in (progress, heartbeat_at, lease_owner, lease_until)):
            return
        with self._open():
            row = self._tasks.get(task_id)
            if row is None:
                return
            if progress is None:
                row.update(progress_current=None, progress_total=None, progress_message=None)
            if heartbeat_at is None:
                row["heartbeat_at"] = None
            if lease_owner is None:
                row["lease_owner"] = None
            if lease_until is None:
                row["lease_until"] = None


# -- commands --------------------------------------------------------------------------------


class SubmitOverwrites(InMemoryTaskStore):
    """submit_command replaces an existing command silently."""

    def submit_command(self, command: Command) -> None:
        row = command_to_row(check.check_command(command))
        with self._open():
            self._commands[command.command_id] = row


class ClaimWithoutLease(InMemoryTaskStore):
    """claim returns commands with a lease but never stores it (claimable again at once)."""

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        claimed = super().claim_commands(now=now, lease_seconds=lease_seconds, limit=limit)
        with self._open():
            for item in claimed:
                self._commands[item.command_id]["lease_until"] = None
        return claimed


class ClaimNeverExpires(InMemoryTaskStore):
    """a leased command is never claimable again (a crashed claimer's command is stuck)."""

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        far = encode_dt(datetime(2200, 1, 1, tzinfo=timezone.utc))
        claimed = super().claim_commands(now=now, lease_seconds=lease_seconds, limit=limit)
        with self._open():
            for item in claimed:
                self._commands[item.command_id]["lease_until"] = far
        return claimed


class ClaimExpiryExclusive(InMemoryTaskStore):
    """a lease counts as expired only strictly after ``lease_until`` (``<`` instead of ``<=``)."""

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        with self._open():
            exact = [
                cid
                for cid, row in self._commands.items()
                if row["finished_at"] is None and row["lease_until"] == encode_dt(now)
            ]
            saved = {cid: self._commands.pop(cid) for cid in exact}
        try:
            return super().claim_commands(now=now, lease_seconds=lease_seconds, limit=limit)
        finally:
            with self._open():
                self._commands.update(saved)


class ClaimIgnoresLimit(InMemoryTaskStore):
    """claim takes every ready command whatever the limit."""

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        check.check_claim(now, lease_seconds, limit)
        return super().claim_commands(now=now, lease_seconds=lease_seconds, limit=1000)


class ClaimOrdersById(InMemoryTaskStore):
    """claim picks by command_id instead of created_at."""

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        with self._open():
            originals = {cid: row["created_at"] for cid, row in self._commands.items()}
            for row in self._commands.values():
                row["created_at"] = 0
        try:
            claimed = super().claim_commands(now=now, lease_seconds=lease_seconds, limit=limit)
        finally:
            with self._open():
                for cid, created in originals.items():
                    self._commands[cid]["created_at"] = created
        return [replace(c, created_at=_from_micros(originals[c.command_id])) for c in claimed]


class ClaimLeaseFromCreation(InMemoryTaskStore):
    """the lease is measured from the command's created_at, not from ``now``."""

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        claimed = super().claim_commands(now=now, lease_seconds=lease_seconds, limit=limit)
        result = []
        with self._open():
            for item in claimed:
                until = item.created_at + timedelta(seconds=lease_seconds)
                self._commands[item.command_id]["lease_until"] = encode_dt(until)
                result.append(replace(item, lease_until=until))
        return result


class ReleaseCompletes(InMemoryTaskStore):
    """release marks the command finished (the true holder never gets it)."""

    def release_command(self, command_id: str, *, now: datetime) -> None:
        self.complete_command(command_id, now=now, outcome="released")


class ReleaseDoesNothing(InMemoryTaskStore):
    """release leaves the lease to expire (the true holder starves while others poll)."""

    def release_command(self, command_id: str, *, now: datetime) -> None:
        check.check_release(command_id, now)
        with self._open():
            self._command(command_id)


class ReleaseReopensFinished(InMemoryTaskStore):
    """release clears finished_at too, so a completed command runs again."""

    def release_command(self, command_id: str, *, now: datetime) -> None:
        super().release_command(command_id, now=now)
        with self._open():
            self._command(command_id).update(lease_until=None, finished_at=None, outcome=None)


class ReleaseUnknownSilent(InMemoryTaskStore):
    """release of an unknown command does nothing instead of raising CommandNotFound."""

    def release_command(self, command_id: str, *, now: datetime) -> None:
        try:
            super().release_command(command_id, now=now)
        except CommandNotFound:
            return


class CompleteOnlyReleases(InMemoryTaskStore):
    """complete clears the lease but never sets finished_at (the command comes back)."""

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        check.check_complete(command_id, now, outcome)
        with self._open():
            self._command(command_id).update(lease_until=None, outcome=outcome)


class CompleteTwiceRaises(InMemoryTaskStore):
    """completing a finished command raises instead of keeping the first outcome."""

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        with self._open():
            row = self._commands.get(command_id)
            if row is not None and row["finished_at"] is not None:
                raise StoreError(f"command {command_id!r} is already finished")
        super().complete_command(command_id, now=now, outcome=outcome)


class CompleteUnknownSilent(InMemoryTaskStore):
    """complete of an unknown command does nothing instead of raising CommandNotFound."""

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        try:
            super().complete_command(command_id, now=now, outcome=outcome)
        except CommandNotFound:
            return


class ClaimAcceptsAnyLease(InMemoryTaskStore):
    """claim skips argument checks: a zero or NaN lease is accepted (and leases nothing)."""

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        if type(lease_seconds) in (int, float, bool) and not (0 < lease_seconds < 1e9):
            with self._open():
                return []
        return super().claim_commands(now=now, lease_seconds=lease_seconds, limit=limit)


# -- prune -----------------------------------------------------------------------------------


class PruneDeletesLive(InMemoryTaskStore):
    """prune counts and drops live tasks too."""

    def prune(self, *, keep_terminal: int) -> int:
        keep = check.check_keep_terminal(keep_terminal)
        with self._open():
            rows = sorted(self._tasks.values(), key=lambda r: (r["created_at"], r["task_id"]))
            doomed = rows[: max(0, len(rows) - keep)]
            for row in doomed:
                del self._tasks[str(row["task_id"])]
                self._history.pop(str(row["task_id"]), None)
            return len(doomed)


class PruneKeepsHistory(InMemoryTaskStore):
    """prune drops the task but leaves its history behind."""

    def prune(self, *, keep_terminal: int) -> int:
        with self._open():
            kept = {task_id: dict(rows) for task_id, rows in self._history.items()}
        dropped = super().prune(keep_terminal=keep_terminal)
        with self._open():
            self._history.update(kept)
        return dropped


class PruneDropsNewest(InMemoryTaskStore):
    """prune keeps the oldest terminal tasks and drops the newest."""

    def prune(self, *, keep_terminal: int) -> int:
        keep = check.check_keep_terminal(keep_terminal)
        with self._open():
            terminal = [r for r in self._tasks.values() if TaskStatus(r["status"]).is_terminal]
            terminal.sort(key=lambda r: (r["created_at"], r["task_id"]), reverse=True)
            doomed = terminal[: max(0, len(terminal) - keep)]
            for row in doomed:
                del self._tasks[str(row["task_id"])]
                self._history.pop(str(row["task_id"]), None)
            return len(doomed)


class PruneByUpdatedAt(InMemoryTaskStore):
    """prune picks the oldest by updated_at instead of created_at."""

    def prune(self, *, keep_terminal: int) -> int:
        with self._open():
            created = {task_id: row["created_at"] for task_id, row in self._tasks.items()}
            for row in self._tasks.values():
                row["created_at"] = row["updated_at"]
        try:
            return super().prune(keep_terminal=keep_terminal)
        finally:
            with self._open():
                for task_id, row in self._tasks.items():
                    row["created_at"] = created[task_id]


class PruneReturnsNothing(InMemoryTaskStore):
    """prune does its work but always reports 0."""

    def prune(self, *, keep_terminal: int) -> int:
        super().prune(keep_terminal=keep_terminal)
        return 0


class PruneAcceptsNegative(InMemoryTaskStore):
    """a negative keep_terminal is treated as 0 instead of refused."""

    def prune(self, *, keep_terminal: int) -> int:
        if type(keep_terminal) is int and keep_terminal < 0:
            keep_terminal = 0
        return super().prune(keep_terminal=keep_terminal)


# -- close -----------------------------------------------------------------------------------


class CloseNotIdempotent(InMemoryTaskStore):
    """a second close raises."""

    def close(self) -> None:
        with self._open():
            pass
        super().close()


class CloseDoesNothing(InMemoryTaskStore):
    """close leaves the store usable."""

    def close(self) -> None:
        return


class CloseBreaksWithoutStoreError(InMemoryTaskStore):
    """close drops the state, so a later call dies with AttributeError instead of StoreClosed."""

    def close(self) -> None:
        self._tasks = None  # type: ignore[assignment]
        self._history = None  # type: ignore[assignment]
        self._commands = None  # type: ignore[assignment]

    def _open(self) -> Any:
        return self._lock


# -- helpers ---------------------------------------------------------------------------------


def _to_millis(snapshot: TaskSnapshot) -> TaskSnapshot:
    def cut(value: datetime) -> datetime:
        return value.replace(microsecond=value.microsecond // 1000 * 1000)

    def cut_opt(value: datetime | None) -> datetime | None:
        return None if value is None else cut(value)

    return replace(
        snapshot,
        created_at=cut(snapshot.created_at),
        updated_at=cut(snapshot.updated_at),
        heartbeat_at=cut_opt(snapshot.heartbeat_at),
        not_before=cut_opt(snapshot.not_before),
    )


def _floaty(value: Any) -> Any:
    if type(value) is int and abs(value) > 2**53:
        return int(float(value))
    if isinstance(value, dict):
        return {k: _floaty(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floaty(v) for v in value]
    return value


def _from_micros(value: Any) -> datetime:
    micros: int = int(value)
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=micros)


BROKEN_STORES: dict[str, type[InMemoryTaskStore]] = {
    cls.__name__: cls
    for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, InMemoryTaskStore) and cls is not InMemoryTaskStore
}

# Round two: bugs the first 107 contract tests let through, ours (``broken_stores_round_two``)
# and an independent reviewer's (``broken_stores_review``).
from tests.broken_stores_review import REVIEW  # noqa: E402
from tests.broken_stores_round_two import ROUND_TWO  # noqa: E402

assert not set(ROUND_TWO) & set(BROKEN_STORES), "broken store names must be unique"
assert not set(REVIEW) & (set(BROKEN_STORES) | set(ROUND_TWO)), "broken store names must be unique"
BROKEN_STORES.update(ROUND_TWO)
BROKEN_STORES.update(REVIEW)
