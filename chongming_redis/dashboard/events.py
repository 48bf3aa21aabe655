"""The live pages' server-sent event streams.

Each stream sends ``patch`` events, ``{element id: HTML of that part}``, rendered by the same
templates as the page. What wakes a stream is the change feed (``FeedHub``), never a poll of
every task: the overview re-reads its counters (shared, at most once a second) when the feed
moved and every ``TICK`` for the heartbeat ages; a list page re-renders the rows of the tasks
the feed shows and counts matching tasks it does not show; a task page re-reads its one task.
Progress is the exception the feed cannot carry (``touch`` never moves a task in the feed), so
the running tasks a page shows — its one task, or the running rows of its list — are re-read
every ``PROGRESS_EVERY``: a bounded read per page, whatever the number of tasks. A pipeline
page re-reads its graph (one bounded query) when the feed shows one of its tasks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

from anyio import to_thread
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from chongming_redis.dashboard.auth import page_context
from chongming_redis.dashboard.hub import Item, Subscription
from chongming_redis.dashboard.listing import BadFilter, matches, parse_list_request
from chongming_redis.dashboard.pipeline import read_pipeline
from chongming_redis.dashboard.reads import (
    TaskPage,
    read_commands,
    read_list,
    read_parents,
    read_task,
    read_task_limits,
    read_tasks,
)
from chongming_redis.dashboard.state import DashboardState
from chongming_redis.errors import StoreError
from chongming_redis.model import TaskSnapshot, TaskStatus, Tombstone
from chongming_redis.stores.protocol import ChangeFeed
from chongming_redis.validation import check_identifier

TICK = 2.0
PROGRESS_EVERY = 0.5
#: The browser waits this long before reconnecting a dropped stream (ms).
RETRY_MS = 2000
LIVE = frozenset({TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED})


def frame(event: str, data: object) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def stream(events: AsyncIterator[str]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        yield f"retry: {RETRY_MS}\n\n"
        async for chunk in events:
            yield chunk

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


RESET: tuple[Item, ...] = ()


async def next_batch(sub: Subscription, timeout: float) -> Sequence[Item] | None:
    """The hub's next batch of changed items, or ``None`` after ``timeout`` seconds.
    ``RESET`` (the hub's empty batch, or a missed one: ``overflowed``) means "re-read
    everything shown": the feed was followed again from a new head."""
    try:
        batch = await asyncio.wait_for(sub.queue.get(), timeout)
    except asyncio.TimeoutError:
        return RESET if sub.overflowed else None
    items = list(batch)
    if not items:
        return RESET
    while not sub.queue.empty():  # drain: one render for everything that piled up
        more = sub.queue.get_nowait()
        if not more:
            return RESET
        items.extend(more)
    if sub.overflowed:
        return RESET
    return items


def _alert(dash: DashboardState, error: str | None) -> dict[str, str]:
    text = error or dash.hub.error
    if text is None:
        return {"alert": ""}
    return {"alert": dash.renderer.part("alert", message=f"The store cannot be read: {text}")}


class Changes:
    """Sends a part only when its HTML differs from what the page already has."""

    def __init__(self) -> None:
        self.sent: dict[str, str] = {}

    def frame(self, parts: dict[str, str]) -> str | None:
        changed = {k: v for k, v in parts.items() if self.sent.get(k) != v}
        if not changed:
            return None
        self.sent.update(changed)
        return frame("patch", changed)


async def overview_events(request: Request) -> Response:
    dash: DashboardState = request.app.state.dash

    async def events() -> AsyncIterator[str]:
        sub, changes = dash.hub.subscribe(), Changes()
        try:
            while True:
                try:
                    parts = {**await dash.overview_parts(), **_alert(dash, None)}
                except StoreError as exc:
                    parts = _alert(dash, str(exc))
                chunk = changes.frame(parts)
                if chunk:
                    yield chunk
                if await next_batch(sub, TICK) is RESET:
                    sub.overflowed = False  # the overview re-reads everything each time anyway
                await asyncio.sleep(0.2)  # let a burst of changes settle into one render
        finally:
            dash.hub.unsubscribe(sub)

    return stream(events())


async def list_events(request: Request) -> Response:
    dash: DashboardState = request.app.state.dash
    try:
        list_request = parse_list_request(
            {key: request.query_params.getlist(key) for key in request.query_params}
        )
    except BadFilter as exc:
        return Response(str(exc), status_code=400)
    render = dash.renderer
    feed = dash.store
    assert isinstance(feed, ChangeFeed)  # create_app refuses a store without one

    async def events() -> AsyncIterator[str]:
        sub, changes = dash.hub.subscribe(), Changes()
        shown: dict[str, TaskSnapshot | Tombstone] = {}
        row_of: dict[str, int] = {}
        elsewhere: set[str] = set()
        dirty: set[str] = set()
        reload_url = "/tasks" + ("?" + request.url.query if request.url.query else "")
        try:
            while not row_of:  # the page as loaded; retried while the store cannot be read
                try:
                    # The feed's head before the page: changes up to it are on the page.
                    sub.since = (await to_thread.run_sync(feed.feed_stats)).head
                    page = await to_thread.run_sync(read_list, dash.store, list_request)
                except StoreError as exc:
                    chunk = changes.frame(_alert(dash, str(exc)))
                    if chunk:
                        yield chunk
                    await asyncio.sleep(TICK)
                    continue
                shown = {t.task_id: t for t in page.tasks}
                row_of = {t.task_id: i for i, t in enumerate(page.tasks)}
                if not row_of:
                    break  # an empty page: only the notice of new matches can change
            while True:
                batch = await next_batch(sub, PROGRESS_EVERY)
                # Progress never moves a task in the feed: re-read the running rows.
                reread = [i for i, t in shown.items() if _running(t)]
                if batch is RESET:
                    sub.overflowed, sub.since, reread = False, 0, list(shown)
                for item in batch or ():
                    if item.task_id in shown:
                        shown[item.task_id] = item
                        dirty.add(item.task_id)
                    elif matches(list_request.query, item):
                        elsewhere.add(item.task_id)
                try:
                    fresh = await to_thread.run_sync(read_tasks, dash.store, reread)
                except StoreError as exc:
                    chunk = changes.frame(_alert(dash, str(exc)))
                    if chunk:
                        yield chunk
                    continue
                for task_id, task in fresh.items():
                    if task is not None and task != shown[task_id]:
                        shown[task_id] = task
                        dirty.add(task_id)
                parts = {f"row-{row_of[i]}": render.part("row", task=shown[i]) for i in dirty}
                dirty.clear()
                if elsewhere:
                    parts["list-notice"] = render.part("list_notice", n=len(elsewhere),
                                                       url=reload_url)  # fmt: skip
                chunk = changes.frame({**parts, **_alert(dash, None)})
                if chunk:
                    yield chunk
        finally:
            dash.hub.unsubscribe(sub)

    return stream(events())


def _running(item: TaskSnapshot | Tombstone) -> bool:
    return isinstance(item, TaskSnapshot) and item.status is TaskStatus.RUNNING


async def task_events(request: Request) -> Response:
    dash: DashboardState = request.app.state.dash
    task_id = request.query_params.get("id", "")
    try:
        check_identifier(task_id, "id")
    except ValueError as exc:
        return Response(f"give the task: ?id=<task id> ({exc})", status_code=400)

    async def events() -> AsyncIterator[str]:
        sub, changes = dash.hub.subscribe(), Changes()
        context = page_context(dash, request)
        try:
            page: TaskPage | None = None
            while True:
                try:
                    page = await _refresh(dash, task_id, page)
                except StoreError as exc:
                    chunk = changes.frame(_alert(dash, str(exc)))
                    if chunk:
                        yield chunk
                    await asyncio.sleep(PROGRESS_EVERY)
                    continue
                if page is None:
                    gone = f"Task {task_id} no longer exists (pruned)."
                    yield frame("patch", {"alert": dash.renderer.part("alert", message=gone)})
                    yield frame("end", {})
                    return
                parts = dash.renderer.parts(
                    {"task-summary": "task_summary", "task-progress": "task_progress",
                     "task-history": "history", "task-commands": "commands",
                     "task-control": "task_control", "task-outcome": "task_outcome",
                     "task-limits": "task_limits"},
                    page=page, **context,
                )  # fmt: skip
                chunk = changes.frame({**parts, **_alert(dash, None)})
                if chunk:
                    yield chunk
                live = page.task.status in LIVE
                # This task, and the parents it shows (their statuses are on the page).
                watched = {task_id, *(parent for parent, _ in page.parents)}
                while True:  # wait for these tasks in the feed, or for the progress tick
                    batch = await next_batch(sub, PROGRESS_EVERY if live else TICK * 5)
                    if batch is RESET:
                        sub.overflowed = False
                    if batch is None or batch is RESET or any(i.task_id in watched for i in batch):
                        break
        finally:
            dash.hub.unsubscribe(sub)

    return stream(events())


async def _refresh(dash: DashboardState, task_id: str, page: TaskPage | None) -> TaskPage | None:
    """The task again; its history only when its version moved; its commands while live."""
    if page is None:
        return await to_thread.run_sync(read_task, dash.store, task_id)
    task = await to_thread.run_sync(dash.store.get, task_id)
    if task is None:
        return None
    history = page.history
    if task.status_version != page.task.status_version:
        history = tuple(await to_thread.run_sync(dash.store.history, task_id))
    commands = page.commands
    if task.status in LIVE or task.status_version != page.task.status_version:
        commands = await to_thread.run_sync(read_commands, dash.store, task_id)
    limits = await to_thread.run_sync(read_task_limits, dash.store, task)
    parents = await to_thread.run_sync(read_parents, dash.store, task)  # woken by one, maybe
    return TaskPage(task, history, commands, limits, parents)


async def pipeline_events(request: Request) -> Response:
    """A pipeline page's graph, re-read when the feed shows a task of the pipeline (a new
    one, or one drawn) and every ``TICK * 5``; ``end`` once no task carries the id."""
    dash: DashboardState = request.app.state.dash
    pipeline_id = request.query_params.get("id", "")
    try:
        check_identifier(pipeline_id, "id")
    except ValueError as exc:
        return Response(f"give the pipeline: ?id=<pipeline run id> ({exc})", status_code=400)

    def concerns(item: Item, drawn: set[str]) -> bool:
        return item.task_id in drawn or (
            isinstance(item, TaskSnapshot) and item.pipeline_run_id == pipeline_id
        )

    async def events() -> AsyncIterator[str]:
        sub, changes = dash.hub.subscribe(), Changes()
        try:
            while True:
                try:
                    graph = await to_thread.run_sync(read_pipeline, dash.store, pipeline_id)
                except StoreError as exc:
                    chunk = changes.frame(_alert(dash, str(exc)))
                    if chunk:
                        yield chunk
                    await asyncio.sleep(TICK)
                    continue
                if not graph.nodes:
                    gone = f"No task carries pipeline id {pipeline_id} any more (pruned)."
                    yield frame("patch", {"alert": dash.renderer.part("alert", message=gone)})
                    yield frame("end", {})
                    return
                part = dash.renderer.part("pipeline_graph", graph=graph)
                chunk = changes.frame({"pipeline-graph": part, **_alert(dash, None)})
                if chunk:
                    yield chunk
                drawn = {node.task.task_id for node in graph.nodes}
                while True:  # wait for a task of this pipeline in the feed
                    batch = await next_batch(sub, TICK * 5)
                    if batch is RESET:
                        sub.overflowed = False
                    if batch is None or batch is RESET or any(concerns(i, drawn) for i in batch):
                        break
                await asyncio.sleep(0.2)  # let a burst of changes settle into one render
        finally:
            dash.hub.unsubscribe(sub)

    return stream(events())
