"""The command line on Redis Cluster: ``--cluster`` (or ``CHONGMING_REDIS_CLUSTER``) with a
node's URL. The worker, the control commands and a ``--processes`` parent run on the cluster
in the parameterised real-process tests (``WITH_CLUSTER``); here: submit and every read
command against a cluster namespace, and the refusals, each one line, nothing opened.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chongming_redis.embedded.redis_cluster import RedisClusterProcs
from chongming_redis.model import TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc, free_port
from tests.test_cli import APP, cli, ok, user_error

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


def test_submit_and_the_read_commands_on_a_cluster(
    redis_cluster: RedisClusterProcs, namespace: str
) -> None:
    common = ("--redis", redis_cluster.url, "--namespace", namespace, "--cluster")
    ids = ok(cli("submit", APP, "work", "--count", "3", *common)).split()
    assert len(ids) == 3
    store = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True)
    try:
        assert store.counts()[TaskStatus.PENDING] == 3  # on the cluster, in the namespace
        listed = json.loads(ok(cli("tasks", "--json", *common)))
        assert sorted(t["task_id"] for t in listed["tasks"]) == sorted(ids)
        shown = json.loads(ok(cli("show", ids[0], "--json", *common)))
        assert shown["task"]["task_id"] == ids[0]
        stats = json.loads(ok(cli("stats", "--json", *common)))
        assert stats["counts"]["pending"] == 3
        feed = [json.loads(line) for line in ok(cli("changes", *common)).splitlines()]
        assert sorted(i["task_id"] for i in feed if "task_id" in i) == sorted(ids)
        # The environment says it as well as the flag.
        env = {"CHONGMING_REDIS_URL": redis_cluster.url, "CHONGMING_NAMESPACE": namespace,
               "CHONGMING_REDIS_CLUSTER": "1"}  # fmt: skip
        assert json.loads(ok(cli("stats", "--json", env=env)))["counts"]["pending"] == 3
        assert ok(cli("prune", "--keep", "0", *common)).startswith("pruned 0 task(s)")
    finally:
        store.drop_namespace()
        store.close()


def test_cluster_refusals_are_one_line(
    redis_proc: RedisProc, namespace: str, tmp_path: Path
) -> None:
    user_error(cli("stats", "--redis", redis_proc.url, "--namespace", namespace, "--cluster"),
               "not a Redis Cluster node")  # fmt: skip
    user_error(cli("stats", "--redis", f"redis://127.0.0.1:{free_port()}/0", "--cluster"),
               "Redis Cluster is unreachable")  # fmt: skip
    path = tmp_path / "tasks.sqlite3"
    user_error(cli("stats", "--store", f"sqlite://{path}", "--cluster"), "--cluster is for Redis")
    assert not path.exists()
    user_error(cli("worker", APP, "--cluster"), "--cluster needs --redis")
    user_error(cli("stats", "--redis", "unix:///tmp/no.sock", "--cluster"), "bad Redis URL")
