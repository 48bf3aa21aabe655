"""Broken stores from an independent review of the contract suite (round two).

A reviewer who had not read ``broken_stores.py`` wrote plausible buggy backends, each breaking
one rule of ``stores/protocol.py`` or ``docs/store-guide.md``; 62 of 75 passed the suite as it
then stood, and the tests added for them now catch every one. Every class is a small subclass
of InMemoryTaskStore; its docstring says what the backend author did wrong. KIND is "strict" (a
rule the documents stated) or "ambiguous" (a behaviour they left open, which the documents now
state). ``CAUGHT_BY`` names the contract test that pins each rule.

Not here: a store whose second ``complete_command`` overwrites the first outcome. The rule
("the first outcome stays") is stated but no protocol method returns a finished command, so no
contract test can see it; store guide §6 says so.
"""

from __future__ import annotations

import unicodedata
from dataclasses import replace
from datetime import timedelta

from chongming_redis.errors import (
    CommandAlreadyExists,
    ConcurrencyConflict,
    StoreClosed,
    StoreError,
    TaskAlreadyExists,
)
from chongming_redis.model import (
    Progress,
    TaskStatus,
)
from chongming_redis.stores import _checks as check
from chongming_redis.stores._memory_reads import _matches
from chongming_redis.stores.codec import (
    LEASE_COLUMNS,
    MAX_PAYLOAD_BYTES,
    encode_dt,
    encode_payload,
    progress_to_columns,
    row_to_command,
    row_to_snapshot,
    snapshot_to_row,
    touch_columns,
)
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.validation import check_dt, check_identifier, check_int

STRICT, AMBIG, CONTROL = "strict", "ambiguous", "control"
REGISTRY: dict[str, tuple[type, str]] = {}


def reg(kind: str):
    def deco(cls):
        REGISTRY[cls.__name__] = (cls, kind)
        return cls

    return deco


def _closed(store: InMemoryTaskStore) -> None:
    if store._closed:
        raise StoreClosed()


# ======================================================================================
# touch
# ======================================================================================


@reg(STRICT)
class TouchWritesProgressBeforeCheckingHeartbeat(InMemoryTaskStore):
    """touch HSETs progress first, then validates heartbeat_at: a refused touch leaves progress."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        check_identifier(task_id, "task_id")
        if progress is not None:
            check.require(progress, Progress, "progress")
            with self._open():
                row = self._tasks.get(task_id)
                if row is not None:
                    row.update(progress_to_columns(progress))
        super().touch(
            task_id, heartbeat_at=heartbeat_at, lease_owner=lease_owner, lease_until=lease_until
        )


@reg(STRICT)
class TouchWritesHeartbeatBeforeCheckingLeaseOwner(InMemoryTaskStore):
    """touch writes heartbeat_at first, then validates lease_owner: partial write on refusal."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        check_identifier(task_id, "task_id")
        if heartbeat_at is not None:
            moment = encode_dt(heartbeat_at)
            with self._open():
                row = self._tasks.get(task_id)
                if row is not None:
                    row["heartbeat_at"] = moment
        super().touch(task_id, progress=progress, lease_owner=lease_owner, lease_until=lease_until)


@reg(STRICT)
class TouchOfMissingTaskSkipsArgumentChecks(InMemoryTaskStore):
    """touch returns early for a vanished task before validating the other arguments."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        check_identifier(task_id, "task_id")
        with self._open():
            exists = task_id in self._tasks
        if not exists:
            return
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


@reg(STRICT)
class TouchWithNothingSkipsTheClosedCheck(InMemoryTaskStore):
    """touch with every argument None returns before any round trip, even after close()."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        check_identifier(task_id, "task_id")
        if progress is heartbeat_at is lease_owner is lease_until is None:
            return
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


@reg(STRICT)
class TouchStringifiesLeaseOwner(InMemoryTaskStore):
    """touch str()s a non-str lease_owner (Redis clients stringify everything)."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        if lease_owner is not None and not isinstance(lease_owner, str):
            lease_owner = str(lease_owner)
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


@reg(STRICT)
class TouchDoesNotTypeCheckProgress(InMemoryTaskStore):
    """touch trusts progress to be a Progress: a dict leaks AttributeError, not TypeError."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        check.check_touch(task_id, None, heartbeat_at, lease_owner, lease_until)
        changes = touch_columns(progress, heartbeat_at, lease_owner, lease_until)
        with self._open():
            row = self._tasks.get(task_id)
            if row is not None:
                row.update(changes)


@reg(STRICT)
class TouchHeartbeatNeverMovesBack(InMemoryTaskStore):
    """touch keeps the later heartbeat ("if new > old then HSET"), not the one given."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        if heartbeat_at is not None:
            with self._open():
                row = self._tasks.get(task_id)
                stored = None if row is None else row["heartbeat_at"]
            if stored is not None and stored > encode_dt(heartbeat_at):
                heartbeat_at = None
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


@reg(STRICT)
class TouchLeaseNeverShrinks(InMemoryTaskStore):
    """touch only extends lease_until (a 'renewal' never shortens), not as given."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        if lease_until is not None:
            with self._open():
                row = self._tasks.get(task_id)
                stored = None if row is None else row["lease_until"]
            if stored is not None and stored > encode_dt(lease_until):
                lease_until = None
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


@reg(STRICT)
class TouchStripsLeaseOwner(InMemoryTaskStore):
    """lease_owner is .strip()ed (or a CHAR/PAD SPACE column drops trailing blanks)."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        if isinstance(lease_owner, str) and lease_owner.strip():
            lease_owner = lease_owner.strip()
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


@reg(STRICT)
class LeaseOwnerColumnIsVarchar255(InMemoryTaskStore):
    """lease_owner lives in a VARCHAR(255) that silently truncates (MySQL non-strict)."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        check.check_touch(task_id, progress, heartbeat_at, lease_owner, lease_until)
        if lease_owner is not None:
            lease_owner = lease_owner[:255]
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


@reg(STRICT)
class TouchStoresEmptyProgressMessageAsNone(InMemoryTaskStore):
    """the hand-written touch HSET uses '' as the None sentinel for progress_message."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        if isinstance(progress, Progress) and progress.message == "":
            progress = replace(progress, message=None)
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


@reg(CONTROL)
class TouchProgressNeverMovesBack(InMemoryTaskStore):
    """control: touch keeps the larger progress.current."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        if progress is not None:
            with self._open():
                row = self._tasks.get(task_id)
                cur = None if row is None else row["progress_current"]
            if cur is not None and cur > progress.current:
                progress = None
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


# ======================================================================================
# save
# ======================================================================================


@reg(STRICT)
class SaveComparesVersionsBeforeTheMonotonicCheck(InMemoryTaskStore):
    """save reads the stored version first; a mismatch is a conflict even when
    snapshot.status_version <= expect_version should have been a ValueError."""

    def save(self, snapshot, *, expect_version):
        check.check_snapshot(snapshot)
        check_int(expect_version, "expect_version")
        with self._open():
            current = self._tasks.get(snapshot.task_id)
            actual = None if current is None else current["status_version"]
            if actual != expect_version:
                raise ConcurrencyConflict(snapshot.task_id, expect_version, actual)
        super().save(snapshot, expect_version=expect_version)


@reg(STRICT)
class SaveAcceptsIntegralFloatExpectVersion(InMemoryTaskStore):
    """expect_version 2.0 is accepted (it becomes a Lua number anyway)."""

    def save(self, snapshot, *, expect_version):
        if type(expect_version) is float and expect_version.is_integer():
            expect_version = int(expect_version)
        super().save(snapshot, expect_version=expect_version)


@reg(STRICT)
class SaveKeepsTheStoredCreatedAt(InMemoryTaskStore):
    """UPDATE omits created_at ('insert-only column'): save does not replace it."""

    def save(self, snapshot, *, expect_version):
        check.check_save(snapshot, expect_version)
        with self._open():
            current = self._tasks.get(snapshot.task_id)
        if current is not None and current["status_version"] == expect_version:
            kept = row_to_snapshot(current).created_at
            snapshot = replace(snapshot, created_at=kept)
        super().save(snapshot, expect_version=expect_version)


@reg(STRICT)
class SaveKeepsTheLaterHeartbeat(InMemoryTaskStore):
    """save never moves heartbeat_at backwards (keeps the stored one if it is later)."""

    def save(self, snapshot, *, expect_version):
        check.check_save(snapshot, expect_version)
        with self._open():
            current = self._tasks.get(snapshot.task_id)
        if (
            current is not None
            and current["heartbeat_at"] is not None
            and snapshot.heartbeat_at is not None
            and current["heartbeat_at"] > encode_dt(snapshot.heartbeat_at)
        ):
            snapshot = replace(snapshot, heartbeat_at=row_to_snapshot(current).heartbeat_at)
        super().save(snapshot, expect_version=expect_version)


class CountingStore(InMemoryTaskStore):
    """A correct store with a counter hash (the guide's advice) -- base for a broken one."""

    def __init__(self) -> None:
        super().__init__()
        self._counter = dict.fromkeys(TaskStatus, 0)

    def create(self, snapshot):
        super().create(snapshot)
        self._counter[snapshot.status] += 1

    def save(self, snapshot, *, expect_version):
        with self._open():
            cur = self._tasks.get(getattr(snapshot, "task_id", ""))
            old = None if cur is None else TaskStatus(cur["status"])
        super().save(snapshot, expect_version=expect_version)
        self._counter[old] -= 1
        self._counter[snapshot.status] += 1

    def prune(self, *, keep_terminal):
        with self._open():
            before = {k: TaskStatus(r["status"]) for k, r in self._tasks.items()}
        n = super().prune(keep_terminal=keep_terminal)
        for k, s in before.items():
            if k not in self._tasks:
                self._counter[s] -= 1
        return n

    def counts(self):
        with self._open():
            return dict(self._counter)


@reg(STRICT)
class SaveMovesTheCounterBeforeEncodingThePayload(CountingStore):
    """save HINCRBYs the status counters after the CAS read but before encoding params:
    a save refused for an oversized payload still moves counts()."""

    def save(self, snapshot, *, expect_version):
        check.check_save(snapshot, expect_version)
        with self._open():
            cur = self._tasks.get(snapshot.task_id)
            if cur is None or cur["status_version"] != expect_version:
                raise ConcurrencyConflict(
                    snapshot.task_id, expect_version, None if cur is None else cur["status_version"]
                )
            self._counter[TaskStatus(cur["status"])] -= 1
            self._counter[snapshot.status] += 1
            row = snapshot_to_row(snapshot)  # may raise: too late
            for column in LEASE_COLUMNS:
                row[column] = cur[column]
            self._tasks[snapshot.task_id] = row


class TagIndexStore(InMemoryTaskStore):
    """A correct store with a tag -> ids index (like Redis SETs) used by query(tag=...)."""

    def __init__(self) -> None:
        super().__init__()
        self._tag_index: dict[str, set[str]] = {}

    def _index(self, task_id, tags):
        for t in tags:
            self._tag_index.setdefault(t, set()).add(task_id)

    def _unindex(self, task_id, tags):
        for t in tags:
            self._tag_index.get(t, set()).discard(task_id)

    def create(self, snapshot):
        super().create(snapshot)
        self._index(snapshot.task_id, snapshot.tags)

    def save(self, snapshot, *, expect_version):
        with self._open():
            cur = self._tasks.get(getattr(snapshot, "task_id", ""))
            old = set() if cur is None else row_to_snapshot(cur).tags
        super().save(snapshot, expect_version=expect_version)
        self._unindex(snapshot.task_id, old - snapshot.tags)
        self._index(snapshot.task_id, snapshot.tags)

    def prune(self, *, keep_terminal):
        with self._open():
            before = {k: row_to_snapshot(r).tags for k, r in self._tasks.items()}
        n = super().prune(keep_terminal=keep_terminal)
        for k, tags in before.items():
            if k not in self._tasks:
                self._unindex(k, tags)
        return n

    def query(self, query=None):
        q = check.check_query(query)
        if q.tag is None:
            return super().query(q)
        rows = super().query(replace(q, tag=None, limit=None))
        ids = self._tag_index.get(q.tag, set())
        found = [s for s in rows if s.task_id in ids]
        return found if q.limit is None else found[: q.limit]


@reg(STRICT)
class RejectedSaveLeaksIntoTheTagIndex(TagIndexStore):
    """save SADDs the new tags before the compare-and-set refuses it."""

    def save(self, snapshot, *, expect_version):
        check.check_save(snapshot, expect_version)
        self._index(snapshot.task_id, snapshot.tags)  # before the CAS
        super().save(snapshot, expect_version=expect_version)


@reg(STRICT)
class RefusedCreateLeaksIntoTheTagIndex(TagIndexStore):
    """create SADDs the tags before HSETNX finds the task already there."""

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        with self._open():
            pass
        self._index(snapshot.task_id, snapshot.tags)
        super().create(snapshot)


@reg(CONTROL)
class SaveAcceptsOnlyPlusOne(InMemoryTaskStore):
    """control: save requires status_version == expect_version + 1."""

    def save(self, snapshot, *, expect_version):
        check.check_save(snapshot, expect_version)
        if snapshot.status_version != expect_version + 1:
            with self._open():
                cur = self._tasks.get(snapshot.task_id)
            raise ConcurrencyConflict(
                snapshot.task_id, expect_version, None if cur is None else cur["status_version"]
            )
        super().save(snapshot, expect_version=expect_version)


@reg(CONTROL)
class ConflictReportsActualAsText(InMemoryTaskStore):
    """control: ConcurrencyConflict.actual is the raw Redis string."""

    def save(self, snapshot, *, expect_version):
        try:
            super().save(snapshot, expect_version=expect_version)
        except ConcurrencyConflict as e:
            raise ConcurrencyConflict(
                e.task_id, e.expected, None if e.actual is None else str(e.actual)
            ) from None


# ======================================================================================
# create / records
# ======================================================================================


@reg(AMBIG)
class CreateDoesNotWriteTheLease(InMemoryTaskStore):
    """create drops lease_owner/lease_until ('written only by touch', model docstring)."""

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        super().create(replace(snapshot, lease_owner=None, lease_until=None))


@reg(STRICT)
class KeyColumnIsVarchar255(InMemoryTaskStore):
    """key lives in a VARCHAR(255) that silently truncates."""

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        if snapshot.key is not None:
            snapshot = replace(snapshot, key=snapshot.key[:255])
        super().create(snapshot)

    def save(self, snapshot, *, expect_version):
        check.check_save(snapshot, expect_version)
        if snapshot.key is not None:
            snapshot = replace(snapshot, key=snapshot.key[:255])
        super().save(snapshot, expect_version=expect_version)


@reg(STRICT)
class TracebackColumnIsMySqlText(InMemoryTaskStore):
    """failure_traceback in a 64 KiB TEXT column: longer tracebacks are truncated."""

    @staticmethod
    def _cut(snapshot):
        f = snapshot.failure
        if f is not None and f.traceback is not None:
            raw = f.traceback.encode("utf-8")
            if len(raw) > 65535:
                cut = raw[:65535].decode("utf-8", "ignore")
                snapshot = replace(snapshot, failure=replace(f, traceback=cut))
        return snapshot

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        super().create(self._cut(snapshot))

    def save(self, snapshot, *, expect_version):
        check.check_save(snapshot, expect_version)
        super().save(self._cut(snapshot), expect_version=expect_version)


@reg(STRICT)
class EmptyTracebackBecomesNone(InMemoryTaskStore):
    """'' is the NULL sentinel for failure_traceback (HSET cannot store None)."""

    @staticmethod
    def _fix(snapshot):
        f = snapshot.failure
        if f is not None and f.traceback == "":
            snapshot = replace(snapshot, failure=replace(f, traceback=None))
        return snapshot

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        super().create(self._fix(snapshot))

    def save(self, snapshot, *, expect_version):
        check.check_save(snapshot, expect_version)
        super().save(self._fix(snapshot), expect_version=expect_version)


@reg(STRICT)
class PayloadLimitIsOffByOne(InMemoryTaskStore):
    """the store's own size check refuses an encoded payload of exactly 1 MiB (>= not >)."""

    @staticmethod
    def _size(snapshot):
        for what in ("params", "result"):
            data = encode_payload(getattr(snapshot, what), what)
            if data is not None and len(data) >= MAX_PAYLOAD_BYTES:
                raise ValueError(f"{what} too large")

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        self._size(snapshot)
        super().create(snapshot)


@reg(STRICT)
class VersionColumnIsInt32(InMemoryTaskStore):
    """status_version / history version in an INT column: > 2**31-1 fails as a StoreError."""

    LIMIT = 2**31 - 1

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        if snapshot.status_version > self.LIMIT:
            raise StoreError("integer out of range")
        super().create(snapshot)

    def save(self, snapshot, *, expect_version):
        check.check_save(snapshot, expect_version)
        if snapshot.status_version > self.LIMIT:
            raise StoreError("integer out of range")
        super().save(snapshot, expect_version=expect_version)

    def append(self, transition):
        check.check_transition(transition)
        if transition.version > self.LIMIT:
            raise StoreError("integer out of range")
        super().append(transition)


@reg(STRICT)
class AttemptColumnIsInt32(InMemoryTaskStore):
    """attempt stored in a 32-bit column: wraps around above 2**31-1."""

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        if snapshot.attempt > 2**31 - 1:
            snapshot = replace(snapshot, attempt=snapshot.attempt % 2**31)
        super().create(snapshot)


# ======================================================================================
# query / counts
# ======================================================================================


@reg(STRICT)
class QueryLimitZeroShortCircuits(InMemoryTaskStore):
    """query(limit=0) returns [] without a round trip -- even after close()."""

    def query(self, query=None):
        q = check.check_query(query)
        if q.limit == 0:
            return []
        return super().query(q)


@reg(STRICT)
class QueryEmptySetShortCircuits(InMemoryTaskStore):
    """query with an empty statuses/buckets set returns [] at once -- even after close()."""

    def query(self, query=None):
        q = check.check_query(query)
        if q.statuses == frozenset() or q.buckets == frozenset():
            return []
        return super().query(q)


@reg(STRICT)
class QueryLimitIsInt32(InMemoryTaskStore):
    """LIMIT bound as a 32-bit int: a limit above 2**31-1 is refused."""

    def query(self, query=None):
        q = check.check_query(query)
        if q.limit is not None and q.limit > 2**31 - 1:
            raise ValueError("limit out of range")
        return super().query(q)


@reg(AMBIG)
class QueryTiesUseCaseInsensitiveCollation(InMemoryTaskStore):
    """ties on created_at are broken by task_id under a case-insensitive collation."""

    def query(self, query=None):
        q = check.check_query(query)
        with self._open():
            rows = [r for r in self._tasks.values() if _matches(r, q)]
        rows.sort(key=lambda r: (r["created_at"], r["task_id"].casefold()), reverse=q.newest_first)
        if q.limit is not None:
            rows = rows[: q.limit]
        return [row_to_snapshot(r) for r in rows]


@reg(AMBIG)
class QueryTiesUseUtf16Order(InMemoryTaskStore):
    """ties broken by task_id in UTF-16 code-unit order (JVM/.NET/JS backends)."""

    def query(self, query=None):
        q = check.check_query(query)
        with self._open():
            rows = [r for r in self._tasks.values() if _matches(r, q)]
        rows.sort(
            key=lambda r: (r["created_at"], r["task_id"].encode("utf-16-be")),
            reverse=q.newest_first,
        )
        if q.limit is not None:
            rows = rows[: q.limit]
        return [row_to_snapshot(r) for r in rows]


@reg(STRICT)
class QueryNewestFirstReversesOnlyTies(InMemoryTaskStore):
    """reads the guide's '(descending with newest_first=True)' as applying to the tie-break."""

    def query(self, query=None):
        q = check.check_query(query)
        with self._open():
            rows = [r for r in self._tasks.values() if _matches(r, q)]
        rows.sort(key=lambda r: r["task_id"], reverse=q.newest_first)
        rows.sort(key=lambda r: r["created_at"])
        if q.limit is not None:
            rows = rows[: q.limit]
        return [row_to_snapshot(r) for r in rows]


@reg(STRICT)
class CountsKeyedByValue(InMemoryTaskStore):
    """control: counts() keyed by the status string from HGETALL."""

    def counts(self):
        return {s.value: n for s, n in super().counts().items()}


# ======================================================================================
# history
# ======================================================================================


@reg(STRICT)
class HistoryAcceptsFloatSinceVersion(InMemoryTaskStore):
    """since_version checked as 'a non-negative number' (it is a sorted-set score)."""

    def history(self, task_id, *, since_version=0):
        check_identifier(task_id, "task_id")
        if type(since_version) not in (int, float):
            raise TypeError("since_version must be a number")
        if since_version < 0:
            raise ValueError("since_version must be >= 0")
        with self._open():
            entries = self._history.get(task_id, {})
            rows = [entries[v] for v in sorted(entries) if v > since_version]
        from chongming_redis.stores.codec import row_to_transition

        return [row_to_transition(r) for r in rows]


@reg(STRICT)
class HistoryHasNoUpperBoundOnSinceVersion(InMemoryTaskStore):
    """since_version is only checked to be a non-negative int: 2**60 is accepted."""

    def history(self, task_id, *, since_version=0):
        if type(since_version) is int and since_version > 2**53 - 1:
            check_identifier(task_id, "task_id")
            with self._open():
                return []
        return super().history(task_id, since_version=since_version)


@reg(STRICT)
class HistoryOfUnknownTaskSkipsArgumentChecks(InMemoryTaskStore):
    """history returns [] for an unknown task before validating since_version."""

    def history(self, task_id, *, since_version=0):
        check_identifier(task_id, "task_id")
        with self._open():
            known = task_id in self._history
        if not known:
            return []
        return super().history(task_id, since_version=since_version)


@reg(STRICT)
class AppendStoresEmptyReasonAsNone(InMemoryTaskStore):
    """'' is the NULL sentinel for a history reason."""

    def append(self, transition):
        check.check_transition(transition)
        if transition.reason == "":
            transition = replace(transition, reason=None)
        super().append(transition)


# ======================================================================================
# commands
# ======================================================================================


@reg(STRICT)
class ClaimOnEmptyStoreSkipsArgumentChecks(InMemoryTaskStore):
    """claim returns [] when there are no commands, before validating its arguments."""

    def claim_commands(self, *, now, lease_seconds, limit=50):
        with self._open():
            empty = not self._commands
        if empty:
            return []
        return super().claim_commands(now=now, lease_seconds=lease_seconds, limit=limit)


@reg(STRICT)
class ClaimComputesLeaseWithFloatTimestamps(InMemoryTaskStore):
    """lease_until = round((now.timestamp() + lease_seconds) * 1e6) µs: float rounding."""

    def claim_commands(self, *, now, lease_seconds, limit=50):
        check.check_claim(now, lease_seconds, limit)
        moment = encode_dt(now)
        until = round((now.timestamp() + float(lease_seconds)) * 1e6)
        with self._open():
            ready = [
                r
                for r in self._commands.values()
                if r["finished_at"] is None
                and (r["lease_until"] is None or r["lease_until"] <= moment)
            ]
            ready.sort(key=lambda r: (r["created_at"], r["command_id"]))
            claimed = ready[:limit]
            for r in claimed:
                r["lease_until"] = until
            return [row_to_command(r) for r in claimed]


@reg(AMBIG)
class ClaimTiesUseCaseInsensitiveCollation(InMemoryTaskStore):
    """command ties broken by command_id under a case-insensitive collation."""

    def claim_commands(self, *, now, lease_seconds, limit=50):
        until = encode_dt(check.check_claim(now, lease_seconds, limit))
        moment = encode_dt(now)
        with self._open():
            ready = [
                r
                for r in self._commands.values()
                if r["finished_at"] is None
                and (r["lease_until"] is None or r["lease_until"] <= moment)
            ]
            ready.sort(key=lambda r: (r["created_at"], r["command_id"].casefold()))
            claimed = ready[:limit]
            for r in claimed:
                r["lease_until"] = until
            return [row_to_command(r) for r in claimed]


@reg(STRICT)
class SubmitAllowsReuseOfAFinishedCommandId(InMemoryTaskStore):
    """duplicate check looks only at the pending-commands set; finished ones are archived."""

    def submit_command(self, command):
        check.check_command(command)
        with self._open():
            old = self._commands.get(command.command_id)
            if old is not None and old["finished_at"] is not None:
                del self._commands[command.command_id]
        super().submit_command(command)


@reg(AMBIG)
class SubmitDropsAPresetLeaseAndFinish(InMemoryTaskStore):
    """submit writes a fresh command: a lease_until/finished_at on the record is dropped."""

    def submit_command(self, command):
        check.check_command(command)
        super().submit_command(replace(command, lease_until=None, finished_at=None, outcome=None))


@reg(STRICT)
class SubmitNormalisesIssuedBy(InMemoryTaskStore):
    """issued_by is NFC-normalised on the way in."""

    def submit_command(self, command):
        check.check_command(command)
        if command.issued_by is not None:
            command = replace(command, issued_by=unicodedata.normalize("NFC", command.issued_by))
        super().submit_command(command)


@reg(STRICT)
class CompleteDoesNotCheckOutcome(InMemoryTaskStore):
    """outcome is not validated: an int or 5 KB outcome is accepted."""

    def complete_command(self, command_id, *, now, outcome=None):
        check.check_release(command_id, now)
        with self._open():
            row = self._command(command_id)
            if row["finished_at"] is None:
                row["finished_at"] = encode_dt(now)
                row["outcome"] = outcome


@reg(STRICT)
class CompleteFinishesBeforeCheckingOutcome(InMemoryTaskStore):
    """sets finished_at, then validates outcome: a refused complete still finishes."""

    def complete_command(self, command_id, *, now, outcome=None):
        check.check_release(command_id, now)
        with self._open():
            row = self._command(command_id)
            if row["finished_at"] is None:
                row["finished_at"] = encode_dt(now)
        check.check_complete(command_id, now, outcome)
        with self._open():
            row["outcome"] = outcome


@reg(STRICT)
class CompleteLooksUpBeforeCheckingNow(InMemoryTaskStore):
    """complete raises CommandNotFound for an unknown id before validating now."""

    def complete_command(self, command_id, *, now, outcome=None):
        check_identifier(command_id, "command_id")
        with self._open():
            self._command(command_id)
        super().complete_command(command_id, now=now, outcome=outcome)


@reg(STRICT)
class ReleaseLooksUpBeforeCheckingNow(InMemoryTaskStore):
    """release raises CommandNotFound for an unknown id before validating now."""

    def release_command(self, command_id, *, now):
        check_identifier(command_id, "command_id")
        with self._open():
            self._command(command_id)
        super().release_command(command_id, now=now)


@reg(STRICT)
class ReleaseSetsTheLeaseToNow(InMemoryTaskStore):
    """release 'expires the lease now' (lease_until = now) instead of clearing it."""

    def release_command(self, command_id, *, now):
        check.check_release(command_id, now)
        with self._open():
            row = self._command(command_id)
            if row["finished_at"] is None:
                row["lease_until"] = encode_dt(now)


@reg(STRICT)
class ReleaseClearsBeforeCheckingNow(InMemoryTaskStore):
    """release clears the lease, then validates now."""

    def release_command(self, command_id, *, now):
        check_identifier(command_id, "command_id")
        with self._open():
            row = self._command(command_id)
            if row["finished_at"] is None:
                row["lease_until"] = None
        check_dt(now, "now")


@reg(CONTROL)
class ClaimStrictlyAfterExpiry(InMemoryTaskStore):
    """control: lease_until < now instead of <=."""

    def claim_commands(self, *, now, lease_seconds, limit=50):
        return (
            super().claim_commands(
                now=now - timedelta(microseconds=1), lease_seconds=lease_seconds, limit=limit
            )
            if False
            else self._claim(now, lease_seconds, limit)
        )

    def _claim(self, now, lease_seconds, limit):
        until = encode_dt(check.check_claim(now, lease_seconds, limit))
        moment = encode_dt(now)
        with self._open():
            ready = [
                r
                for r in self._commands.values()
                if r["finished_at"] is None
                and (r["lease_until"] is None or r["lease_until"] < moment)
            ]
            ready.sort(key=lambda r: (r["created_at"], r["command_id"]))
            for r in ready[:limit]:
                r["lease_until"] = until
            return [row_to_command(r) for r in ready[:limit]]


# ======================================================================================
# prune / close / errors
# ======================================================================================


@reg(STRICT)
class PruneWithNothingTerminalSkipsArgumentChecks(InMemoryTaskStore):
    """prune returns 0 when no task is terminal, before validating keep_terminal."""

    def prune(self, *, keep_terminal):
        with self._open():
            any_terminal = any(TaskStatus(r["status"]).is_terminal for r in self._tasks.values())
        if not any_terminal:
            return 0
        return super().prune(keep_terminal=keep_terminal)


@reg(STRICT)
class PruneAcceptsIntegralFloat(InMemoryTaskStore):
    """keep_terminal=2.0 is accepted (int() after the bool check)."""

    def prune(self, *, keep_terminal):
        if type(keep_terminal) is float and keep_terminal.is_integer():
            keep_terminal = int(keep_terminal)
        return super().prune(keep_terminal=keep_terminal)


@reg(STRICT)
class PruneReturnsAFloat(InMemoryTaskStore):
    """prune returns the count as a float (a Lua/JSON number)."""

    def prune(self, *, keep_terminal):
        return float(super().prune(keep_terminal=keep_terminal))


@reg(STRICT)
class PruneLeavesTheLeaseTableBehind(InMemoryTaskStore):
    """leases live in their own table (save never writes them); prune forgets that table, so
    a re-created id inherits the old lease."""

    def __init__(self) -> None:
        super().__init__()
        self._orphans: dict[str, dict] = {}

    def prune(self, *, keep_terminal):
        with self._open():
            leases = {k: {c: r[c] for c in LEASE_COLUMNS} for k, r in self._tasks.items()}
        n = super().prune(keep_terminal=keep_terminal)
        for k, lease in leases.items():
            if k not in self._tasks and any(v is not None for v in lease.values()):
                self._orphans[k] = lease
        return n

    def create(self, snapshot):
        super().create(snapshot)
        lease = self._orphans.get(snapshot.task_id)
        if lease and snapshot.lease_owner is None and snapshot.lease_until is None:
            with self._open():
                self._tasks[snapshot.task_id].update(lease)


@reg(STRICT)
class PruneUsesAStaleTerminalIndex(InMemoryTaskStore):
    """a 'terminal' index gets SADD on every terminal write but no SREM when a save moves
    the task back to a live status: prune then drops a live task."""

    def __init__(self) -> None:
        super().__init__()
        self._terminal: set[str] = set()

    def create(self, snapshot):
        super().create(snapshot)
        if snapshot.status.is_terminal:
            self._terminal.add(snapshot.task_id)

    def save(self, snapshot, *, expect_version):
        super().save(snapshot, expect_version=expect_version)
        if snapshot.status.is_terminal:
            self._terminal.add(snapshot.task_id)

    def prune(self, *, keep_terminal):
        keep = check.check_keep_terminal(keep_terminal)
        with self._open():
            rows = [self._tasks[k] for k in self._terminal if k in self._tasks]
            rows.sort(key=lambda r: (r["created_at"], r["task_id"]))
            doomed = rows[: max(0, len(rows) - keep)]
            for r in doomed:
                del self._tasks[r["task_id"]]
                self._history.pop(r["task_id"], None)
                self._terminal.discard(r["task_id"])
            return len(doomed)


@reg(AMBIG)
class ClosedCheckBeforeArgumentChecks(InMemoryTaskStore):
    """after close(), get('') raises StoreClosed rather than ValueError."""

    def get(self, task_id):
        _closed(self)
        return super().get(task_id)


@reg(STRICT)
class OwnErrorMessages(InMemoryTaskStore):
    """refuses a bad task id with its own message instead of the shared one."""

    def get(self, task_id):
        try:
            check_identifier(task_id, "task_id")
        except ValueError:
            raise ValueError("invalid key") from None
        return super().get(task_id)


@reg(STRICT)
class CreateChecksExistenceBeforeEncoding(InMemoryTaskStore):
    """create looks the id up before encoding params: an oversized duplicate raises
    TaskAlreadyExists instead of ValueError."""

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        with self._open():
            if snapshot.task_id in self._tasks:
                raise TaskAlreadyExists(snapshot.task_id)
        super().create(snapshot)


@reg(STRICT)
class SubmitChecksExistenceBeforeEncoding(InMemoryTaskStore):
    """submit looks the id up before encoding the payload."""

    def submit_command(self, command):
        check.check_command(command)
        with self._open():
            if command.command_id in self._commands:
                raise CommandAlreadyExists(command.command_id)
        super().submit_command(command)


@reg(STRICT)
class GetUsesANegativeCacheBeforeTheClosedCheck(InMemoryTaskStore):
    """get answers None from a local 'known ids' set without touching the backend --
    also after close()."""

    def __init__(self) -> None:
        super().__init__()
        self._known: set[str] = set()

    def create(self, snapshot):
        super().create(snapshot)
        self._known.add(snapshot.task_id)

    def get(self, task_id):
        check_identifier(task_id, "task_id")
        if task_id not in self._known:
            return None
        return super().get(task_id)


@reg(STRICT)
class SaveTreatsVersionZeroAsMissing(InMemoryTaskStore):
    """`actual = stored_version or None`: a task at version 0 cannot be saved."""

    def save(self, snapshot, *, expect_version):
        check.check_save(snapshot, expect_version)
        with self._open():
            cur = self._tasks.get(snapshot.task_id)
            actual = None if cur is None else (cur["status_version"] or None)
            if actual != expect_version:
                raise ConcurrencyConflict(snapshot.task_id, expect_version, actual)
        super().save(snapshot, expect_version=expect_version)


@reg(STRICT)
class AttemptZeroBecomesOne(InMemoryTaskStore):
    """`attempt or 1` on the way in: attempt=0 reads back as 1."""

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        super().create(replace(snapshot, attempt=snapshot.attempt or 1))


@reg(STRICT)
class ProgressTotalZeroBecomesNone(InMemoryTaskStore):
    """`progress_total or None`: a total of 0 reads back as None (touch path)."""

    def touch(
        self, task_id, *, progress=None, heartbeat_at=None, lease_owner=None, lease_until=None
    ):
        if isinstance(progress, Progress) and progress.total is not None and not progress.total:
            progress = replace(progress, total=None)
        super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )


@reg(STRICT)
class EmptyParamsBecomeNone(InMemoryTaskStore):
    """`params or None`: params=[] / {} read back as None."""

    def create(self, snapshot):
        check.check_snapshot(snapshot)
        if snapshot.params is not None and not snapshot.params and snapshot.params != 0:
            snapshot = replace(snapshot, params=None)
        super().create(snapshot)


#: The contract test that pins the rule each store breaks.
CAUGHT_BY: dict[str, str] = {
    "AppendStoresEmptyReasonAsNone": "test_empty_and_zero_values_are_not_none",
    "AttemptColumnIsInt32": "test_the_largest_integers_round_trip",
    "AttemptZeroBecomesOne": "test_empty_and_zero_values_are_not_none",
    "ClaimComputesLeaseWithFloatTimestamps": "test_command_times_round_trip_across_the_documented_range",
    "ClaimOnEmptyStoreSkipsArgumentChecks": "test_bad_arguments_are_refused_whatever_the_store_holds",
    "ClaimStrictlyAfterExpiry": "test_a_reclaim_of_an_expired_command_is_leased_from_now",
    "ClaimTiesUseCaseInsensitiveCollation": "test_ties_are_broken_by_code_point_order",
    "ClosedCheckBeforeArgumentChecks": "test_bad_arguments_are_refused_before_the_closed_check",
    "CompleteDoesNotCheckOutcome": "test_complete_refuses_a_bad_outcome_and_leaves_the_command_open",
    "CompleteFinishesBeforeCheckingOutcome": "test_complete_refuses_a_bad_outcome_and_leaves_the_command_open",
    "CompleteLooksUpBeforeCheckingNow": "test_bad_arguments_are_refused_whatever_the_store_holds",
    "ConflictReportsActualAsText": "test_a_task_at_version_zero_can_be_saved",
    "CountsKeyedByValue": "test_counts_are_keyed_by_task_status",
    "CreateChecksExistenceBeforeEncoding": "test_a_bad_payload_is_refused_as_bad_input_even_for_an_existing_id",
    "CreateDoesNotWriteTheLease": "test_create_stores_the_lease_the_snapshot_carries",
    "EmptyParamsBecomeNone": "test_empty_and_zero_values_are_not_none",
    "EmptyTracebackBecomesNone": "test_empty_and_zero_values_are_not_none",
    "GetUsesANegativeCacheBeforeTheClosedCheck": "test_calls_that_need_no_data_still_raise_store_closed",
    "HistoryAcceptsFloatSinceVersion": "test_integer_arguments_are_exact_ints_in_the_documented_range",
    "HistoryHasNoUpperBoundOnSinceVersion": "test_integer_arguments_are_exact_ints_in_the_documented_range",
    "HistoryOfUnknownTaskSkipsArgumentChecks": "test_bad_arguments_are_refused_whatever_the_store_holds",
    "KeyColumnIsVarchar255": "test_every_identifier_field_round_trips_awkward_values",
    "LeaseOwnerColumnIsVarchar255": "test_every_identifier_field_round_trips_awkward_values",
    "OwnErrorMessages": "test_bad_arguments_are_refused_with_the_shared_messages",
    "PayloadLimitIsOffByOne": "test_a_payload_of_exactly_the_limit_is_accepted",
    "ProgressTotalZeroBecomesNone": "test_touch_writes_zero_and_empty_progress_values_as_given",
    "PruneAcceptsIntegralFloat": "test_integer_arguments_are_exact_ints_in_the_documented_range",
    "PruneLeavesTheLeaseTableBehind": "test_a_pruned_then_recreated_task_carries_nothing_of_the_old_one",
    "PruneReturnsAFloat": "test_prune_returns_an_int",
    "PruneUsesAStaleTerminalIndex": "test_prune_decides_by_the_current_status",
    "PruneWithNothingTerminalSkipsArgumentChecks": "test_bad_arguments_are_refused_whatever_the_store_holds",
    "QueryEmptySetShortCircuits": "test_calls_that_need_no_data_still_raise_store_closed",
    "QueryLimitIsInt32": "test_the_largest_integers_round_trip",
    "QueryLimitZeroShortCircuits": "test_calls_that_need_no_data_still_raise_store_closed",
    "QueryNewestFirstReversesOnlyTies": "test_limit_applies_after_every_filter",
    "QueryTiesUseCaseInsensitiveCollation": "test_ties_are_broken_by_code_point_order",
    "QueryTiesUseUtf16Order": "test_ties_are_broken_by_code_point_order",
    "RefusedCreateLeaksIntoTheTagIndex": "test_a_refused_create_or_save_leaves_every_index_as_it_was",
    "RejectedSaveLeaksIntoTheTagIndex": "test_a_refused_create_or_save_leaves_every_index_as_it_was",
    "ReleaseClearsBeforeCheckingNow": "test_a_refused_release_keeps_the_lease",
    "ReleaseLooksUpBeforeCheckingNow": "test_bad_arguments_are_refused_whatever_the_store_holds",
    "ReleaseSetsTheLeaseToNow": "test_a_released_command_is_claimable_by_a_claimer_whose_clock_is_behind",
    "SaveAcceptsIntegralFloatExpectVersion": "test_integer_arguments_are_exact_ints_in_the_documented_range",
    "SaveAcceptsOnlyPlusOne": "test_a_save_keeps_unchanged_index_entries_findable",
    "SaveComparesVersionsBeforeTheMonotonicCheck": "test_a_save_that_goes_back_is_a_value_error_whatever_is_stored",
    "SaveKeepsTheLaterHeartbeat": "test_save_writes_an_earlier_heartbeat_as_given",
    "SaveKeepsTheStoredCreatedAt": "test_save_replaces_created_at_and_the_order_follows",
    "SaveMovesTheCounterBeforeEncodingThePayload": "test_a_save_refused_for_its_payload_moves_no_counter_or_index",
    "SaveTreatsVersionZeroAsMissing": "test_a_task_at_version_zero_can_be_saved",
    "SubmitAllowsReuseOfAFinishedCommandId": "test_a_finished_command_id_cannot_be_submitted_again",
    "SubmitChecksExistenceBeforeEncoding": "test_a_bad_payload_is_refused_as_bad_input_even_for_an_existing_id",
    "SubmitDropsAPresetLeaseAndFinish": "test_submit_stores_a_command_as_given",
    "SubmitNormalisesIssuedBy": "test_every_identifier_field_round_trips_awkward_values",
    "TouchDoesNotTypeCheckProgress": "test_bad_arguments_are_refused_whatever_the_store_holds",
    "TouchHeartbeatNeverMovesBack": "test_touch_stores_an_earlier_heartbeat_and_a_shorter_lease_as_given",
    "TouchLeaseNeverShrinks": "test_touch_stores_an_earlier_heartbeat_and_a_shorter_lease_as_given",
    "TouchOfMissingTaskSkipsArgumentChecks": "test_bad_arguments_are_refused_whatever_the_store_holds",
    "TouchProgressNeverMovesBack": "test_a_given_progress_replaces_all_three_progress_fields",
    "TouchStoresEmptyProgressMessageAsNone": "test_touch_writes_zero_and_empty_progress_values_as_given",
    "TouchStringifiesLeaseOwner": "test_a_touch_refused_for_one_argument_writes_none_of_the_others",
    "TouchStripsLeaseOwner": "test_every_identifier_field_round_trips_awkward_values",
    "TouchWithNothingSkipsTheClosedCheck": "test_calls_that_need_no_data_still_raise_store_closed",
    "TouchWritesHeartbeatBeforeCheckingLeaseOwner": "test_a_touch_refused_for_one_argument_writes_none_of_the_others",
    "TouchWritesProgressBeforeCheckingHeartbeat": "test_a_touch_refused_for_one_argument_writes_none_of_the_others",
    "TracebackColumnIsMySqlText": "test_the_longest_texts_round_trip",
    "VersionColumnIsInt32": "test_the_largest_integers_round_trip",
}

REVIEW: dict[str, type[InMemoryTaskStore]] = {name: REGISTRY[name][0] for name in CAUGHT_BY}
