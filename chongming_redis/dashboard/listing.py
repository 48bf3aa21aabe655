"""The task list's URL: filters, page size and paging marks, parsed into a ``TaskQuery``.

Pure functions, no I/O. A list URL holds every ``TaskQuery`` filter (``status`` and ``bucket``
repeat; ``prefix`` is ``name_prefix``; ``pipeline`` is ``pipeline_run_id``), ``order``
(``newest``, the default: what just happened first | ``oldest``), ``limit`` (the page size)
and at most one paging mark: ``after`` (the next page starts after this task) or ``before``
(the previous page ends before it). A mark is
``<created_at in µs>.<task_id>``: keyset paging, so page 400 costs what page 1 does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from urllib.parse import quote, urlencode

from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus, Tombstone
from chongming_redis.stores.codec import decode_dt, encode_dt
from chongming_redis.validation import check_identifier

DEFAULT_PAGE = 50
#: A list without ``order`` shows the newest tasks first (what a user opening it looks for).
DEFAULT_ORDER = "newest"
MAX_PAGE = 500
Mark = tuple[datetime, str]


class BadFilter(ValueError):
    """A list URL the dashboard refuses (HTTP 400), with a message for the user."""


@dataclass(frozen=True)
class ListRequest:
    query: TaskQuery  # the filters, the order and the page size (``limit``)
    after: Mark | None = None
    before: Mark | None = None

    def filter_params(self) -> list[tuple[str, str]]:
        """The URL parameters of the filters and the order (no paging mark)."""
        q = self.query
        params: list[tuple[str, str]] = [("status", s.value) for s in sorted(q.statuses or ())]
        for key, value in (("name", q.name), ("prefix", q.name_prefix), ("tag", q.tag),
                           ("pipeline", q.pipeline_run_id)):  # fmt: skip
            if value is not None:
                params.append((key, value))
        params += [("bucket", str(b)) for b in sorted(q.buckets or ())]
        if q.newest_first != (DEFAULT_ORDER == "newest"):
            params.append(("order", "newest" if q.newest_first else "oldest"))
        if q.limit != DEFAULT_PAGE:
            params.append(("limit", str(q.limit)))
        return params

    def url(self, *, after: Mark | None = None, before: Mark | None = None) -> str:
        params = self.filter_params()
        if after is not None:
            params.append(("after", format_mark(after)))
        if before is not None:
            params.append(("before", format_mark(before)))
        return "/tasks" + ("?" + urlencode(params) if params else "")

    @property
    def filtered(self) -> bool:
        return self.query != TaskQuery(limit=self.query.limit, newest_first=self.query.newest_first)


def task_path(task_id: str) -> str:
    """A task page's path. Any id, percent-encoded; ``.`` and ``..`` (which a browser would
    resolve as path segments) go in the query string instead."""
    if task_id in (".", ".."):
        return "/task?" + urlencode({"id": task_id})
    return "/tasks/" + quote(task_id, safe="")


def format_mark(mark: Mark) -> str:
    return f"{encode_dt(mark[0])}.{mark[1]}"


def mark_of(task: TaskSnapshot) -> Mark:
    return (task.created_at, task.task_id)


def parse_mark(text: str, what: str) -> Mark:
    micros, dot, task_id = text.partition(".")
    if not dot or not micros.isdigit() or not micros.isascii() or not task_id:
        raise BadFilter(f"{what} must be <created_at in µs>.<task id>, not {text!r}")
    try:
        return decode_dt(int(micros)), check_identifier(task_id, "its task id")
    except ValueError as exc:
        raise BadFilter(f"{what}: {exc}") from None


def parse_list_request(params: Mapping[str, Sequence[str]]) -> ListRequest:
    """``params``: each URL parameter with all its values. Raises ``BadFilter``."""
    known = {"status", "name", "prefix", "tag", "bucket", "pipeline", "order", "limit", "after",
             "before"}  # fmt: skip
    unknown = sorted(set(params) - known)
    if unknown:
        raise BadFilter(f"unknown parameter {unknown[0]!r}")

    def one(key: str) -> str | None:
        values = [v for v in params.get(key, ()) if v != ""]  # an empty form field: no filter
        if len(values) > 1:
            raise BadFilter(f"{key} is given {len(values)} times")
        return values[0] if values else None

    statuses = frozenset(_status(v) for v in params.get("status", ()) if v)
    buckets = frozenset(_bucket(v) for raw in params.get("bucket", ()) for v in _split(raw))
    order = one("order") or DEFAULT_ORDER
    if order not in ("oldest", "newest"):
        raise BadFilter(f"order must be oldest or newest, not {order!r}")
    limit = _page_size(one("limit"))
    after, before = one("after"), one("before")
    if after is not None and before is not None:
        raise BadFilter("give after or before, not both")
    try:
        query = TaskQuery(statuses=statuses or None, name=one("name"), name_prefix=one("prefix"),
                          tag=one("tag"), buckets=buckets or None, pipeline_run_id=one("pipeline"),
                          limit=limit, newest_first=order == "newest")  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise BadFilter(str(exc)) from None
    return ListRequest(
        query,
        after=None if after is None else parse_mark(after, "after"),
        before=None if before is None else parse_mark(before, "before"),
    )


def reversed_query(query: TaskQuery, limit: int) -> TaskQuery:
    """The same filters in the other order: what lies before a mark, nearest first."""
    return replace(query, newest_first=not query.newest_first, limit=limit)


def matches(query: TaskQuery, item: TaskSnapshot | Tombstone) -> bool:
    """Whether a task from the change feed belongs in a list with these filters."""
    if isinstance(item, Tombstone):
        return False
    q = query
    return (
        (q.statuses is None or item.status in q.statuses)
        and (q.name is None or item.name == q.name)
        and (q.name_prefix is None or item.name.startswith(q.name_prefix))
        and (q.tag is None or q.tag in item.tags)
        and (q.buckets is None or item.bucket in q.buckets)
        and (q.pipeline_run_id is None or item.pipeline_run_id == q.pipeline_run_id)
    )


def _split(raw: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


def _status(value: str) -> TaskStatus:
    try:
        return TaskStatus(value)
    except ValueError:
        names = ", ".join(s.value for s in TaskStatus)
        raise BadFilter(f"status must be one of {names}, not {value!r}") from None


def _bucket(value: str) -> int:
    if not value.isdigit() or not value.isascii() or int(value) > 2**31 - 1:
        raise BadFilter(f"bucket must be a whole number, not {value!r}")
    return int(value)


def _page_size(value: str | None) -> int:
    if value is None:
        return DEFAULT_PAGE
    if not value.isdigit() or not value.isascii() or not 1 <= int(value) <= MAX_PAGE:
        raise BadFilter(f"limit must be a whole number from 1 to {MAX_PAGE}, not {value!r}")
    return int(value)
