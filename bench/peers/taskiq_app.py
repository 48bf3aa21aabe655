"""The taskiq app the workers run (``taskiq worker bench.peers.taskiq_app:broker``):
taskiq-redis' ``RedisStreamBroker`` with its defaults (no result backend, consumer group
``taskiq`` created at ``$`` by ``startup()``) and one no-op task, ``async`` as taskiq tasks
usually are (a sync one would run in a thread pool)."""

from __future__ import annotations

from taskiq_redis import RedisStreamBroker

from bench.peers.mark import mark, redis_url

broker = RedisStreamBroker(url=redis_url())


@broker.task
async def noop() -> None:
    mark()
