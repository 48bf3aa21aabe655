"""``SqliteFeedConsumer``: a feed consumer on SQLite, from the standard library.

Three tables in the consumer's own database: ``feed_cursor`` (one row: the cursor and the
caught-up mark), ``feed_tasks`` (one binding per task id). Every page is one ``BEGIN
IMMEDIATE`` transaction: the cursor is checked, the bindings and the user's own rows (``apply``
runs on the same connection, inside the transaction) are written, and the cursor moves — or
nothing is written at all.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from chongming_redis.feed.reader import Binding, Change, Item, PageRejected

SCHEMA = """
CREATE TABLE IF NOT EXISTS feed_cursor (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    cursor TEXT NOT NULL,
    caught_up INTEGER NOT NULL DEFAULT 0
);
INSERT OR IGNORE INTO feed_cursor (id, cursor, caught_up) VALUES (1, '0', 0);
CREATE TABLE IF NOT EXISTS feed_tasks (
    task_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    bucket INTEGER NOT NULL,
    status TEXT NOT NULL,
    status_version INTEGER NOT NULL,
    removed INTEGER NOT NULL
);
"""

#: ``apply(connection, item)``: the user's own writes for one item, in the page's transaction.
Apply = Callable[[sqlite3.Connection, Item], None]


class SqliteFeedConsumer:
    def __init__(self, path: str | Path, *, apply: Apply | None = None) -> None:
        self._db = sqlite3.connect(str(path), isolation_level=None, timeout=30)
        self._db.executescript(SCHEMA)
        self._apply = apply

    def cursor(self) -> str:
        return str(self._db.execute("SELECT cursor FROM feed_cursor").fetchone()[0])

    def caught_up(self) -> bool:
        return bool(self._db.execute("SELECT caught_up FROM feed_cursor").fetchone()[0])

    def mark_caught_up(self) -> None:
        self._db.execute("UPDATE feed_cursor SET caught_up = 1")

    def bindings(self, task_ids: list[str]) -> dict[str, Binding]:
        found: dict[str, Binding] = {}
        for task_id in set(task_ids):
            row = self._db.execute(
                "SELECT name, bucket, status, status_version, removed FROM feed_tasks"
                " WHERE task_id = ?",
                (task_id,),
            ).fetchone()
            if row is not None:
                found[task_id] = Binding(row[0], row[1], row[2], row[3], bool(row[4]))
        return found

    def all_bindings(self) -> dict[str, Binding]:
        rows = self._db.execute(
            "SELECT task_id, name, bucket, status, status_version, removed FROM feed_tasks"
        ).fetchall()
        return {r[0]: Binding(r[1], r[2], r[3], r[4], bool(r[5])) for r in rows}

    def commit(self, expect_cursor: str, changes: list[Change], next_cursor: str) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            stored = db.execute("SELECT cursor FROM feed_cursor").fetchone()[0]
            if stored != expect_cursor:
                raise PageRejected(
                    f"the cursor moved under this reader: {expect_cursor} -> {stored}"
                )
            for change in changes:
                b = change.binding
                db.execute(
                    "INSERT INTO feed_tasks VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (task_id) DO"
                    " UPDATE SET name = excluded.name, bucket = excluded.bucket, status ="
                    " excluded.status, status_version = excluded.status_version, removed ="
                    " excluded.removed",
                    (change.item.task_id, b.name, b.bucket, b.status, b.status_version,
                     int(b.removed)),
                )  # fmt: skip
                if self._apply is not None:
                    self._apply(db, change.item)
            db.execute("UPDATE feed_cursor SET cursor = ?", (next_cursor,))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # a failed COMMIT (a locked database) included
                db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()
