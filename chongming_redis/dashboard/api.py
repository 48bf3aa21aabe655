"""The JSON API (``/api/v1``): the change feed in the seed's page shape, the overview's
figures, one task in full (with its ``parents`` and ``on_parent_failure``), a pipeline's graph
(``/api/v1/pipelines/<id>``: ``{"namespace", "pipeline_run_id", "read_at", "truncated",
"max_nodes", "counts", "nodes": [{"task_id", "name", "status", "status_version",
"created_at", "updated_at", "depth", "row", "parents", "on_parent_failure"}, ...], "edges":
[{"from", "to"}, ...]}``, ``dashboard/pipeline.py``; 404 when no task carries the id) and the
schedules (``/api/v1/schedules``: ``{"namespace",
"read_at", "schedules": [{"id", "version", "definition", "paused", "next_tick", "updated_at",
"last_task", "buffered", "counts", "recent": [{"outcome", "tick", "at", "task_id", "count",
"last"}, ...]}, ...]}``, as ``chongming-redis schedules list --json`` prints them; 501 for a
store that keeps no schedules). Errors are JSON too: ``{"error": code, "message": text}`` with
HTTP 400 for a bad request (a malformed or future cursor above all: never an empty page), 404
for an unknown task and 503 when the store cannot be read."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from anyio import to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from chongming_redis.dashboard.pipeline import graph_json, read_pipeline
from chongming_redis.dashboard.reads import read_schedules_page
from chongming_redis.dashboard.state import DashboardState
from chongming_redis.errors import InvalidCursor, StoreError
from chongming_redis.feed.wire import item_to_json, page_to_json
from chongming_redis.runtime.scheduling import StoredSchedule
from chongming_redis.schedule_state import OUTCOMES, definition_json
from chongming_redis.stores.protocol import ChangeFeed

FEED_LIMIT = 256


def error(status: int, code: str, message: str) -> Response:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def _dash(request: Request) -> DashboardState:
    dash: DashboardState = request.app.state.dash
    return dash


async def feed_page(request: Request) -> Response:
    """``GET /api/v1/tasks?after=N&limit=M``: ``{"tasks": [...], "next_cursor": "N"}``."""
    dash = _dash(request)
    unknown = sorted(set(request.query_params) - {"after", "limit"})
    if unknown:
        return error(400, "bad_request", f"unknown parameter {unknown[0]!r}")
    for key in ("after", "limit"):
        if len(request.query_params.getlist(key)) > 1:
            return error(400, "bad_request", f"{key} is given more than once")
    after = request.query_params.get("after", "0")
    raw_limit = request.query_params.get("limit", str(FEED_LIMIT))
    if not raw_limit.isascii() or not raw_limit.isdigit() or not 1 <= int(raw_limit) <= FEED_LIMIT:
        message = f"limit must be a whole number from 1 to {FEED_LIMIT}, not {raw_limit!r}"
        return error(400, "bad_limit", message)
    if not isinstance(dash.store, ChangeFeed):
        return error(501, "no_feed", "this store has no change feed")
    feed = dash.store
    try:
        page = await to_thread.run_sync(feed.changes, after, int(raw_limit))
    except InvalidCursor as exc:
        return error(400, "invalid_cursor", str(exc))
    except StoreError as exc:
        return error(503, "store_unavailable", str(exc))
    except (TypeError, ValueError) as exc:
        return error(400, "invalid_cursor", str(exc))
    return JSONResponse(page_to_json(page))


async def overview(request: Request) -> Response:
    dash = _dash(request)
    try:
        ov = await dash.overview()
    except StoreError as exc:
        return error(503, "store_unavailable", str(exc))
    body: dict[str, Any] = {
        "namespace": dash.namespace,
        "read_at": ov.now.isoformat(),
        "counts": {status.value: n for status, n in ov.counts.items()},
        "workers": [
            {
                "worker": w.name,
                "heartbeat_age_seconds": w.beat_age,
                "expires_in_seconds": w.expires_in,
                "buckets": list(w.buckets),
            }
            for w in ov.workers
        ],
        "buckets": [
            {
                "bucket": b.bucket,
                "owner": b.owner,
                "counts": {s.value: n for s, n in b.counts.items()},
            }
            for b in ov.buckets
        ],
        "feed": None
        if ov.feed is None
        else {
            "head": ov.feed.head,
            "items": ov.feed.items,
            "tombstones": ov.feed.tombstones,
        },
        "throughput_per_second": dash.hub.throughput.per_second(ov.now),
    }
    return JSONResponse(body)


async def task(request: Request) -> Response:
    """One task in full: its feed item plus ``params``, ``result`` and the failure's traceback
    (what the feed leaves out)."""
    dash = _dash(request)
    task_id: str = request.path_params["task_id"]
    try:
        snapshot = await to_thread.run_sync(dash.store.get, task_id)
    except StoreError as exc:
        return error(503, "store_unavailable", str(exc))
    except (TypeError, ValueError) as exc:
        return error(400, "bad_task_id", str(exc))
    if snapshot is None:
        return error(404, "no_such_task", f"no task {task_id!r}")
    body = item_to_json(snapshot)
    body["params"] = _plain(snapshot.params)
    body["result"] = _plain(snapshot.result)
    if snapshot.failure is not None:
        body["failure"]["traceback"] = snapshot.failure.traceback
    body["parents"] = list(snapshot.parents)
    body["on_parent_failure"] = snapshot.on_parent_failure
    return JSONResponse(body)


async def pipeline(request: Request) -> Response:
    """``GET /api/v1/pipelines/<id>``: the pipeline's graph as its page draws it."""
    dash = _dash(request)
    pipeline_id: str = request.path_params["pipeline_run_id"]
    try:
        graph = await to_thread.run_sync(read_pipeline, dash.store, pipeline_id)
    except StoreError as exc:
        return error(503, "store_unavailable", str(exc))
    except (TypeError, ValueError) as exc:
        return error(400, "bad_pipeline_id", str(exc))
    if not graph.nodes:
        return error(404, "no_such_pipeline", f"no task carries pipeline id {pipeline_id!r}")
    return JSONResponse({"namespace": dash.namespace, **graph_json(graph)})


async def schedules(request: Request) -> Response:
    """``GET /api/v1/schedules``: every schedule with its state and recent outcomes."""
    dash = _dash(request)
    try:
        page = await to_thread.run_sync(read_schedules_page, dash.store)
    except StoreError as exc:
        return error(503, "store_unavailable", str(exc))
    if page.schedules is None:
        return error(501, "no_schedules", "this store keeps no schedules")
    return JSONResponse({"namespace": dash.namespace, "read_at": _time(page.now),
                         "schedules": [schedule_json(s) for s in page.schedules]})  # fmt: skip


def schedule_json(stored: StoredSchedule) -> dict[str, Any]:
    state = stored.state
    definition = definition_json(state.schedule)
    definition["params"] = _plain(definition["params"])
    return {
        "id": state.schedule.id, "version": stored.version, "definition": definition,
        "paused": state.paused, "next_tick": _time(state.next_tick),
        "updated_at": _time(state.updated_at), "last_task": state.last_task,
        "buffered": _time(state.buffered),
        "counts": {outcome: int(state.counts.get(outcome, 0)) for outcome in OUTCOMES},
        "recent": [{"outcome": o.outcome, "tick": _time(o.tick), "at": _time(o.at),
                    "task_id": o.task_id, "count": o.count, "last": _time(o.last)}
                   for o in state.recent],
    }  # fmt: skip


def _time(moment: datetime | None) -> str | None:
    """The feed's time format: RFC 3339 in UTC with microseconds, ``None`` kept."""
    if moment is None:
        return None
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _plain(value: Any) -> Any:
    """JSON as is; anything else (bytes, say) as its ``repr``."""
    import json

    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)
    return value
