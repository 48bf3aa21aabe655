"""The huey app the workers run (``huey_consumer bench.peers.huey_app.huey``): ``RedisHuey``
with its defaults (blocking BRPOP, results on, ``None`` results not stored) and one no-op
task."""

from __future__ import annotations

from huey import RedisHuey

from bench.peers.mark import mark, redis_url

huey = RedisHuey("bench-peers", url=redis_url())


@huey.task()
def noop() -> None:
    mark()
