"""The web dashboard (``chongming-redis dashboard``): an overview, a task list with every
``TaskQuery`` filter, a page per task, all kept live from the change feed over server-sent
events; the feed as JSON (``/api/v1/tasks``) and the store's Prometheus metrics (``/metrics``).
``create_app`` builds it on any store with a change feed.

It needs the ``[dashboard]`` extra: without it, importing this package raises ``MissingExtra``
(``chongming_redis.errors``) naming it. Every module of the extra is checked up front, not
only those imported here: starlette imports python-multipart at the first form posted (a
sign-in), and ``chongming-redis dashboard`` serves on uvicorn."""

from chongming_redis.errors import require_extra

require_extra("dashboard", "the dashboard")

from chongming_redis.dashboard.app import create_app  # noqa: E402  (after the check)

__all__ = ["create_app"]
