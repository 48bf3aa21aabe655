"""The ``TaskStore`` protocol: the 14 methods a persistence backend implements.

Structural: a backend needs no base class and no registration; ``isinstance(obj, TaskStore)``
checks the method set. The semantics below are the contract; ``StoreContract``
(``chongming_redis.testing.store_contract``) checks them on one connection. Cross-process
atomicity is the backend's own burden to prove.

Every method refuses bad arguments with ``TypeError``/``ValueError`` before touching the backend,
raises ``StoreClosed`` after ``close()``, and reports backend failures as ``StoreError``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from chongming_redis.model import (
    Command,
    Progress,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)


@runtime_checkable
class TaskStore(Protocol):
    # -- task snapshots (optimistic concurrency) -------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        """Write a new task. If ``task_id`` exists, raise ``TaskAlreadyExists`` (a
        ``StoreError``) and change nothing: never overwrite."""
        ...

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        """Replace the task atomically if, and only if, its stored ``status_version`` equals
        ``expect_version``; otherwise raise ``ConcurrencyConflict`` and change nothing.

        Versions may jump (only equality with ``expect_version`` is checked) but never go
        back: ``snapshot.status_version`` must be greater than ``expect_version``
        (``ValueError`` otherwise). Never writes ``lease_owner``/``lease_until`` (the stored
        lease is kept). Never retries a conflict. A missing task is a conflict with
        ``actual=None``."""
        ...

    def get(self, task_id: str) -> TaskSnapshot | None:
        """The task, or ``None`` if there is none (not an error)."""
        ...

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        """Tasks matching every filter of ``query`` (``None``: all tasks), ordered by
        ``created_at`` then ``task_id`` (descending with ``newest_first``), at most ``limit``.
        Filtering happens in the backend, not by fetching everything."""
        ...

    def counts(self) -> dict[TaskStatus, int]:
        """``{status: number of tasks}`` for every ``TaskStatus`` (zeros included), without
        reading every task."""
        ...

    # -- audit history (append-only) --------------------------------------------------------

    def append(self, transition: Transition) -> None:
        """Add one history entry. Idempotent on ``(task_id, version)``: replaying an entry
        that is already there changes nothing (the first one written wins)."""
        ...

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        """The task's entries with ``version > since_version``, ascending by version."""
        ...

    # -- high-frequency side path (never touches the version) ------------------------------

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> None:
        """Write only the given fields (each optional on its own). Never checks or bumps
        ``status_version``. A missing task is silently ignored; all ``None`` does nothing.
        Heartbeat and lease are stored exactly as given, never derived from each other."""
        ...

    # -- control commands (cross-process) --------------------------------------------------

    def submit_command(self, command: Command) -> None:
        """Store a command for the holder of its task to claim. The store never interprets
        it. An existing ``command_id`` raises ``CommandAlreadyExists``."""
        ...

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        """Atomically pick up to ``limit`` unfinished commands that have no lease or an
        expired one (``lease_until <= now``), oldest ``created_at`` first, and lease them until
        ``now + lease_seconds``. Returns them with ``lease_until`` set. Two claimers never get
        the same command while its lease is valid."""
        ...

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        """Mark the command finished at ``now`` with ``outcome``; it is never claimed again.
        Completing a finished command changes nothing (the first outcome stays). An unknown
        id raises ``CommandNotFound``."""
        ...

    def release_command(self, command_id: str, *, now: datetime) -> None:
        """Hand a claimed command back: clear its lease without finishing it, so the true
        holder can claim it at once. A finished or unleased command is left as it is. An
        unknown id raises ``CommandNotFound``."""
        ...

    # -- operations ------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        """Drop the oldest terminal tasks (by ``created_at``) beyond the newest
        ``keep_terminal``, each with its history; never a live task. Returns how many."""
        ...

    def close(self) -> None:
        """Release connections and handles. Idempotent; every later call raises
        ``StoreClosed`` (a ``StoreError``)."""
        ...


PROTOCOL_METHODS: tuple[str, ...] = (
    "create",
    "save",
    "get",
    "query",
    "counts",
    "append",
    "history",
    "touch",
    "submit_command",
    "claim_commands",
    "complete_command",
    "release_command",
    "prune",
    "close",
)
