"""The HTML pages: the overview, the task list, a task, a pipeline's graph and the schedules.
Each is rendered from one bounded read (``reads``, ``pipeline``); all but the schedules page
name the event stream that keeps them live (``data-events``), the schedules page is read
again on reload."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from anyio import to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from chongming_redis.dashboard import auth
from chongming_redis.dashboard.auth import page_context
from chongming_redis.dashboard.listing import BadFilter, parse_list_request
from chongming_redis.dashboard.pipeline import read_pipeline
from chongming_redis.dashboard.reads import read_list, read_schedules_page, read_task
from chongming_redis.dashboard.state import DashboardState
from chongming_redis.errors import StoreError
from chongming_redis.schedule_state import OUTCOMES


def _dash(request: Request) -> DashboardState:
    dash: DashboardState = request.app.state.dash
    return dash


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    dash = _dash(request)
    html = dash.renderer.page(template, **page_context(dash, request), **context)
    return HTMLResponse(html, status_code=status_code)


def error_page(request: Request, status_code: int, title: str, message: str) -> Response:
    return render(request, "error.html", status_code, title=title, message=message)


def store_down(request: Request, exc: StoreError) -> Response:
    return error_page(request, 503, "The store cannot be read", str(exc))


async def overview(request: Request) -> Response:
    dash = _dash(request)
    try:
        parts = await dash.overview_parts()
    except StoreError as exc:
        return store_down(request, exc)
    ov = await dash.overview()
    throughput = dash.hub.throughput
    return render(request, "overview.html", events="/events/overview", ov=ov,
                  series=throughput.series(ov.now), rate=throughput.per_second(ov.now),
                  bin_seconds=throughput.bin_seconds, parts=parts)  # fmt: skip


async def task_list(request: Request) -> Response:
    dash = _dash(request)
    try:
        list_request = parse_list_request(
            {key: request.query_params.getlist(key) for key in request.query_params}
        )
    except BadFilter as exc:
        return error_page(request, 400, "Bad filter", str(exc))
    try:
        page = await to_thread.run_sync(read_list, dash.store, list_request)
    except StoreError as exc:
        return store_down(request, exc)
    query = request.url.query
    return render(request, "tasks.html", page=page,
                  events="/events/tasks" + ("?" + query if query else ""))  # fmt: skip


async def task_page(request: Request) -> Response:
    dash = _dash(request)
    task_id: str = request.path_params.get("task_id") or request.query_params.get("id", "")
    try:
        page = await to_thread.run_sync(read_task, dash.store, task_id)
    except StoreError as exc:
        return store_down(request, exc)
    except (TypeError, ValueError) as exc:
        return error_page(request, 400, "Bad task id", str(exc))
    if page is None:
        return error_page(request, 404, "No such task",
                          f"Task {task_id} does not exist in namespace {dash.namespace} "
                          "(never created, or pruned).")  # fmt: skip
    done = request.query_params.get("done")
    if done is not None and not auth.note_ok(
        dash.control, done, request.query_params.get("sig", "")
    ):
        done = None  # not written by this dashboard's buttons: never shown
    return render(request, "task.html", page=page, done=done,
                  events="/events/task?" + urlencode({"id": task_id}))  # fmt: skip


async def pipeline_page(request: Request) -> Response:
    """The graph of the tasks sharing one ``pipeline_run_id`` (``/pipelines/<id>``, or
    ``/pipeline?id=`` for the ids a path cannot carry); 404 when no task carries it."""
    dash = _dash(request)
    pipeline_id: str = (request.path_params.get("pipeline_run_id")
                        or request.query_params.get("id", ""))  # fmt: skip
    try:
        graph = await to_thread.run_sync(read_pipeline, dash.store, pipeline_id)
    except StoreError as exc:
        return store_down(request, exc)
    except (TypeError, ValueError) as exc:
        return error_page(request, 400, "Bad pipeline id", str(exc))
    if not graph.nodes:
        return error_page(request, 404, "No such pipeline",
                          f"No task of namespace {dash.namespace} carries pipeline id "
                          f"{pipeline_id} (never submitted, or every task pruned).")  # fmt: skip
    return render(request, "pipeline.html", graph=graph,
                  events="/events/pipeline?" + urlencode({"id": pipeline_id}))  # fmt: skip


async def schedules(request: Request) -> Response:
    """Every schedule: its definition, state, counts and recent outcomes (no live updates:
    reload to see new ticks)."""
    dash = _dash(request)
    try:
        page = await to_thread.run_sync(read_schedules_page, dash.store)
    except StoreError as exc:
        return store_down(request, exc)
    return render(request, "schedules.html", page=page, outcomes=OUTCOMES)
