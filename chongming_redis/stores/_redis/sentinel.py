"""A Redis primary found through Sentinel: ``redis+sentinel://`` URLs.

::

    redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]

names the Sentinels to ask (at least one; the port defaults to 26379), the service (the name
given to ``sentinel monitor``) and the database (default 0). The user and password, if any,
are the data nodes' (the primary's and replicas'); the Sentinels are asked without one. No
query string: timeouts and retries are ``RedisTaskStore.from_url``'s arguments.

The client is redis-py's ``Sentinel(...).master_for(service)``: each new connection asks the
Sentinels for the current primary, and a connection to a primary that was demoted (``READONLY``)
or died is dropped and made again, so after a failover the store's next call (or redis-py's
retry of it) reaches the new primary. Scripts missing there (``NOSCRIPT``) are loaded again by
the store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.sentinel import Sentinel

SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
FORM = "redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]"


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel_url(url: str) -> bool:
    return url.partition(":")[0].lower() == SCHEME


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The parts of a ``redis+sentinel://`` URL; ``ValueError`` naming the form if it is not
    one (the message never shows the password)."""
    parts = urlsplit(url)
    if parts.scheme.lower() != SCHEME:
        raise ValueError(f"not a Sentinel URL: expected {FORM}")
    if parts.query or parts.fragment:
        raise ValueError(f"a Sentinel URL takes no query or fragment: {FORM}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    sentinels = tuple(_host_port(item) for item in hosts.split(","))
    path = [unquote(p) for p in parts.path.split("/")[1:]]
    if not path or not path[0] or len(path) > 2:
        raise ValueError(f"a Sentinel URL names the service after the hosts: {FORM}")
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"the database must be a number, not {path[1]!r}: {FORM}")
        db = int(path[1])
    return SentinelUrl(sentinels, path[0], db, unquote(username) or None,
                       unquote(password) if userinfo else None)  # fmt: skip


def _host_port(item: str) -> tuple[str, int]:
    host, colon, port = item.rpartition(":")
    if not colon:
        host, port = item, str(DEFAULT_SENTINEL_PORT)
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad Sentinel address {item!r}: {FORM}")
    return host, int(port)


class SentinelRedis(redis.Redis):
    """The primary's client; closing it also closes the connections to the Sentinels."""

    def close(self) -> None:
        super().close()
        self.connection_pool.sentinel_manager.close()  # type: ignore[attr-defined]


class AsyncSentinelRedis(redis.asyncio.Redis):
    """``SentinelRedis`` on ``redis.asyncio``."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        await self.connection_pool.sentinel_manager.aclose()  # type: ignore[attr-defined]


def sentinel_client(url: str, **options: Any) -> redis.Redis:
    """A ``redis.Redis`` on the primary the Sentinels of ``url`` name, followed across
    failovers (closing it closes the Sentinels' connections too). ``options`` (timeouts,
    ``retry``, ``decode_responses``...) apply to the data connections; the Sentinels are asked
    with the same timeouts. Connects to nothing yet."""
    target = parse_sentinel_url(url)
    timeouts = {k: options[k] for k in ("socket_timeout", "socket_connect_timeout") if k in options}
    # Through Any: redis-py 8.1 leaves Sentinel untyped, 8.2 types it (narrower than we pass).
    make: Any = Sentinel
    sentinel = make(list(target.sentinels), sentinel_kwargs=timeouts)
    auth = {"username": target.username, "password": target.password}
    client: redis.Redis = sentinel.master_for(
        target.service, redis_class=SentinelRedis, db=target.db,
        **{k: v for k, v in auth.items() if v is not None}, **options,
    )  # fmt: skip
    return client


def async_sentinel_client(url: str, **options: Any) -> redis.asyncio.Redis:
    """``sentinel_client`` on ``redis.asyncio`` (``AsyncRedisTaskStore``)."""
    target = parse_sentinel_url(url)
    timeouts = {k: options[k] for k in ("socket_timeout", "socket_connect_timeout") if k in options}
    make: Any = AsyncSentinel  # as above: typed only from redis-py 8.2
    sentinel = make(list(target.sentinels), sentinel_kwargs=timeouts)
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    client: redis.asyncio.Redis = sentinel.master_for(
        target.service, redis_class=AsyncSentinelRedis, db=target.db,
        **{k: v for k, v in auth.items() if v is not None}, **options,
    )  # fmt: skip
    return client
