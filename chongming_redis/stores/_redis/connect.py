"""redis-py's client for a store URL, sync or asyncio, with bounded timeouts and retries:
``redis://``, ``rediss://`` and ``unix://`` through ``Redis.from_url``, ``redis+sentinel://``
through Sentinel (``_redis.sentinel``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from chongming_redis.stores._redis.packer import PACKER
from chongming_redis.stores._redis.sentinel import (
    async_sentinel_client,
    is_sentinel_url,
    sentinel_client,
)

T = TypeVar("T")


def connect(
    url: str, *, socket_timeout: float, socket_connect_timeout: float, retries: int, **options: Any
) -> redis.Redis:
    """A binary client (``decode_responses=False``) on ``url``; connects to nothing yet.
    Each command is retried ``retries`` times with backoff; ``ValueError`` for a bad URL.
    Its connections pack commands with ``packer.PACKER`` (a signal handler that raises
    mid-command must not crash the process)."""
    make = sentinel_client if is_sentinel_url(url) else redis.Redis.from_url
    return client_from_url(make, url, Retry, socket_timeout=socket_timeout, retries=retries,
                           socket_connect_timeout=socket_connect_timeout, command_packer=PACKER,
                           **options)  # fmt: skip


def connect_async(
    url: str, *, socket_timeout: float, socket_connect_timeout: float, retries: int, **options: Any
) -> redis.asyncio.Redis:
    """``connect`` on ``redis.asyncio`` (it connects at the first command)."""
    make = async_sentinel_client if is_sentinel_url(url) else redis.asyncio.Redis.from_url
    return client_from_url(make, url, AsyncRetry, socket_timeout=socket_timeout, retries=retries,
                           socket_connect_timeout=socket_connect_timeout, **options)  # fmt: skip


def client_from_url(
    make: Callable[..., T],
    url: str,
    retry_class: type[Retry] | type[AsyncRetry],
    *,
    socket_timeout: float,
    socket_connect_timeout: float,
    retries: int,
    **options: Any,
) -> T:
    """``make(url, ...)`` (a redis-py ``from_url``: one server, Sentinel, Cluster, sync or
    asyncio) with the store's client settings: the timeouts, ``retries`` with a capped
    exponential backoff, binary replies. A URL redis-py refuses is ``ValueError`` naming it, and
    so is a database that is not a number (redis-py reads ``redis://host/abc`` as database 0)."""
    _check_database(url)
    try:
        return make(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            retry=retry_class(ExponentialBackoff(cap=1.0, base=0.05), retries),
            decode_responses=False,
            **options,
        )
    except ValueError as exc:
        raise ValueError(f"bad Redis URL {url!r}: {exc}") from None


def _check_database(url: str) -> None:
    """``redis://host/N`` and ``rediss://host/N``: ``N`` a database number, or nothing."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"bad Redis URL {url!r}: the database must be a number, not {path!r}")
