"""What ``RedisTaskStore`` last wrote or read of each task it is working on, so that a commit
sends only the columns that change.

A task hash at a given ``status_version`` with a given write token (``w``) holds exactly the
row of that one write: every write bumps the version and sets a new token, except ``touch``,
which changes only the heartbeat and progress columns (``ALWAYS_SENT``: they are always sent).
So when the store started or committed a task itself, it knows the stored row, and the next
commit of that task (expected version = that version) need only send the columns that differ,
with the token it expects (``commit_tasks.lua`` checks it; a different token — the task was
pruned and created again, or written by someone else — answers ``STALE`` and the item is sent
again in full). Half the arguments of a typical finishing commit, and no ``HDEL`` of the ten
columns a save clears that were never set.

Bounded: the rows of at most ``limit`` tasks (the ones a worker holds), oldest dropped first;
a task that reached a terminal status is forgotten.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

#: Columns ``touch`` may have changed without a new version: always written (or deleted).
ALWAYS_SENT = frozenset({"hb", "pc", "pt", "pm"})
#: Hash fields the scripts manage or ``save`` never writes: never part of a remembered row.
NOT_REMEMBERED = frozenset({"w", "fs", "lo", "lu"}) | ALWAYS_SENT


def wire(value: Any) -> bytes:
    """A hash value as Redis stores and returns it (what redis-py sends for a row value)."""
    return value if isinstance(value, bytes) else str(value).encode()


class WrittenRows:
    def __init__(self, limit: int = 8192) -> None:
        self.limit = limit
        self._rows: dict[str, tuple[int, str, dict[str, bytes]]] = {}
        self._lock = threading.Lock()

    def remember(self, task_id: str, version: int, token: str, fields: dict[str, bytes]) -> None:
        row = {f: v for f, v in fields.items() if f not in NOT_REMEMBERED}
        with self._lock:
            self._rows.pop(task_id, None)
            self._rows[task_id] = (version, token, row)
            while len(self._rows) > self.limit:
                del self._rows[next(iter(self._rows))]

    def remember_reply(self, task_id: str, fields: dict[bytes, bytes]) -> None:
        """A row as ``HGETALL`` returned it (a started task)."""
        version, token = fields.get(b"v"), fields.get(b"w")
        if version is None or token is None or not version.isdigit():
            return
        decoded = {f.decode("utf-8", "replace"): v for f, v in fields.items()}
        self.remember(task_id, int(version), token.decode("utf-8", "replace"), decoded)

    def base(self, task_id: str, version: int) -> tuple[str, dict[str, bytes]] | None:
        """``(token, row)`` if this store knows the row stored at ``version``."""
        with self._lock:
            found = self._rows.get(task_id)
        if found is None or found[0] != version:
            return None
        return found[1], found[2]

    def forget(self, task_id: str) -> None:
        with self._lock:
            self._rows.pop(task_id, None)


def delta(
    writes: Sequence[Any], deletes: Sequence[str], base: dict[str, bytes]
) -> tuple[list[Any], list[str]]:
    """The pairs of ``writes`` (flat ``[field, value, ...]``, a full row) whose value differs
    from ``base`` and the ``deletes`` of fields ``base`` has, plus every ``ALWAYS_SENT`` one."""
    sent: list[Any] = []
    for i in range(0, len(writes), 2):
        field, value = writes[i], writes[i + 1]
        if field in ALWAYS_SENT or base.get(field) != wire(value):
            sent += (field, value)
    return sent, [f for f in deletes if f in ALWAYS_SENT or f in base]


def full_row(writes: Sequence[Any]) -> dict[str, bytes]:
    """The row a full write leaves (its pairs; every other column deleted)."""
    return {writes[i]: wire(writes[i + 1]) for i in range(0, len(writes), 2)}
