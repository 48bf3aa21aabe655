"""redis-py's client for a store URL, with bounded timeouts and retries: ``redis://``,
``rediss://`` and ``unix://`` through ``redis.Redis.from_url``, ``redis+sentinel://`` through
Sentinel (``_redis_sentinel``)."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from chongming_redis.stores._redis_sentinel import is_sentinel_url, sentinel_client


def connect(
    url: str, *, socket_timeout: float, socket_connect_timeout: float, retries: int, **options: Any
) -> redis.Redis:
    """A binary client (``decode_responses=False``) on ``url``; connects to nothing yet.
    Each command is retried ``retries`` times with backoff; ``ValueError`` for a bad URL."""
    make = sentinel_client if is_sentinel_url(url) else redis.Redis.from_url
    try:
        return make(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries),
            decode_responses=False,
            **options,
        )
    except ValueError as exc:
        raise ValueError(f"bad Redis URL {url!r}: {exc}") from None
