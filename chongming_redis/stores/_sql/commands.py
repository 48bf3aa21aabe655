"""Control commands in SQL, for every SQL store: submit, the atomic claim, complete, release,
and what a dashboard or a waiting producer reads of them.

The claim picks the oldest unfinished commands with no lease or an expired one (the partial
index ``commands_open`` holds only unfinished ones, so finished commands never fill the
window) with the dialect's ``FOR UPDATE SKIP LOCKED`` (SQLite: the transaction's write lock),
then leases them in the same transaction.
"""

from __future__ import annotations

from chongming_redis.errors import CommandAlreadyExists, CommandNotFound, CorruptRecord
from chongming_redis.model import Command, CommandBacklog
from chongming_redis.stores._sql.rows import COMMAND_SELECT, decode_command, integer, values_of
from chongming_redis.stores._sql.schema import Tx
from chongming_redis.stores.codec import COMMAND_COLUMNS, Row, decode_dt

#: Ids per ``UPDATE ... IN (...)`` of a claim (old SQLite builds allow 999 parameters).
CHUNK = 200

_SUBMIT = (
    f"INSERT INTO commands ({COMMAND_SELECT}, listed)"
    f" VALUES ({', '.join('?' * (len(COMMAND_COLUMNS) + 1))})"
    " ON CONFLICT (command_id) DO NOTHING"
)


def submit(tx: Tx, row: Row) -> None:
    if not tx.run(_SUBMIT, [*values_of(row, COMMAND_COLUMNS), 1]):
        raise CommandAlreadyExists(str(row["command_id"]))


def claim_commands(tx: Tx, moment: int, until: int, limit: int) -> list[Command]:
    """Pick and lease, oldest ``created_at`` first (ties by ``command_id``)."""
    rows = tx.rows(
        f"SELECT {COMMAND_SELECT} FROM commands WHERE finished_at IS NULL"
        " AND (lease_until IS NULL OR lease_until <= ?)"
        f" ORDER BY created_at, command_id LIMIT ?{tx.dialect.skip_locked}",
        [moment, limit],
    )
    ids = [values[0] for values in rows]
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        condition, params = tx.dialect.member_of("command_id", chunk)
        tx.run(f"UPDATE commands SET lease_until = ? WHERE {condition}", [until, *params])
    lease_at = COMMAND_COLUMNS.index("lease_until")
    return [decode_command([*v[:lease_at], until, *v[lease_at + 1 :]]) for v in rows]


def complete(tx: Tx, command_id: str, finished_at: int, outcome: str | None) -> None:
    """Finish it at ``finished_at`` unless it is finished already (the first outcome stays)."""
    if not tx.run(
        "UPDATE commands SET finished_at = ?, outcome = ? WHERE command_id = ?"
        " AND finished_at IS NULL",
        [finished_at, outcome, command_id],
    ):
        _must_exist(tx, command_id)


def release(tx: Tx, command_id: str) -> None:
    """Clear the lease of an unfinished command (a finished one stays as it is)."""
    if not tx.run(
        "UPDATE commands SET lease_until = NULL WHERE command_id = ? AND finished_at IS NULL",
        [command_id],
    ):
        _must_exist(tx, command_id)


def _must_exist(tx: Tx, command_id: str) -> None:
    if not tx.rows("SELECT 1 FROM commands WHERE command_id = ?", [command_id]):
        raise CommandNotFound(command_id)


def get(tx: Tx, command_id: str) -> Command | None:
    rows = tx.rows(f"SELECT {COMMAND_SELECT} FROM commands WHERE command_id = ?", [command_id])
    return decode_command(rows[0]) if rows else None


def of_task(tx: Tx, task_id: str, newest: int) -> list[Command]:
    """The task's newest ``newest`` listed commands, returned oldest first."""
    rows = tx.rows(
        f"SELECT {COMMAND_SELECT} FROM commands WHERE task_id = ? AND listed = 1"
        " ORDER BY created_at DESC, command_id DESC LIMIT ?",
        [task_id, newest],
    )
    return [decode_command(values) for values in reversed(rows)]


def backlog(tx: Tx) -> CommandBacklog:
    """The unfinished commands, unclaimed (no lease) and leased, from the open-command index."""
    ((total, unclaimed, oldest),) = tx.rows(
        "SELECT COUNT(*), COALESCE(SUM(CASE WHEN lease_until IS NULL THEN 1 ELSE 0 END), 0),"
        " MIN(CASE WHEN lease_until IS NULL THEN created_at END)"
        " FROM commands WHERE finished_at IS NULL"
    )
    waiting = int(unclaimed)
    first = None if oldest is None else integer(oldest, "commands", "created_at")
    try:
        oldest_at = None if first is None else decode_dt(first)
    except ValueError as exc:
        raise CorruptRecord("commands", "created_at", str(exc)) from None
    return CommandBacklog(waiting, int(total) - waiting, oldest_at)
