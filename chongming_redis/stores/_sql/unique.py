"""Unique ids in SQL, for every SQL store: who holds one (``TaskPoliciesStore.unique_holder``)
and the refusal a write meets when another task holds it.

The database keeps the invariant itself: ``tasks_unique`` is a unique index on ``unique_id``
over the unfinished rows only, so a second unfinished holder cannot be written, a task lets its
id go by the very write that makes it final, and a removed task takes its id with it. What is
left here is reading the holder back, on that index (its predicate repeated verbatim:
``schema.held_unique``), to name it in ``UniqueTaken``.
"""

from __future__ import annotations

from collections.abc import Collection

from chongming_redis.errors import StoreError, UniqueTaken
from chongming_redis.stores._sql.rows import text
from chongming_redis.stores._sql.schema import MAX_IN_LIST, Tx, held_unique


def holder(tx: Tx, unique: str) -> str | None:
    """The unfinished task that holds ``unique``, or ``None``."""
    found = tx.rows(
        f"SELECT task_id FROM tasks WHERE unique_id = ? AND {held_unique(tx.dialect)}", [unique]
    )
    return text(found[0][0]) if found else None


def holders(tx: Tx, uniques: Collection[str]) -> dict[str, str]:
    """``{unique: holder}`` for those of ``uniques`` an unfinished task holds (one statement
    per ``MAX_IN_LIST`` of them: old SQLite builds allow 999 parameters)."""
    wanted = sorted(set(uniques))
    found: dict[str, str] = {}
    for start in range(0, len(wanted), MAX_IN_LIST):
        condition, params = tx.dialect.member_of("unique_id", wanted[start : start + MAX_IN_LIST])
        for unique, task_id in tx.rows(
            f"SELECT unique_id, task_id FROM tasks WHERE {condition} AND {held_unique(tx.dialect)}",
            params,
        ):
            found[text(unique)] = text(task_id)
    return found


def taken(tx: Tx, unique: str, known: str | None = None) -> UniqueTaken:
    """The refusal of a write that would have given ``unique`` a second holder: ``known``, or
    the holder read now (in the refused write's transaction, so it is the one that refused)."""
    who = known if known is not None else holder(tx, unique)
    if who is None:
        # Only a unique index can have refused the row, and only tasks_unique involves a
        # column the caller chose (feed positions come from the locked head): never expected.
        raise StoreError(f"a task row with unique id {unique!r} was refused, but no task holds it")
    return UniqueTaken(unique, who)
