"""The dramatiq app the workers run (``dramatiq bench.peers.dramatiq_app``): the Redis broker
with its defaults (default middleware, namespace ``dramatiq``) and one no-op actor."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers.mark import mark, redis_url

broker = RedisBroker(url=redis_url())
dramatiq.set_broker(broker)


@dramatiq.actor
def noop() -> None:
    mark()
