"""The limits (``LimitsStore`` in ``stores/extensions.py``) in SQL, for every SQL store: the
recorded definitions, the holders and waiters kept with the task rows, and the usage; the
admission of ``start_tasks`` is ``_sql/limit_gate.py`` (``Gate``, and the parked tasks). The
in-memory reference (``stores/_memory_limits.py``) is the
behaviour; the tables are ``schema._v4``'s.

* **holders**: ``limit_holders`` has one row per ref of each task ``RUNNING``/``PAUSED``,
  written by the statement group that writes the task row (``sync`` after a create, a save, a
  commit item; ``took`` after a start's tasks; ``forget`` with a removal), so every way out of those
  statuses frees the slot in its own transaction and a count is bounded by the holders.
* **waiters**: a task a start refuses waits under each ref that refused it
  (``limit_waiters``), and the ref's *line* is blocked (``limit_lines``). Each start first
  judges every line in one statement (blocked while the ref has no room) and its walk leaves
  out the tasks waiting in a blocked line (``NOT EXISTS``). That is exact: a start only takes
  slots and tokens, so a ref full when the call begins refuses all its tasks to the end of the
  call, as the reference's walk would; the tasks of a line with room are walked in start order
  with every other task (first come, first served), and a ref that fills during the walk is
  blocked at once, so the next page leaves its backlog out; a concurrency ref's refused tasks
  are moreover parked, out of the start index (``_sql/limit_gate.py``): a flooded ref costs a
  start nothing of its backlog. A waiter stays one (for ``limit_usage``) until it starts or
  leaves ``PENDING``.
* **serialization**: every write of a task row takes the feed head row first
  (``FeedPositions.lock``; PostgreSQL ``FOR UPDATE``, SQLite's write lock), and every statement
  here runs after it: two starts (on any connection) never judge the same holders or tokens,
  so ``max`` is never exceeded by a race (READ COMMITTED: each statement after the lock sees
  what the previous holder of the lock committed).
* **rate clock**: the earlier of the caller's ``now`` and the database's clock
  (``Dialect.clock_us``), never counted back (``limits.refill`` and ``_tokens``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from chongming_redis.errors import CorruptRecord
from chongming_redis.limits import (
    Limit,
    LimitConflict,
    LimitUsage,
    RateLimit,
    from_json,
    ref_limit_id,
)
from chongming_redis.model import TaskStatus
from chongming_redis.stores import _checks as check
from chongming_redis.stores._sql.rows import text
from chongming_redis.stores._sql.schema import MAX_IN_LIST, Tx
from chongming_redis.stores.codec import Row

_PENDING = TaskStatus.PENDING.value
_HOLDING = frozenset({TaskStatus.RUNNING.value, TaskStatus.PAUSED.value})
_UNLIMITED = 1 << 30  # the room of a ref no recorded limit names


class SqlLimits:
    """The ``LimitsStore`` methods, mixed into ``SqlTaskStore`` (the admission itself is in
    ``start_tasks``: ``tasks.start`` and ``Gate``)."""

    if TYPE_CHECKING:  # provided by SqlTaskStore

        def _writing(self) -> AbstractContextManager[tuple[Tx, Any]]: ...

        def _reading(self) -> AbstractContextManager[Tx]: ...

    def record_limits(
        self,
        definitions: Mapping[str, str],
        task_limits: Mapping[str, Sequence[str]],
        *,
        replace: bool = False,
    ) -> None:
        """Record each limit's definition and each task type's limit ids in one transaction:
        all or nothing (``LimitConflict`` rolls it back), see ``LimitsStore``."""
        checked, types = check.check_record_limits(definitions, task_limits)
        with self._writing() as (tx, _):
            record(tx, checked, types, replace)

    def limit_definitions(self) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
        """``(limit id -> definition JSON, task type -> its limit ids)`` as recorded."""
        with self._reading() as tx:
            return definitions(tx)

    def limit_usage(self, *, limit: int = 1000) -> list[LimitUsage]:
        """The refs with a holder or a waiter, busiest first (``LimitsStore``)."""
        size = check.check_usage_limit(limit)
        with self._reading() as tx:
            return usage(tx, size)


def refs_of(row: Row) -> tuple[str, ...]:
    """A task row's refs (the codec wrote ``limit_refs`` as a JSON list, NULL for none)."""
    value = row.get("limit_refs")
    return () if value is None else _refs(text(value))


@lru_cache(maxsize=4096)
def _refs(value: str) -> tuple[str, ...]:
    return tuple(json.loads(value))  # many tasks share refs: each text parsed once


# -- definitions -------------------------------------------------------------------------------


def record(
    tx: Tx, checked: Mapping[str, str], types: Mapping[str, tuple[str, ...]], replace: bool
) -> None:
    """Write the (checked) definitions and types; ``LimitConflict`` (the caller's transaction
    rolls back: nothing written) when a recorded id has another definition, unless
    ``replace``. A concurrent first record of one id waits on its key, then compares."""
    action = "UPDATE SET definition = excluded.definition" if replace else "NOTHING"
    for limit_id, definition in checked.items():
        tx.run(
            "INSERT INTO limit_defs (limit_id, definition) VALUES (?, ?)"
            f" ON CONFLICT (limit_id) DO {action}",
            [limit_id, definition],
        )
        if not replace:
            ((recorded,),) = tx.rows(
                "SELECT definition FROM limit_defs WHERE limit_id = ?", [limit_id]
            )
            if text(recorded) != definition:
                raise LimitConflict(limit_id, text(recorded), definition)
    for name, ids in types.items():
        tx.run(
            "INSERT INTO limit_types (name, limit_ids) VALUES (?, ?)"
            " ON CONFLICT (name) DO UPDATE SET limit_ids = excluded.limit_ids",
            [name, json.dumps(list(ids))],
        )


def definitions(tx: Tx) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    defs = {text(i): text(d) for i, d in tx.rows("SELECT limit_id, definition FROM limit_defs")}
    types: dict[str, tuple[str, ...]] = {}
    for name, ids in tx.rows("SELECT name, limit_ids FROM limit_types"):
        try:
            types[text(name)] = tuple(str(i) for i in json.loads(text(ids)))
        except ValueError:
            raise CorruptRecord("limit_types/" + text(name), "limit_ids", "not JSON") from None
    return defs, types


@lru_cache(maxsize=1024)
def _parsed(definition: str) -> Limit:
    return from_json(definition)


def _limits(tx: Tx) -> dict[str, Limit]:
    found = {}
    for limit_id, definition in tx.rows("SELECT limit_id, definition FROM limit_defs"):
        try:
            found[text(limit_id)] = _parsed(text(definition))
        except ValueError as exc:
            raise CorruptRecord("limit_defs/" + text(limit_id), "definition", str(exc)) from None
    return found


# -- holders and waiters, kept with the task rows ----------------------------------------------


def sync(tx: Tx, written: Sequence[tuple[Row, bool]]) -> None:
    """After creates and saves wrote ``written`` (``(row, created)``, distinct tasks): each
    task's holds are those of its status (a write into ``RUNNING``/``PAUSED`` takes its slots,
    never refused; any other frees them), a saved ``PENDING`` task stays a waiter (its
    lines decide when it is walked again) and any other is no waiter. A few statements per
    call, not per task; nothing for tasks without refs (refs are frozen at submit)."""
    holding: list[Row] = []
    freed: list[str] = []
    gone: list[str] = []
    for row, created in written:
        if not refs_of(row):
            continue
        task_id, status = text(row["task_id"]), text(row["status"])
        if status in _HOLDING:
            holding.append(row)
        elif not created:
            freed.append(task_id)
        if not created and status != _PENDING:
            gone.append(task_id)
    _hold(tx, holding)
    for ids, sql in (
        (freed, "DELETE FROM limit_holders WHERE {}"),
        (gone, "DELETE FROM limit_waiters WHERE {}"),
    ):
        for start in range(0, len(ids), MAX_IN_LIST):
            in_chunk, params = tx.dialect.member_of("task_id", ids[start : start + MAX_IN_LIST])
            tx.run(sql.format(in_chunk), params)


def took(tx: Tx, rows: Sequence[Row]) -> None:
    """After a start moved ``rows`` to ``RUNNING``: their slots taken, none a waiter any more
    (a few statements per call, not per task)."""
    _hold(tx, rows)
    ids = sorted({text(row["task_id"]) for row in rows if refs_of(row)})
    for start in range(0, len(ids), MAX_IN_LIST):
        in_chunk, params = tx.dialect.member_of("task_id", ids[start : start + MAX_IN_LIST])
        tx.run(f"DELETE FROM limit_waiters WHERE {in_chunk}", params)


def _hold(tx: Tx, rows: Sequence[Row]) -> None:
    held = [(ref, text(row["task_id"])) for row in rows for ref in refs_of(row)]
    step = MAX_IN_LIST // 2
    for start in range(0, len(held), step):
        chunk = held[start : start + step]
        tx.run(
            "INSERT INTO limit_holders (ref, task_id) VALUES"
            f" {', '.join(['(?, ?)'] * len(chunk))} ON CONFLICT DO NOTHING",
            [value for pair in chunk for value in pair],
        )


def forget(tx: Tx, condition: str, params: Sequence[object]) -> None:
    """With a removal of the tasks ``condition`` (on ``task_id``) names: their holds and
    waits gone."""
    for table in ("limit_holders", "limit_waiters"):
        tx.run(f"DELETE FROM {table} WHERE {condition}", params)


# -- usage -------------------------------------------------------------------------------------


def usage(tx: Tx, size: int) -> list[LimitUsage]:
    """Held and waiting per ref, busiest first (``LimitsStore.limit_usage``): a rate ref holds
    nothing (``LimitUsage``); a waiter counts while its task is ``PENDING`` (every write that
    moves it on removes it anyway)."""
    limits = _limits(tx)
    held = {ref: int(n) for r, n in tx.rows("SELECT ref, COUNT(*) FROM limit_holders GROUP BY ref")
            if not isinstance(limits.get(ref_limit_id(ref := text(r))), RateLimit)}  # fmt: skip
    waiting = {
        text(r): int(n)
        for r, n in tx.rows(
            "SELECT w.ref, COUNT(*) FROM limit_waiters AS w JOIN tasks AS t"
            " ON t.task_id = w.task_id WHERE t.status = ? GROUP BY w.ref",
            [_PENDING],
        )
    }
    found = [LimitUsage(ref, held.get(ref, 0), waiting.get(ref, 0)) for ref in held | waiting]
    found.sort(key=lambda u: (-(u.held + u.waiting), u.ref))
    return found[:size]
