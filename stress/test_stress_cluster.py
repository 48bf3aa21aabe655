"""The stress harness on Redis Cluster (``--redis URL --cluster``): a pool of worker processes
under the harness's faults, then its checkers (no duplicate start, completion or execution of
an attempt, no broken compare-and-set chain or history, no acknowledged write lost, commands
finished once), on the session's 3-master, 3-replica cluster.

Two runs also move the namespace while the workers run: its slot resharded to another master
with ``redis-cli --cluster reshard``, and its master failed over to its replica (``CLUSTER
FAILOVER``, so the new master has never run a script: every script meets ``NOSCRIPT`` there
first). Every task must still finish exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.cluster import RedisCluster

from chongming_redis.embedded.redis_cluster import RedisClusterProcs, namespace_in
from chongming_redis.model import TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stress.app import keys_pattern
from chongming_redis.stress.harness import Options, libfaketime, run

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]

PROXY_FAULTS = {"proxy_latency", "drop_reply", "reset_connections"}
NOT_HERE = set() if libfaketime() else {"clock_skew"}


def check_exactly_once(report: dict[str, Any]) -> None:
    assert report["violations"] == 0, report["violation_examples"]
    assert report["faults_missing"] == {}, report["fault_log"]
    assert report["ok"]
    assert report["unfinished"] == 0
    # the only failures are the task policies' on purpose (docs/reliability.md): flaky tasks
    # out of attempts, slow ones out of time
    assert set(report["failure_types"]) <= {"Flaky", "TaskTimeout"}, report["failure_types"]
    ended = report["succeeded"] + report["stopped"] + report["lost"] + report["failed"]
    assert ended == report["tasks_created"]  # a unique submit may return its holder instead
    assert report["succeeded"] > report["submitted"] // 2  # the workers really ran them
    lin = report["linearizability"]  # the workers' and the driver's calls, every one legal
    assert lin["violations"] == [] and lin["unknown"] == [], lin
    assert lin["histories"] >= report["tasks_created"]


def test_a_stress_run_on_a_cluster_skips_what_it_cannot_do_and_says_so(
    tmp_path: Path, redis_cluster: RedisClusterProcs, namespace: str
) -> None:
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "chongming_redis.stress", f"--redis={redis_cluster.url}",
         "--cluster", f"--namespace={namespace}", "--workers=2", "--tasks=40", "--seconds=8",
         "--seed=3", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    check_exactly_once(report)
    skipped = report["faults_skipped"]
    assert set(skipped) == {"redis_restart", "final_restart"} | PROXY_FAULTS | NOT_HERE
    assert all("Redis Cluster" in skipped[k] for k in PROXY_FAULTS)
    assert set(report["faults_fired"]) == {"worker_kill", "lease_holder_pause"} | (
        {"clock_skew"} - NOT_HERE
    )
    assert done.returncode == 0
    cluster = RedisCluster.from_url(redis_cluster.url)  # the run deleted its namespace
    try:
        assert list(cluster.scan_iter(match="\\{" + namespace + "\\}:*")) == []
        assert list(cluster.scan_iter(match=keys_pattern(namespace))) == []
    finally:
        cluster.close()


def stress_while(redis_cluster: RedisClusterProcs, namespace: str,
                 act: Callable[[], None]) -> dict[str, Any]:  # fmt: skip
    """A stress run on the cluster, with ``act`` done from another thread 4 to 10 s into it, once
    tasks run (the workers busy: the submissions last 85 % of the 12 s window). The run knows
    when: while the slot moves, a start round can meet ``TRYAGAIN``/``MOVED`` and the pool
    leave a slot free, which the idle-slot checker must not count (every exactly-once check
    still applies)."""
    failures: list[BaseException] = []
    running_at_act: list[int] = []
    opts = Options(redis=redis_cluster.url, cluster=True, namespace=namespace, workers=3,
                   tasks=80, seconds=12.0, seed=5, drain_seconds=60.0)  # fmt: skip

    def later() -> None:
        time.sleep(4.0)
        try:
            store = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True,
                                            check_server=False)  # fmt: skip
            # On a loaded machine the workers can still be starting at 4 s: act once they run.
            deadline = time.monotonic() + 6.0
            while (running := store.counts()[TaskStatus.RUNNING]) == 0:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            running_at_act.append(running)
            store.close()
            begin = time.time()
            opts.outside_faults.append((begin, float("inf")))  # until it is known to be over
            act()
            opts.outside_faults[-1] = (begin, time.time())
        except BaseException as exc:  # the test fails with it below
            failures.append(exc)

    actor = threading.Thread(target=later, daemon=True)
    actor.start()
    report = run(opts)
    actor.join(60)
    assert not actor.is_alive() and failures == []
    assert running_at_act[0] > 0  # the workers were running tasks when it happened
    return report


def test_a_reshard_of_the_namespace_slot_while_workers_run_loses_nothing(
    redis_cluster: RedisClusterProcs,
) -> None:
    source = redis_cluster.masters()[1]
    slot = redis_cluster.lowest_slot(source.port)  # redis-cli moves a master's lowest slot
    namespace = namespace_in(slot, prefix=f"stress-reshard-{time.time_ns() % 10**6}")
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    report = stress_while(
        redis_cluster, namespace, lambda: redis_cluster.reshard(slot, target.port)
    )
    assert redis_cluster.master_of(slot).port == target.port  # the slot really moved
    check_exactly_once(report)


def test_a_failover_of_the_namespace_master_while_workers_run_loses_nothing(
    redis_cluster: RedisClusterProcs, namespace: str
) -> None:
    slot = redis_cluster.keyslot("{" + namespace + "}:")
    master = redis_cluster.master_of(slot)
    promoted: list[int] = []
    report = stress_while(
        redis_cluster, namespace, lambda: promoted.append(redis_cluster.failover(master.port))
    )
    assert promoted and redis_cluster.master_of(slot).port == promoted[0] != master.port
    check_exactly_once(report)
