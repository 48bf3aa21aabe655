"""The change feed on the wire: a page as JSON, ``{"tasks": [...], "next_cursor": "123"}``.

The shape of the seed's discovery list (``docs/feed-page.schema.json`` is its JSON Schema). An
item carries a task's identity, ownership and state; a task's configuration (``params``) and
``result`` are not in the feed — read them from the single-task API, which the feed does not
replace. Times are RFC 3339 in UTC with microseconds; a tombstone is
``{"task_id", "status": "removed", "removed_at", "name", "bucket"}``.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from chongming_redis.model import ChangePage, TaskSnapshot, Tombstone


def _time(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def item_to_json(item: TaskSnapshot | Tombstone) -> dict[str, Any]:
    if isinstance(item, Tombstone):
        return {
            "task_id": item.task_id,
            "status": "removed",
            "removed_at": _time(item.removed_at),
            "name": item.name,
            "bucket": item.bucket,
        }
    progress = item.progress
    failure = item.failure
    return {
        "task_id": item.task_id,
        "status": item.status.value,
        "status_version": item.status_version,
        "name": item.name,
        "bucket": item.bucket,
        "key": item.key,
        "tags": sorted(item.tags),
        "pipeline_run_id": item.pipeline_run_id,
        "attempt": item.attempt,
        "priority": item.priority,
        "created_at": _time(item.created_at),
        "updated_at": _time(item.updated_at),
        "not_before": _time(item.not_before),
        "heartbeat_at": _time(item.heartbeat_at),
        "lease_owner": item.lease_owner,
        "lease_until": _time(item.lease_until),
        "progress": None
        if progress is None
        else {"current": progress.current, "total": progress.total, "message": progress.message},
        "failure": None
        if failure is None
        else {"error_type": failure.error_type, "message": failure.message},
    }


def page_to_json(page: ChangePage) -> dict[str, Any]:
    return {"tasks": [item_to_json(item) for item in page.tasks], "next_cursor": page.next_cursor}


def dumps(value: Any) -> str:
    """Compact JSON, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
