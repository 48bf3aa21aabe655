"""``TaskQuery`` as SQL, for every SQL store: every filter runs in the database, on an index.

* ``statuses`` / ``buckets``: ``IN`` lists (an empty set is ``1 = 0``: it matches nothing);
* ``name``, ``pipeline_run_id``: equality; ``tag``: the ``task_tags`` index, exact;
* ``name_prefix``: the range ``[prefix, successor(prefix))`` in code-point order — never
  ``LIKE`` (``%``/``_`` would be patterns) and never ``prefix + "\\uffff"`` (names with
  characters beyond the Basic Multilingual Plane would fall outside);
* order ``created_at, task_id`` (both descending with ``newest_first``), ``LIMIT`` after every
  filter; ``after`` (``query_page``) is a keyset condition on the same pair.
"""

from __future__ import annotations

from datetime import datetime

from chongming_redis.model import TaskQuery
from chongming_redis.stores._sql.rows import TASK_SELECT
from chongming_redis.stores._sql.schema import Dialect
from chongming_redis.stores.codec import encode_dt

_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


def prefix_successor(prefix: str) -> str | None:
    """The smallest string above every string that starts with ``prefix`` (code-point order),
    or ``None`` when there is none (a prefix of only U+10FFFF)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code in _SURROGATES:  # never in stored text: UTF-8 cannot encode them
            code = _SURROGATES.stop
        if code <= _MAX_CODE_POINT:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def task_conditions(d: Dialect, q: TaskQuery) -> tuple[list[str], list[object]]:
    """The WHERE conditions of ``q``'s filters (AND), and their parameters."""
    conditions: list[str] = []
    params: list[object] = []

    def add(condition: str, *values: object) -> None:
        conditions.append(condition)
        params.extend(values)

    if q.statuses is not None:
        condition, values = d.member_of("status", sorted(s.value for s in q.statuses))
        add(condition, *values)
    if q.buckets is not None:
        condition, values = d.member_of("bucket", sorted(q.buckets))
        add(condition, *values)
    if q.name is not None:
        add("name = ?", q.name)
    if q.name_prefix is not None:
        upper = prefix_successor(q.name_prefix)
        add("name >= ?", q.name_prefix)
        if upper is not None:
            add("name < ?", upper)
    if q.tag is not None:
        add("task_id IN (SELECT task_id FROM task_tags WHERE tag = ?)", q.tag)
    if q.pipeline_run_id is not None:
        add("pipeline_run_id = ?", q.pipeline_run_id)
    return conditions, params


def select_tasks(
    d: Dialect, q: TaskQuery, after: tuple[datetime, str] | None = None
) -> tuple[str, list[object]]:
    """The SELECT of ``query(q)`` (``query_page(q, after=after)``) and its parameters."""
    conditions, params = task_conditions(d, q)
    if after is not None:
        moment = encode_dt(after[0])
        beyond = "<" if q.newest_first else ">"
        conditions.append(f"(created_at {beyond} ? OR (created_at = ? AND task_id {beyond} ?))")
        params.extend((moment, moment, after[1]))
    order = "DESC" if q.newest_first else "ASC"
    sql = f"SELECT {TASK_SELECT} FROM tasks"
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    sql += f" ORDER BY created_at {order}, task_id {order}"
    if q.limit is not None:
        sql += " LIMIT ?"
        params.append(q.limit)
    return sql, params
