"""The driver's watch on the change feed during a stress run: what the retention and unique
checkers (``policy_checks``) need and the end of the run can no longer read.

A task removed by its retention takes its snapshot and its history with it; only a feed
tombstone (``removed_at``) stays. So while the run goes, :class:`FeedWatch` follows the feed
(``store.changes`` from its cursor, every ``interval`` seconds) and keeps, per task, the last
snapshot it saw, the server time by which it first saw the task final, the history of a
finished task whose retention is short (read when it is first seen final: the task may be gone
at the end) and the server time by which it first saw each tombstone. Every time it keeps is
the server's (``store.server_time()`` after the read): a state the feed showed held at or
before it, whatever the writers' clocks said.

A read that fails (Redis restarting) leaves the cursor where it was: the next read sees the
same changes, so nothing is skipped, only seen later (a looser, still true, bound).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from chongming_redis.errors import StoreError
from chongming_redis.model import TaskSnapshot, Tombstone, Transition
from chongming_redis.stress.stress_store import StressStore

log = logging.getLogger("chongming_redis.stress")

#: A finished task whose retention is shorter than this (seconds) has its history read when the
#: watch first sees it final (it may be removed before the end of the run).
SHORT_RETENTION = 3600.0
PAGE = 256


@dataclass
class Seen:
    """What the watch saw of one task."""

    last: TaskSnapshot
    #: the server time of the first read that showed it final (``None``: never seen final)
    final_by: float | None = None
    #: its history when first seen final, for a short retention (``None``: not read)
    history: list[Transition] | None = None


@dataclass
class FeedWatch:
    store: StressStore
    interval: float = 0.5
    tasks: dict[str, Seen] = field(default_factory=dict)
    #: task id -> the server time of the first read that showed its tombstone
    removed_by: dict[str, float] = field(default_factory=dict)
    cursor: str = "0"
    polls: int = 0
    failed_polls: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="feed-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following, after one last read (the workers are stopped by then)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.poll()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> bool:
        """Read the feed from the cursor to its head; False (nothing kept) when a read failed."""
        try:
            items, cursor = read_changes(self.store, self.cursor)
            now = self.store.server_time().timestamp()
        except StoreError as exc:
            self.failed_polls += 1
            log.info("feed watch: %s", exc)
            return False
        self.polls += 1
        self.cursor = cursor
        for item in items:
            if isinstance(item, Tombstone):
                self.removed_by.setdefault(item.task_id, now)
            else:
                self._saw(item, now)
        return True

    def _saw(self, snap: TaskSnapshot, now: float) -> None:
        seen = self.tasks.get(snap.task_id)
        if seen is None or snap.created_at != seen.last.created_at:  # a task new to the watch
            seen = self.tasks[snap.task_id] = Seen(snap)
        seen.last = snap
        if not snap.status.is_terminal or seen.final_by is not None:
            return
        seen.final_by = now
        if snap.retention is not None and snap.retention < SHORT_RETENTION:
            try:
                history = self.store.history(snap.task_id)
            except StoreError:
                return  # the end of the run reads it, if it is still there
            if history:  # empty: removed meanwhile
                seen.history = history


def read_changes(
    store: StressStore, after: str = "0"
) -> tuple[list[TaskSnapshot | Tombstone], str]:
    """Every feed item after ``after``, in feed order, and the cursor to read on from."""
    items: list[TaskSnapshot | Tombstone] = []
    while True:
        page = store.changes(after, PAGE)
        if not page.tasks:
            return items, after
        items.extend(page.tasks)
        after = page.next_cursor


def tombstones(store: StressStore) -> dict[str, Tombstone]:
    """Every tombstone of the feed (they stay forever), the latest per task id."""
    items, _ = read_changes(store)
    return {item.task_id: item for item in items if isinstance(item, Tombstone)}
