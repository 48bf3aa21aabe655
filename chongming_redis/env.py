"""Names of the environment variables the package reads, kept low so that any module can name
them without importing the command line."""

from __future__ import annotations

#: Hidden switch (for the stress harness): ``1`` makes ``chongming-redis`` open the store with
#: the command lease audit stream on (``RedisTaskStore(audit=True)``).
AUDIT_ENV = "CHONGMING_AUDIT"

#: ``1`` (or ``true``, ``yes``, ``on``): the Redis URL names a node of a Redis Cluster
#: (``chongming-redis ... --cluster``; the stress harness sets it for its workers and the
#: stress app reads it).
CLUSTER_ENV = "CHONGMING_REDIS_CLUSTER"

#: The Redis URL the command line's ``--redis`` defaults to, and the Redis the pytest plugin's
#: ``chongming_redis_url`` uses instead of starting one.
REDIS_ENV = "CHONGMING_REDIS_URL"
