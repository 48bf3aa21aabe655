"""The ``StoreContract`` bound to the reference implementation, ``InMemoryTaskStore``."""

from __future__ import annotations

from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.testing.store_contract import StoreContract


class TestInMemoryStoreContract(StoreContract):
    def make_store(self) -> TaskStore:
        return InMemoryTaskStore()
