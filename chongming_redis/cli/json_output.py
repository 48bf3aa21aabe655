"""What ``--json`` prints: one JSON document per command, on one line, with stable keys.

Statuses are their lowercase values; times are RFC 3339 in UTC with microseconds
(``2026-01-02T03:04:05.123456Z``), ``null`` when unset. A task is the change feed's item
(``feed.wire.item_to_json``, ``docs/feed-page.schema.json``)::

    tasks --json      {"namespace", "tasks": [task, ...]}
    show ID --json    {"namespace", "task": task + {"params", "result", "policies",
                       "parents": [id, ...], "on_parent_failure": "stop" | "run",
                       "parent_statuses": {id: status or null (gone), ...} (the first
                       parents read)} (failure with "traceback"), "history": [{"version",
                       "from_status", "to_status", "at", "reason"}, ...]}
    stats --json      {"namespace", "total", "counts": {status: n, ... every status},
                       "buckets": [{"bucket", "counts": {status: n}}, ...] (non-empty ones),
                       "workers": [{"worker", "heartbeat_until", "alive", "buckets": [...]}]}
    reconcile --json  {"namespace", "lost": [id, ...], "retried": [...], "stalled": [...]}
    limits --json     {"namespace", "limits": [{"id", "definition": {...} or null, "task_types":
                       [...], "held", "waiting", "refs", "busiest": [{"ref", "key", "held",
                       "waiting"}, ...]}, ...]}

``params`` and ``result`` are as stored; bytes in them become ``{"base64": "..."}``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from chongming_redis.feed.wire import item_to_json
from chongming_redis.model import TaskSnapshot, TaskStatus, Transition

if TYPE_CHECKING:
    from chongming_redis.runtime.limit_defs import LimitRow


def _time(moment: datetime | None) -> str | None:
    """The change feed's time format (``feed.wire``), ``None`` kept."""
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def plain(value: Any) -> Any:
    """A stored value (msgpack types) as JSON types: bytes become ``{"base64": ...}``."""
    if isinstance(value, bytes | bytearray):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {str(k if not isinstance(k, bytes) else k.decode("utf-8", "replace")): plain(v)
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def task_json(snapshot: TaskSnapshot) -> dict[str, Any]:
    """One task of ``tasks --json``: the change feed's item."""
    return item_to_json(snapshot)


def transition_json(entry: Transition) -> dict[str, Any]:
    return {
        "version": entry.version,
        "from_status": None if entry.from_status is None else entry.from_status.value,
        "to_status": entry.to_status.value,
        "at": _time(entry.at),
        "reason": entry.reason,
    }


def show_json(
    namespace: str,
    snapshot: TaskSnapshot,
    history: Iterable[Transition],
    parents: Mapping[str, TaskStatus | None] | None = None,
) -> dict[str, Any]:
    task = item_to_json(snapshot)
    task["params"] = plain(snapshot.params)
    task["result"] = plain(snapshot.result)
    if snapshot.failure is not None:
        task["failure"]["traceback"] = snapshot.failure.traceback
    task["policies"] = policies_json(snapshot)
    task["parents"] = list(snapshot.parents)
    task["on_parent_failure"] = snapshot.on_parent_failure
    task["parent_statuses"] = {parent: None if status is None else status.value
                               for parent, status in (parents or {}).items()}  # fmt: skip
    return {
        "namespace": namespace,
        "task": task,
        "history": [transition_json(entry) for entry in history],
    }


def policies_json(snapshot: TaskSnapshot) -> dict[str, Any]:
    """The task's frozen policies: ``retry`` (``None``: the worker's default), ``timeout`` and
    ``retention`` in seconds, the running attempt's ``deadline``, the ``unique`` id."""
    retry = snapshot.retry
    return {
        "retry": None if retry is None else {
            "max_attempts": retry.max_attempts, "base_delay": retry.base_delay,
            "max_delay": retry.max_delay, "multiplier": retry.multiplier,
            "jitter": retry.jitter, "retry_on": list(retry.retry_on),
            "no_retry_on": list(retry.no_retry_on),
        },
        "timeout": snapshot.timeout,
        "deadline": _time(snapshot.deadline),
        "retention": snapshot.retention,
        "unique": snapshot.unique,
    }  # fmt: skip


def counts_json(counts: Mapping[TaskStatus, int]) -> dict[str, int]:
    return {status.value: int(counts.get(status, 0)) for status in TaskStatus}


def stats_json(
    namespace: str,
    counts: Mapping[TaskStatus, int],
    per_bucket: Mapping[int, Mapping[TaskStatus, int]],
    workers: Mapping[str, datetime],
    owners: Mapping[int, str],
    now: datetime,
) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "total": sum(counts.values()),
        "counts": counts_json(counts),
        "buckets": [
            {"bucket": bucket, "counts": counts_json(per_bucket[bucket])}
            for bucket in sorted(per_bucket)
            if any(per_bucket[bucket].values())
        ],
        "workers": [
            {
                "worker": worker,
                "heartbeat_until": _time(until),
                "alive": until > now,
                "buckets": sorted(b for b, owner in owners.items() if owner == worker),
            }
            for worker, until in sorted(workers.items())
        ],
    }


def reconcile_json(
    namespace: str, lost: Iterable[str], retried: Iterable[str], stalled: Iterable[str]
) -> dict[str, Any]:
    return {"namespace": namespace, "lost": list(lost), "retried": list(retried),
            "stalled": list(stalled)}  # fmt: skip


def limits_json(
    namespace: str, rows: Iterable[LimitRow], task_limits: Mapping[str, Iterable[str]]
) -> dict[str, Any]:
    """``limits --json``: each limit, its sums over its refs and its busiest refs (``key``:
    the params value of a per-key limit, ``null`` for one without a key)."""
    types: dict[str, list[str]] = {}
    for name, ids in sorted(task_limits.items()):
        for limit_id in ids:
            types.setdefault(limit_id, []).append(name)
    return {"namespace": namespace, "limits": [
        {"id": row.limit_id,
         "definition": None if row.definition is None else json.loads(row.definition),
         "task_types": types.get(row.limit_id, []), "held": row.held, "waiting": row.waiting,
         "refs": row.refs,
         "busiest": [{"ref": u.ref, "key": u.ref.partition("=")[2] if "=" in u.ref else None,
                      "held": u.held, "waiting": u.waiting} for u in row.busiest]}
        for row in rows
    ]}  # fmt: skip
