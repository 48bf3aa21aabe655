"""The plain redis-py clients of a stress run (the harness's namespace checks and clean-up, the
stress app's side-effect lists and clock records): one server's ``redis.Redis``, or on a Redis
Cluster (``--cluster``; ``CLUSTER_ENV`` in the workers) a ``RedisCluster`` that routes each
command by its key. Every key of a run carries the namespace's hash tag (``{ns}:...`` for the
store, ``stress:{ns}:...`` for the app), so a run's keys share one slot."""

from __future__ import annotations

import os
from typing import Any

import redis
from redis.cluster import RedisCluster

from chongming_redis.env import CLUSTER_ENV


def cluster_from_env() -> bool:
    """Whether ``CLUSTER_ENV`` says the URL names a cluster node (as the CLI reads it)."""
    return os.environ.get(CLUSTER_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def client_for(url: str, *, cluster: bool, **options: Any) -> Any:
    """A client of ``url``: a ``RedisCluster`` when ``cluster``, else a ``redis.Redis``."""
    if cluster:
        return RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


def server_time(client: Any, key: str) -> tuple[int, int]:
    """``TIME`` of the server that holds ``key`` (on a cluster: its slot's master, whose
    clock the store's scripts use), as ``(seconds, microseconds)``."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        reply = client.execute_command("TIME", target_nodes=node)  # type: ignore[no-untyped-call]
    else:
        reply = client.time()
    seconds, micros = reply
    return int(seconds), int(micros)
