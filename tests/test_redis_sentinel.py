"""``redis+sentinel://`` URLs: the store on the primary that Redis Sentinel names.

The URL forms and their refusals (a ``StoreUrlError`` before anything is opened, the password
never shown); then real Sentinels (``tests/support/replicated_redis.py``) watching a primary
and its replica: ``RedisTaskStore.from_url``, ``Client.from_url``, ``AsyncClient.from_url``
and the CLI's ``--redis`` open the store through them, and after a failover Sentinel
coordinates (``SENTINEL FAILOVER``: the old primary becomes a replica) the same store object
writes to the new primary, its scripts loaded there again. (The forced failover, kill -9 of
the primary: ``stress/test_failover.py``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from chongming_redis import TaskSnapshot, TaskStatus
from chongming_redis.client.client import Client
from chongming_redis.client.client_async import AsyncClient
from chongming_redis.stores._redis.sentinel import SentinelUrl, parse_sentinel_url
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.urls import StoreUrlError, parse_store_url, shown_url
from tests.support.redis_server import RedisProc
from tests.support.replicated_redis import (
    SERVICE,
    Sentinels,
    start_primary,
    start_replica,
    wait_replicas,
)
from tests.test_cli import cli, ok

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("redis+sentinel://h:26380/svc", SentinelUrl((("h", 26380),), "svc")),
        ("redis+sentinel://a:1,b:2,c/s/3", SentinelUrl((("a", 1), ("b", 2), ("c", 26379)), "s", 3)),
        ("redis+sentinel://:p%40ss@h:1/svc", SentinelUrl((("h", 1),), "svc", password="p@ss")),
        ("redis+sentinel://u:pw@[::1]:1/s", SentinelUrl((("::1", 1),), "s", 0, "u", "pw")),
        ("REDIS+SENTINEL://h:1/svc/0", SentinelUrl((("h", 1),), "svc")),
    ],
)  # fmt: skip
def test_sentinel_url_forms(url: str, parsed: SentinelUrl) -> None:
    assert parse_sentinel_url(url) == parsed
    assert parse_store_url(url).kind == "redis"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://h:1", "names the service"),
        ("redis+sentinel://h:1/", "names the service"),
        ("redis+sentinel://h:1/svc/0/x", "names the service"),
        ("redis+sentinel://h:1/svc/x", "the database must be a number"),
        ("redis+sentinel://h:x/svc", "bad Sentinel address"),
        ("redis+sentinel://h:1,:2/svc", "bad Sentinel address"),
        ("redis+sentinel://h:70000/svc", "bad Sentinel address"),
        ("redis+sentinel://h:1/svc?db=1", "no query"),
        ("redis+sentinel://:secret@h:1/svc/x", "the database must be a number"),
    ],
)
def test_bad_sentinel_urls_are_refused_before_anything_is_opened(url: str, message: str) -> None:
    with pytest.raises(StoreUrlError, match=message) as refused:
        parse_store_url(url)
    assert "secret" not in str(refused.value)
    with pytest.raises(ValueError, match=message):
        RedisTaskStore.from_url(url, namespace="ns")


def test_a_sentinel_url_hides_its_password() -> None:
    assert (
        shown_url("redis+sentinel://u:secret@a:1,b:2/svc/1")
        == "redis+sentinel://u:***@a:1,b:2/svc/1"
    )
    assert shown_url("redis+sentinel://a:1,b:2/svc") == "redis+sentinel://a:1,b:2/svc"


@pytest.fixture(scope="module")
def watched(request: pytest.FixtureRequest) -> Iterator[tuple[RedisProc, RedisProc, Sentinels]]:
    """A primary, its replica and three Sentinels watching them."""
    request.getfixturevalue("redis_proc")  # skips, or fails in CI, without redis-server
    primary = start_primary()
    replica = start_replica(primary.port)
    sentinels = None
    try:
        wait_replicas(primary, 1)
        sentinels = Sentinels(primary.port, 3)
        yield primary, replica, sentinels
    finally:
        if sentinels is not None:
            sentinels.close()
        replica.close()
        primary.close()


async def read_async(url: str, namespace: str, task_id: str) -> bool:
    async with AsyncClient.from_url(url, namespace=namespace) as client:
        return await client.get(task_id) is not None


def task(task_id: str, version: int = 1) -> TaskSnapshot:
    return TaskSnapshot(task_id, "job", TaskStatus.PENDING, version, T0, T0)


@pytest.mark.redis
@pytest.mark.timeout(120)
def test_the_store_follows_sentinel_to_the_new_primary(
    watched: tuple[RedisProc, RedisProc, Sentinels], namespace: str
) -> None:
    primary, replica, sentinels = watched
    store = RedisTaskStore.from_url(sentinels.url, namespace=namespace, durability_replicas=1)
    store.create(task("a"))
    with primary.client() as client:  # it is the primary Sentinel names
        assert client.hget("{" + namespace + "}:t:a", "v") == b"1"
    client_ = Client.from_url(sentinels.url, namespace=namespace)
    assert client_.get("a") is not None
    shown = ok(cli("tasks", f"--redis={sentinels.url}", f"--namespace={namespace}", "--json"))
    assert '"a"' in shown
    assert asyncio.run(read_async(sentinels.url, namespace, "a"))
    with replica.client() as client:
        client.script_flush()  # the new primary has none of the store's scripts
    with sentinels.client() as sentinel:
        sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
    assert sentinels.wait_failover(primary.port) == replica.port
    wait_replicas(replica, 1)  # the old primary follows it: WAIT 1 can be met again
    store.save(task("a", 2), expect_version=1)  # READONLY or moved: reconnected, reloaded
    with replica.client() as client:
        assert client.hget("{" + namespace + "}:t:a", "v") == b"2"
    with primary.client() as client:  # now its replica, and it has the write too
        assert client.hget("{" + namespace + "}:t:a", "v") == b"2"
    assert client_.get("a") is not None
    client_.close()
    store.close()
