"""The ``TaskStore`` protocol: the 14 methods a persistence backend implements.

Structural: a backend needs no base class and no registration; ``isinstance(obj, TaskStore)``
checks the method set. The semantics below are the contract; ``StoreContract``
(``chongming_redis.testing.store_contract``) checks them on one connection. Cross-process
atomicity is the backend's own burden to prove.

Every method refuses bad arguments with ``TypeError``/``ValueError`` before touching the backend
(whatever the store holds, and before it looks at whether it is closed; a call refused for one
argument writes none of the others), raises ``StoreClosed`` after ``close()`` (even a call that
needs no data), and reports backend failures as ``StoreError``. Results have the annotated types
(``counts()`` is keyed by ``TaskStatus``, ``prune`` returns an ``int``).

Identity is exact: ids (task, command, pipeline run), names and tags are case-sensitive, never
normalised and never matched as prefixes or patterns (``t1`` shares nothing with ``t10``).
Every datetime from 1970-01-01 to 2255-06-05 23:47:34.740991 UTC round-trips to the microsecond,
and every value comes back with its type (``1.0`` stays a ``float``, ``1`` an ``int``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

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


@runtime_checkable
class TaskStore(Protocol):
    # -- task snapshots (optimistic concurrency) -------------------------------------------

    def create(self, snapshot: TaskSnapshot) -> None:
        """Write a new task, every field as given (its lease included). If ``task_id`` exists,
        raise ``TaskAlreadyExists`` (a ``StoreError``) and change nothing — no field, index entry
        or counter: never overwrite."""
        ...

    def save(self, snapshot: TaskSnapshot, *, expect_version: int) -> None:
        """Replace the task atomically if, and only if, its stored ``status_version`` equals
        ``expect_version``; otherwise raise ``ConcurrencyConflict`` and change nothing.

        Versions may jump (only equality with ``expect_version`` is checked) but never go
        back: ``snapshot.status_version`` must be greater than ``expect_version``
        (``ValueError`` otherwise). Never writes ``lease_owner``/``lease_until`` (the stored
        lease is kept). Never retries a conflict. A missing task (never created, or pruned) is a
        conflict with ``actual=None`` and writes nothing.

        Every other column is replaced: a field that is ``None`` in the snapshot reads back as
        ``None``. The task stays findable by every filter whose field did not change."""
        ...

    def get(self, task_id: str) -> TaskSnapshot | None:
        """The task, or ``None`` if there is none (not an error)."""
        ...

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        """Tasks matching every filter of ``query`` (``None``: all tasks), ordered by
        ``created_at`` then ``task_id`` in code-point order (both reversed with ``newest_first``),
        at most ``limit``.
        Filtering happens in the backend, not by fetching everything.

        Only ``None`` means "no restriction": an empty ``statuses`` or ``buckets`` set matches
        nothing. ``limit`` applies after every filter. Results are what ``get`` returns at the
        time of the call, including what ``touch`` wrote (nothing is cached)."""
        ...

    def counts(self) -> dict[TaskStatus, int]:
        """``{status: number of tasks}`` for every ``TaskStatus`` (zeros included), without
        reading every task. Always equal to what ``query`` finds per status: a save that keeps
        the status, a refused write, ``touch`` and commands never move it; ``prune`` of several
        tasks of one status moves it by that many."""
        ...

    # -- audit history (append-only) --------------------------------------------------------

    def append(self, transition: Transition) -> None:
        """Add one history entry. Idempotent on ``(task_id, version)``: replaying an entry
        that is already there changes nothing (the first one written wins)."""
        ...

    def history(self, task_id: str, *, since_version: int = 0) -> list[Transition]:
        """The task's entries with ``version > since_version``, ascending by version. Entries
        are kept per exact ``task_id``."""
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
        Heartbeat and lease are stored exactly as given, never derived from each other.

        A given ``Progress`` replaces all three progress fields (``Progress(2)`` clears the total
        and the message). A terminal task is touched like any other. A touch of a missing task
        leaves nothing behind: a later ``create`` of that id succeeds as if it never happened."""
        ...

    # -- control commands (cross-process) --------------------------------------------------

    def submit_command(self, command: Command) -> None:
        """Store a command for the holder of its task to claim. The store never interprets
        it: a command for an unknown or finished task is stored like any other, and every field
        is stored as given (a ``lease_until``, ``finished_at`` or ``outcome`` it already carries
        included). An existing ``command_id``, finished or not, raises
        ``CommandAlreadyExists``."""
        ...

    def claim_commands(
        self, *, now: datetime, lease_seconds: float, limit: int = 50
    ) -> list[Command]:
        """Atomically pick up to ``limit`` unfinished commands that have no lease or an
        expired one (``lease_until <= now``), oldest ``created_at`` first, and lease them until
        ``now + lease_seconds``. Returns them with ``lease_until`` set. Two claimers never get
        the same command while its lease is valid.

        Order is by ``created_at`` to the microsecond, ties by ``command_id`` in code-point
        order. Finished and validly leased commands never take a place among the ``limit``
        (however many there are). A
        re-claimed command is leased from ``now``, like any other. ``lease_seconds`` is a positive
        finite number from one microsecond to 7 days (604,800 s): a shorter or longer lease raises
        ``ValueError`` (never rounded to nothing, never clamped). ``limit`` is 1..1,000."""
        ...

    def complete_command(
        self, command_id: str, *, now: datetime, outcome: str | None = None
    ) -> None:
        """Mark the command finished at ``now`` with ``outcome``; it is never claimed again.
        Completing a finished command changes nothing (the first outcome stays). A command can be
        completed whether it is leased, its lease expired, or it was never claimed. No other
        command (of the same task or not) changes. An unknown id raises ``CommandNotFound``."""
        ...

    def release_command(self, command_id: str, *, now: datetime) -> None:
        """Hand a claimed command back: clear its lease without finishing it, so the true
        holder can claim it at once. A finished or unleased command is left as it is. The
        command keeps its ``created_at``, so its place in the claim order; no other command (of
        the same task or not) changes. An unknown id raises ``CommandNotFound``."""
        ...

    # -- operations ------------------------------------------------------------------------

    def prune(self, *, keep_terminal: int) -> int:
        """Drop the oldest terminal tasks (by ``created_at``, ties by ``task_id``) beyond the
        newest ``keep_terminal``, each with its history and index entries; never a live task.
        Returns how many. A dropped id is gone entirely: ``get`` returns ``None``, ``save`` is a
        conflict, and a later ``create`` of it starts a new task whose history is empty and
        accepts every version again."""
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


@runtime_checkable
class ChangeFeed(Protocol):
    """The change feed (optional beside ``TaskStore``; both built-in stores have it): how
    everything outside the workers follows the store without missing a change or a removal.
    ``FeedContract`` (``chongming_redis.testing.feed_contract``) checks it."""

    def changes(self, after: str = "0", limit: int = 256) -> ChangePage:
        """Up to ``limit`` items after the position ``after``: each task at most once, at its
        latest position, holding its current state, or a ``Tombstone`` for a pruned one.

        Every ``create`` and ``save`` (and every batched write the runtime uses) gives the task
        the next position of a persistent, monotonic, never-reused sequence in the same atomic
        step as the write; ``touch`` and refused writes never do. A task changed while a reader
        pages reappears at a later position, so a reader never skips one. ``prune`` leaves a
        tombstone at its own new position, kept forever (cursors never expire); a task created
        again with a pruned id is a new item after it.

        ``next_cursor`` is the position of the last item returned; an empty page means caught
        up and returns ``after`` itself. There is no "has more": read until an empty page.
        ``limit`` is 1..256 (``ValueError``). ``InvalidCursor`` for an ``after`` that is not
        canonical decimal, or that is ahead of the last position issued (a restore from an
        older backup): never a silent reset, never a fake empty page."""
        ...

    def feed_stats(self) -> FeedStats:
        """The last position issued, the feed's size (live tasks + tombstones) and the
        tombstones kept — the cost of cursors that never expire."""
        ...
