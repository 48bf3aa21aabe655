"""The change feed's pieces every store shares: cursor and limit checks, the page a store hands
back, the tombstone encoding of ``lua/lib/feed.lua``, and the in-memory feed.

A feed position is an integer from a persistent, monotonic, never-reused sequence: every write
that changes a task (create, save, the runtime's batched writes, prune) gives the task the next
position in the same atomic step; ``touch`` never does. A task is in the feed once, at its
latest position; a pruned task becomes a tombstone at a new position, kept forever.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime

from chongming_redis.errors import CorruptRecord, InvalidCursor
from chongming_redis.model import ChangePage, FeedStats, TaskSnapshot, Tombstone
from chongming_redis.stores.codec import decode_dt
from chongming_redis.validation import MAX_INT, check_int

MAX_PAGE = 256
_CANONICAL = re.compile(r"0|[1-9][0-9]{0,15}")  # fullmatch: "$" would let "1\n" through


def parse_cursor(after: object) -> int:
    """The position a cursor names. ``TypeError`` for a non-``str``; ``InvalidCursor`` for text
    that is not canonical decimal (``"007"``, ``"-1"``, ``"1e3"``, ``" 5"``, ``""``)."""
    if type(after) is not str:
        raise TypeError(f"after must be a str cursor, not {type(after).__name__}")
    if not _CANONICAL.fullmatch(after) or int(after) > MAX_INT:
        raise InvalidCursor(after, "not a canonical decimal position")
    return int(after)


def check_page_limit(limit: object) -> int:
    return check_int(limit, "limit", minimum=1, maximum=MAX_PAGE)


def ahead(after: int, head: int) -> InvalidCursor:
    return InvalidCursor(
        str(after),
        f"ahead of the feed's head ({head}): restored from an older backup, or another feed's",
    )


def page_of(items: list[TaskSnapshot | Tombstone], last: int | None, after: int) -> ChangePage:
    """A page; an empty one keeps the cursor it was asked with."""
    return ChangePage(tuple(items), str(after if last is None else last))


def decode_tombstone(value: bytes, key: str) -> Tombstone:
    """The tombstone a feed item holds (``value`` without the leading ``r``)."""
    try:
        removed_at, bucket, length, rest = value.split(b" ", 3)
        size = int(length)
        name, task_id = rest[:size].decode("utf-8"), rest[size:].decode("utf-8")
        return Tombstone(task_id, decode_dt(removed_at), name, int(bucket))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecord(key, None, f"tombstone does not decode: {exc}") from None


class MemoryFeed:
    """The feed of ``InMemoryTaskStore``: positions in a dict (the store's lock guards it)."""

    def __init__(self) -> None:
        self.head = 0
        self.tombstones = 0
        self._items: dict[int, str | Tombstone] = {}  # position -> task id, or a tombstone
        self._position: dict[str, int] = {}  # live task id -> its position

    def move(self, task_id: str) -> None:
        """The task was created or changed: give it the next position."""
        self._drop(task_id)
        self.head += 1
        self._items[self.head] = task_id
        self._position[task_id] = self.head

    def tombstone(self, task_id: str, name: str, bucket: int, removed_at: datetime) -> None:
        self._drop(task_id)
        self.head += 1
        self._items[self.head] = Tombstone(task_id, removed_at, name, bucket)
        self.tombstones += 1

    def page(self, after: int, limit: int, current: Callable[[str], TaskSnapshot]) -> ChangePage:
        if after > self.head:
            raise ahead(after, self.head)
        positions = sorted(p for p in self._items if p > after)[:limit]
        items: list[TaskSnapshot | Tombstone] = []
        for position in positions:
            item = self._items[position]
            items.append(current(item) if isinstance(item, str) else item)
        return page_of(items, positions[-1] if positions else None, after)

    def stats(self) -> FeedStats:
        return FeedStats(self.head, len(self._items), self.tombstones)

    def _drop(self, task_id: str) -> None:
        old = self._position.pop(task_id, None)
        if old is not None:
            del self._items[old]
