"""The shipped contracts bound to ``RedisTaskStore`` on a real Redis Cluster (3 masters, 3
replicas; ``chongming_redis/embedded/redis_cluster.py``): ``StoreContract``,
``ExtensionsContract`` and ``FeedContract``, through redis-py's ``RedisCluster``.

Every test gets a fresh namespace, so a fresh slot: the namespaces of one class land on all
three masters. One cluster client per class (``from_url(cluster=True)`` is proved on its own
in ``test_redis_cluster.py``): a client discovers six nodes, so one per test would only slow
the suite down.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from chongming_redis.embedded.redis_cluster import RedisClusterProcs
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.testing.extensions_contract import ExtensionsContract
from chongming_redis.testing.feed_contract import FeedContract
from chongming_redis.testing.store_contract import StoreContract
from tests.test_extensions_contract import REDIS


class _OnCluster:
    client: RedisCluster

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _cluster(cls, redis_cluster: RedisClusterProcs) -> Iterator[None]:
        # Class scope: bound before the function-scoped setup_method creates the store.
        cls.client = RedisCluster.from_url(redis_cluster.url, decode_responses=False)
        yield
        cls.client.close()

    def make_store(self) -> TaskStore:
        return RedisTaskStore(
            self.client, namespace=f"k-{uuid.uuid4().hex[:12]}", check_server=False
        )


class TestClusterStoreContract(_OnCluster, StoreContract):
    pass


class TestClusterExtensions(_OnCluster, ExtensionsContract):
    expected_extensions = REDIS


class TestClusterFeed(_OnCluster, FeedContract):
    pass
