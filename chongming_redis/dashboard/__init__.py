"""The web dashboard (``chongming-redis dashboard``): an overview, a task list with every
``TaskQuery`` filter, a page per task, all kept live from the change feed over server-sent
events; the feed as JSON (``/api/v1/tasks``) and the store's Prometheus metrics (``/metrics``).
``create_app`` builds it on any store with a change feed."""

from chongming_redis.dashboard.app import create_app

__all__ = ["create_app"]
