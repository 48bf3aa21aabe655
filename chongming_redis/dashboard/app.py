"""``create_app``: the dashboard as a Starlette application.

Routes: ``/`` (overview), ``/tasks`` (the list), ``/tasks/<id>`` (a task),
``/pipelines/<id>`` (a pipeline's graph), ``/schedules``,
the pages' event streams under ``/events/``, ``/api/v1/...`` (JSON), ``/metrics``
(Prometheus) and ``/static/``. With ``control`` set: ``/login``, ``/logout``, ``/control`` and
``/api/v1/control`` as well; without it they do not exist (404) and no page shows a button.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Sequence

from anyio import to_thread
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from chongming_redis.dashboard import api, control, events, pages
from chongming_redis.dashboard.hub import FeedHub
from chongming_redis.dashboard.prom import registry_for
from chongming_redis.dashboard.render import Renderer
from chongming_redis.dashboard.state import ControlSettings, DashboardState
from chongming_redis.errors import StoreError
from chongming_redis.stores.protocol import ChangeFeed, TaskStore


class TaskIdConvertor(Convertor[str]):
    """A task id in a path: anything, ``/`` and newlines included (``:path`` stops at a
    newline)."""

    regex = "[\\s\\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("task_id", TaskIdConvertor())


async def not_found(request: Request, exc: Exception) -> Response:
    """404 in the API's shape under ``/api/``, a page elsewhere."""
    if request.url.path.startswith("/api/"):
        return api.error(404, "not_found", f"no such resource: {request.url.path}")
    return pages.error_page(request, 404, "Not found", f"Nothing at {request.url.path}.")


def create_app(
    store: TaskStore,
    *,
    namespace: str,
    control_token: str | None = None,
    feed_interval: float = 0.25,
    command_timeout: float = 10.0,
    allowed_hosts: Sequence[str] = ("*",),
) -> Starlette:
    """The dashboard of ``store``. ``control_token``: enable the control buttons, for users
    signed in with this token (read-only when ``None``). ``allowed_hosts``: the ``Host``
    headers answered (any other is a 400: a web page that rebinds its own name to this
    address cannot read it); the CLI passes the address it listens on. The store needs a
    change feed."""
    if not isinstance(store, TaskStore):
        raise TypeError(f"store must implement TaskStore, not {type(store).__name__}")
    if not isinstance(store, ChangeFeed):
        raise TypeError("the dashboard follows the store's change feed: this store has none")
    if control_token is not None and len(control_token) < 16:
        raise ValueError("the control token must be at least 16 characters")
    settings = None
    if control_token is not None:
        settings = ControlSettings(control_token, secrets.token_bytes(32), command_timeout)
    dash = DashboardState(
        store=store,
        hub=FeedHub(store, interval=feed_interval),
        renderer=Renderer(namespace=namespace, control=settings is not None),
        namespace=namespace,
        control=settings,
    )
    registry = registry_for(store, namespace)

    async def metrics(request: Request) -> Response:
        try:
            body = await to_thread.run_sync(generate_latest, registry)
        except StoreError as exc:
            return PlainTextResponse(f"the store cannot be read: {exc}\n", status_code=503)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        follower = asyncio.create_task(dash.hub.run())
        try:
            yield
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower

    routes = [
        Route("/", pages.overview),
        Route("/tasks", pages.task_list),
        Route("/tasks/{task_id:task_id}", pages.task_page),
        Route("/task", pages.task_page),  # ?id=: the ids a path cannot carry ("." and "..")
        Route("/pipelines/{pipeline_run_id:task_id}", pages.pipeline_page),
        Route("/pipeline", pages.pipeline_page),  # ?id=: "." and ".." (as /task)
        Route("/schedules", pages.schedules),
        Route("/events/overview", events.overview_events),
        Route("/events/tasks", events.list_events),
        Route("/events/task", events.task_events),
        Route("/events/pipeline", events.pipeline_events),
        Route("/api/v1/tasks", api.feed_page),
        Route("/api/v1/overview", api.overview),
        Route("/api/v1/tasks/{task_id:task_id}", api.task),
        Route("/api/v1/pipelines/{pipeline_run_id:task_id}", api.pipeline),
        Route("/api/v1/schedules", api.schedules),
        Route("/metrics", metrics),
        Mount("/static", StaticFiles(packages=[("chongming_redis.dashboard", "static")])),
    ]
    if settings is not None:
        routes += [
            Route("/login", control.login_form, methods=["GET"]),
            Route("/login", control.login, methods=["POST"]),
            Route("/logout", control.logout, methods=["POST"]),
            Route("/control", control.control_form, methods=["POST"]),
            Route("/api/v1/control", control.control_api, methods=["POST"]),
        ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                    exception_handlers={404: not_found})  # fmt: skip
    app.state.dash = dash
    return app
