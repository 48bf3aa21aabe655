"""``InMemoryTaskStore``: the reference implementation of ``TaskStore`` and of the extensions
the runtime uses on every store that has them (``stores/extensions.py``): batched commits and
starts, the fenced touch, a clock and per-bucket counts (not the Redis-only pool and nudges);
its read-side extensions (keyset paging, per-bucket counts, what a dashboard reads of the
commands) are ``MemoryReads`` (``stores/_memory_reads.py``).

One lock plays the role a Lua script plays on Redis: every method is one critical section, so
"check, then write" is atomic. Records are kept as codec rows, not as the caller's objects, so a
caller mutating its ``params`` dict after ``create`` cannot change the stored task, and every
value that would not survive a real backend (oversized or unserialisable payloads) is refused
here too. Single process only.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from datetime import datetime, timezone
from typing import Any

from chongming_redis.errors import (
    CommandAlreadyExists,
    CommandNotFound,
    ConcurrencyConflict,
    StoreClosed,
    TaskAlreadyExists,
)
from chongming_redis.model import (
    ChangePage,
    Command,
    FeedStats,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores import _checks as check
from chongming_redis.stores._feed import MemoryFeed, check_page_limit, parse_cursor
from chongming_redis.stores._memory_batching import KEPT_ON_SAVE
from chongming_redis.stores._memory_commit_start import MemoryCommitStart
from chongming_redis.stores._memory_dependencies import MemoryDependencies
from chongming_redis.stores._memory_limits import MemoryLimits
from chongming_redis.stores._memory_policies import MemoryPolicies
from chongming_redis.stores._memory_reads import MemoryReads
from chongming_redis.stores._memory_schedules import MemorySchedules
from chongming_redis.stores._memory_task_schemas import MemoryTaskSchemas
from chongming_redis.stores.codec import (
    Row,
    command_to_row,
    encode_dt,
    row_to_command,
    row_to_snapshot,
    row_to_transition,
    snapshot_to_row,
    touch_columns,
    transition_to_row,
)
from chongming_redis.validation import check_identifier, check_int


class InMemoryTaskStore(
    MemoryReads, MemoryPolicies, MemoryLimits, MemorySchedules, MemoryDependencies,
    MemoryTaskSchemas, MemoryCommitStart,
):  # fmt: skip
    """A ``TaskStore`` in a dict, for tests, examples and single-process use."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entrant: commit_and_start holds it across two calls
        self._closed = False
        self._tasks: dict[str, Row] = {}
        self._history: dict[str, dict[int, Row]] = {}
        self._commands: dict[str, Row] = {}
        self._task_commands: dict[str, dict[str, None]] = {}
        self._types: set[str] = set()
        self._feed = MemoryFeed()
        self._init_limits()
        self._init_schedules()
        self._init_dependencies()
        self._init_task_schemas()

    # -- task snapshots --------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        row = snapshot_to_row(check.check_snapshot(snapshot))
        with self._open():
            if snapshot.task_id in self._tasks:
                raise TaskAlreadyExists(snapshot.task_id)
            if (taken := self._unique_error(row, None)) is not None:
                raise taken
            if (refused := self._dependency_error(row, None)) is not None:
                raise refused
            self._tasks[snapshot.task_id] = row
            self._feed.move(snapshot.task_id)
            self._dependencies_written(snapshot.task_id, None)

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        row = snapshot_to_row(check.check_save(snapshot, expect_version))
        with self._open():
            current = self._tasks.get(snapshot.task_id)
            actual = None if current is None else current["status_version"]
            if actual != expect_version:
                raise ConcurrencyConflict(snapshot.task_id, expect_version, actual)  # type: ignore[arg-type]
            assert current is not None
            if (taken := self._unique_error(row, current)) is not None:
                raise taken
            if (refused := self._dependency_error(row, current)) is not None:
                raise refused
            for column in KEPT_ON_SAVE:  # the lease (what touch wrote) and the parents stay
                row[column] = current[column]
            self._tasks[snapshot.task_id] = row
            self._feed.move(snapshot.task_id)
            self._dependencies_written(snapshot.task_id, current)

    def get(self, task_id: str) -> TaskSnapshot | None:
        check_identifier(task_id, "task_id")
        with self._open():
            row = self._tasks.get(task_id)
            return None if row is None else row_to_snapshot(row)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return self._selected(check.check_query(query), None)

    def counts(self) -> dict[TaskStatus, int]:
        with self._open():
            result = dict.fromkeys(TaskStatus, 0)
            for row in self._tasks.values():
                result[TaskStatus(row["status"])] += 1
            return result

    # -- audit history ---------------------------------------------------------------------

    def append(self, transition: Transition) -> None:
        row = transition_to_row(check.check_transition(transition))
        with self._open():
            entries = self._history.setdefault(transition.task_id, {})
            entries.setdefault(transition.version, row)  # first write wins: idempotent

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        check_identifier(task_id, "task_id")
        check_int(since_version, "since_version")
        with self._open():
            entries = self._history.get(task_id, {})
            rows = [entries[v] for v in sorted(entries) if v > since_version]
        return [row_to_transition(row) for row in rows]

    # -- high-frequency side path ----------------------------------------------------------

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        self._touch(task_id, None, progress, heartbeat_at, lease_owner, lease_until)

    def touch_fenced(
        self,
        task_id: str,
        *,
        expect_version: int,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        """``touch`` that applies only while ``status_version == expect_version``; returns
        whether it applied (see ``RedisTaskStore.touch_fenced``)."""
        check_int(expect_version, "expect_version")
        return self._touch(
            task_id, expect_version, progress, heartbeat_at, lease_owner, lease_until
        )

    def _touch(
        self,
        task_id: str,
        fence: int | None,
        progress: Progress | None,
        heartbeat_at: datetime | None,
        lease_owner: str | None,
        lease_until: datetime | None,
    ) -> bool:
        check.check_touch(task_id, progress, heartbeat_at, lease_owner, lease_until)
        changes = touch_columns(progress, heartbeat_at, lease_owner, lease_until)
        with self._open():
            row = self._tasks.get(task_id)
            if row is None:  # a late heartbeat for a vanished task is not an error
                return False
            if fence is not None and row["status_version"] != fence:
                return False
            row.update(changes)
            return True

    # -- runtime extensions: batched commits and starts: MemoryBatching ------------------

    def server_time(self) -> datetime:
        """This process's clock: an in-memory store has no other."""
        with self._open():
            return datetime.now(timezone.utc)

    # -- control commands ------------------------------------------------------------------

    def submit_command(self, command: Command) -> None:
        row = command_to_row(check.check_command(command))
        with self._open():
            if command.command_id in self._commands:
                raise CommandAlreadyExists(command.command_id)
            self._commands[command.command_id] = row
            self._task_commands.setdefault(command.task_id, {})[command.command_id] = None

    def record_task_types(self, names: Collection[str]) -> None:
        """``TaskTypesStore``: add the names to the recorded set."""
        checked = check.check_task_type_names(names)
        with self._open():
            self._types |= checked

    def task_types(self) -> frozenset[str]:
        with self._open():
            return frozenset(self._types)

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        until = encode_dt(check.check_claim(now, lease_seconds, limit))
        moment = encode_dt(now)
        with self._open():
            ready = [
                row
                for row in self._commands.values()
                if row["finished_at"] is None
                and (row["lease_until"] is None or row["lease_until"] <= moment)  # type: ignore[operator]
            ]
            ready.sort(key=lambda r: (r["created_at"], r["command_id"]))
            claimed = ready[:limit]
            for row in claimed:
                row["lease_until"] = until
            return [row_to_command(row) for row in claimed]

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        check.check_complete(command_id, now, outcome)
        finished_at = encode_dt(now)
        with self._open():
            row = self._command(command_id)
            if row["finished_at"] is None:  # completing twice keeps the first outcome
                row["finished_at"] = finished_at
                row["outcome"] = outcome

    def release_command(self, command_id: str, *, now: datetime) -> None:
        check.check_release(command_id, now)
        with self._open():
            row = self._command(command_id)
            if row["finished_at"] is None:  # a finished command stays finished
                row["lease_until"] = None

    # -- operations ------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        keep = check.check_keep_terminal(keep_terminal)
        with self._open():
            terminal = [
                row
                for task_id, row in self._tasks.items()
                if TaskStatus(row["status"]).is_terminal and not self._pinned(task_id)
            ]  # a finished parent an unfinished child depends on is kept
            terminal.sort(key=lambda r: (r["created_at"], r["task_id"]))
            doomed = terminal[: max(0, len(terminal) - keep)]
            removed_at = datetime.now(timezone.utc)
            for row in doomed:
                self._remove(str(row["task_id"]), removed_at)
            return len(doomed)

    # -- the change feed -------------------------------------------------------------------

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        """One page of the change feed (see ``ChangeFeed.changes``)."""
        position, size = parse_cursor(after), check_page_limit(limit)
        with self._open():
            return self._feed.page(position, size, lambda i: row_to_snapshot(self._tasks[i]))

    def feed_stats(self) -> FeedStats:
        with self._open():
            return self._feed.stats()

    def close(self) -> None:
        with self._lock:
            self._closed = True

    # -- internals -------------------------------------------------------------------------

    def _open(self) -> _Guard:
        return _Guard(self)

    def _command(self, command_id: str) -> Row:
        row = self._commands.get(command_id)
        if row is None:
            raise CommandNotFound(command_id)
        return row


class _Guard:
    """Takes the store's lock and refuses to proceed once the store is closed."""

    def __init__(self, store: InMemoryTaskStore) -> None:
        self._store = store

    def __enter__(self) -> None:
        self._store._lock.acquire()
        if self._store._closed:
            self._store._lock.release()
            raise StoreClosed()

    def __exit__(self, *exc: Any) -> None:
        self._store._lock.release()
