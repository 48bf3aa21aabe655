"""The change feed in SQL (``ChangeFeed`` in ``stores/protocol.py``), for every SQL store.

Positions come from ``meta.feed_head``, read once per write transaction (with the dialect's
``FOR UPDATE``: the head row is the feed's lock, so positions are issued in commit order and a
reader never sees position ``n + 1`` before ``n``) and written back once, with the writes that
used them. A live task holds its latest position in ``tasks.feed_position`` (unique); a pruned
task leaves a row in ``tombstones`` at a new position, forever. A refused write issues nothing:
``FeedPositions.next`` only proposes a position, ``used`` takes it.
"""

from __future__ import annotations

from datetime import datetime

from chongming_redis.errors import CorruptRecord
from chongming_redis.model import ChangePage, FeedStats, TaskSnapshot, Tombstone
from chongming_redis.stores._feed import ahead, page_of
from chongming_redis.stores._sql.rows import TASK_SELECT, decode_task, integer, text
from chongming_redis.stores._sql.schema import Tx
from chongming_redis.stores.codec import decode_dt, encode_dt

HEAD = "feed_head"


def read_head(tx: Tx, *, lock: bool = False) -> int:
    """The last position issued (``lock``: and hold the head row until the transaction ends)."""
    suffix = tx.dialect.for_update if lock else ""
    found = tx.rows(f"SELECT value FROM meta WHERE name = ?{suffix}", [HEAD])
    return 0 if not found else integer(found[0][0], "meta/" + HEAD, "value")


class FeedPositions:
    """The positions one write transaction issues, in order."""

    def __init__(self, tx: Tx) -> None:
        self._tx = tx
        self._head: int | None = None
        self.issued = 0
        #: A task became ``PENDING`` (created, or saved from another status): the store wakes
        #: idle workers in this transaction (``SqlTaskStore._nudge_work``).
        self.made_work = False

    def lock(self) -> None:
        """Take the head row now. A write that locks task rows before it issues a position
        (``start``, ``prune``) calls this first, so every writer takes the head before any task
        row: with row locks (PostgreSQL) two writers could otherwise wait for each other (a
        start holding a task row and waiting for the head, a save holding the head and waiting
        for that row)."""
        if self._head is None:
            self._head = read_head(self._tx, lock=True)

    def next(self) -> int:
        """The position the next successful write takes (call ``used`` once it succeeded)."""
        self.lock()
        assert self._head is not None
        return self._head + self.issued + 1

    def used(self) -> None:
        self.issued += 1

    def flush(self) -> None:
        """Write the new head, if anything was issued (call before the transaction commits)."""
        if self.issued and self._head is not None:
            self._tx.run(
                "UPDATE meta SET value = ? WHERE name = ?", [self._head + self.issued, HEAD]
            )

    def tombstone(self, task_id: str, name: str, bucket: int, removed_at: datetime) -> None:
        self._tx.run(
            "INSERT INTO tombstones (position, task_id, name, bucket, removed_at)"
            " VALUES (?, ?, ?, ?, ?)",
            [self.next(), task_id, name, bucket, encode_dt(removed_at)],
        )
        self.used()


def page(tx: Tx, after: int, limit: int) -> ChangePage:
    """Up to ``limit`` items after ``after``: live tasks at their positions and tombstones,
    merged by position (run in one read transaction, so head and items agree)."""
    head = read_head(tx)
    if after > head:
        raise ahead(after, head)
    tasks = tx.rows(
        f"SELECT feed_position, {TASK_SELECT} FROM tasks WHERE feed_position > ?"
        " ORDER BY feed_position LIMIT ?",
        [after, limit],
    )
    graves = tx.rows(
        "SELECT position, task_id, name, bucket, removed_at FROM tombstones WHERE position > ?"
        " ORDER BY position LIMIT ?",
        [after, limit],
    )
    found: list[tuple[int, TaskSnapshot | Tombstone]] = [
        (integer(row[0], "tasks/" + text(row[1]), "feed_position"), decode_task(row[1:]))
        for row in tasks
    ]
    found.extend((integer(row[0], "tombstones", "position"), _tombstone(row)) for row in graves)
    found.sort(key=lambda item: item[0])
    chosen = found[:limit]
    return page_of([item for _, item in chosen], chosen[-1][0] if chosen else None, after)


def _tombstone(row: tuple[object, ...]) -> Tombstone:
    key = f"tombstones/{row[0]}"
    try:
        bucket = integer(row[3], key, "bucket")
        return Tombstone(text(row[1]), decode_dt(integer(row[4], key, "removed_at")),
                         text(row[2]), bucket)  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise CorruptRecord(key, None, f"tombstone does not decode: {exc}") from None


def stats(tx: Tx) -> FeedStats:
    """The head, the feed's size (live tasks + tombstones) and the tombstones kept."""
    head = read_head(tx)
    ((tasks,),) = tx.rows("SELECT COUNT(*) FROM tasks")
    ((graves,),) = tx.rows("SELECT COUNT(*) FROM tombstones")
    return FeedStats(head, int(tasks) + int(graves), int(graves))
