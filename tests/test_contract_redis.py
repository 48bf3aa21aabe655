"""The shipped ``StoreContract`` bound to ``RedisTaskStore`` on a real redis-server 7.x, and
on fakeredis.

Every test gets a fresh namespace on one session-wide server: namespaces are the isolation
unit, so this also proves that stores in different namespaces of one database never see each
other's data.

fakeredis runs the same Lua (through lupa) in legacy mode: it understands neither ``#!lua``
shebangs nor ``EVALSHA_RO``, so the store drops the shebang and runs the read-only query script
with plain ``EVALSHA``. Everything else is the same code path.
"""

from __future__ import annotations

import uuid

import fakeredis
import pytest

from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.testing.store_contract import StoreContract
from tests.support.redis_server import RedisProc


class TestRedisStoreContract(StoreContract):
    server: RedisProc

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _server(cls, redis_proc: RedisProc) -> None:
        # Class scope: bound before the function-scoped setup_method creates the store.
        cls.server = redis_proc

    def make_store(self) -> TaskStore:
        return RedisTaskStore.from_url(self.server.url, namespace=f"c-{uuid.uuid4().hex[:12]}")


class TestFakeRedisStoreContract(StoreContract):
    def make_store(self) -> TaskStore:
        client = fakeredis.FakeRedis(decode_responses=False)
        store = RedisTaskStore(client, namespace="contract", check_server=False)
        assert store.legacy_scripts, "fakeredis has no script flags; legacy mode expected"
        return store
