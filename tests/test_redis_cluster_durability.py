"""``durability_replicas`` on Redis Cluster: each write, a barrier ``SET {ns}:wait`` and
``WAIT`` in one pipeline on the namespace's slot master (``_redis.cluster.ClusterCalls``).

On the session's 3-master/3-replica cluster: every write call sends one ``WAIT`` and one
barrier to the slot's master, every read none, and the moment a write returns, that master's
replica holds exactly what the master holds. With the replica stopped (SIGSTOP, shorter than
the cluster's node timeout) a write is ``StoreUnavailable`` after its ``WAIT`` timeout, reads
still work, and once it is back a retry meets the first attempt's write (a conflict naming
it), never a second bump. A flushed script cache is loaded again; a write sent to a master
that lost the slot (``MOVED``) or during the slot's migration waits it out and lands once, and
so do writes of every kind from four threads during a slow migration and during ``CLUSTER
FAILOVER``; a ``MOVED`` reply with a confirming ``WAIT`` behind it is never a success, nor a
``WAIT`` cut short by a demotion. After kill -9 of the master (on a cluster of the test's
own) no write is acknowledged until the promoted replica has a replica again, and every
acknowledged version survives. The check at open asks the slot's master. The async store
waits the same way. The CLI's ``--cluster --durability-replicas 1`` runs a worker to the end.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from chongming_redis import Command, CommandKind, StoreUnavailable, TaskSnapshot, TaskStatus
from chongming_redis.embedded.redis_cluster import ClusterNode, RedisClusterProcs
from chongming_redis.errors import ConcurrencyConflict
from chongming_redis.model import TaskQuery, Transition
from chongming_redis.stores._redis.durability import PrimaryDemoted, WaitForReplicas, write_barrier
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.redis_async import AsyncRedisTaskStore
from tests.test_cli import APP, ROOT, cli, ok
from tests.test_redis_cluster import Hammer, check_everything_written_once, count_refusals

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def task(task_id: str, version: int = 1, **fields: Any) -> TaskSnapshot:
    return TaskSnapshot(task_id, "job", TaskStatus.PENDING, version, T0, T0, **fields)


@pytest.fixture
def store(redis_cluster: RedisClusterProcs, namespace: str) -> Iterator[RedisTaskStore]:
    made = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True,
                                   durability_replicas=1)  # fmt: skip
    yield made
    made.drop_namespace()
    made.close()


def holders(cluster: RedisClusterProcs, store: RedisTaskStore) -> tuple[ClusterNode, ClusterNode]:
    """The namespace's slot master and its replica, as the cluster says now."""
    master = cluster.master_of(cluster.keyslot(store.keys.root))
    return master, cluster.replica_of(master)


def dump(cluster: RedisClusterProcs, port: int, namespace: str) -> dict[bytes, bytes]:
    """Every key of the namespace on one node (a replica read with ``READONLY``)."""
    with redis.Redis(host="127.0.0.1", port=port, single_connection_client=True) as client:
        client.execute_command("READONLY")  # type: ignore[no-untyped-call]
        keys = sorted(client.scan_iter(match="{" + namespace + "}:*", count=1000))
        return {key: client.dump(key) for key in keys}  # type: ignore[misc]


def load_scripts(cluster: RedisClusterProcs, master: ClusterNode, store: RedisTaskStore) -> None:
    """Every script on the master (the async store's too: the same text), so that each call
    is one ``EVALSHA``, never a ``NOSCRIPT`` and a second pipeline."""
    with cluster.client(master.port) as node:
        for script in store._scripts.values():
            node.script_load(script.script)


def sent(cluster: RedisClusterProcs, port: int) -> tuple[int, int]:
    """How many ``WAIT`` and ``SET`` the node has run so far."""
    with cluster.client(port) as client:
        stats = client.info("commandstats")
    return tuple(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("wait", "set"))  # type: ignore[return-value]


def test_every_write_is_on_the_replica_when_it_returns_and_reads_never_wait(
    redis_cluster: RedisClusterProcs, store: RedisTaskStore, namespace: str
) -> None:
    master, replica = holders(redis_cluster, store)
    load_scripts(redis_cluster, master, store)
    now = T0 + timedelta(seconds=1)
    writes: dict[str, Callable[[], object]] = {
        "create": lambda: store.create(task("a", lease_owner="w", lease_until=now)),
        "save": lambda: store.save(task("a", 2, params={"x": 1}), expect_version=1),
        "touch": lambda: store.touch("a", heartbeat_at=now),
        "append": lambda: store.append(
            Transition("a", 2, TaskStatus.PENDING, TaskStatus.PENDING, now)
        ),
        "submit_command": lambda: store.submit_command(Command("c1", "a", CommandKind.STOP, T0)),
        "claim_commands": lambda: store.claim_commands(now=now, lease_seconds=30),
        "release_command": lambda: store.release_command("c1", now=now),
        "complete_command": lambda: store.complete_command("c1", now=now, outcome="ok"),
        "commit_tasks": lambda: store.commit_tasks([(task("b"), None, [])]),
        # once per namespace, before its first start (two pending tasks: one script call)
        "prepare_start_order": lambda: store.prepare_start_order(),
        "start_tasks": lambda: store.start_tasks(
            owner="w", now=now, lease_until=now + timedelta(seconds=30), buckets=[0]
        ),
        "pool_tick": lambda: store.pool_tick(
            worker="w", now=now, lease_seconds=5, num_buckets=4, wanted=[0]
        ),
        "record_task_types": lambda: store.record_task_types(["job"]),  # SADD, not a script
        "finish": lambda: store.save(
            task("a", 9).evolve(status=TaskStatus.SUCCEEDED), expect_version=3
        ),
        "prune": lambda: store.prune(keep_terminal=0),
    }
    for name, write in writes.items():
        before = sent(redis_cluster, master.port)
        write()
        after = sent(redis_cluster, master.port)
        assert (after[0] - before[0], after[1] - before[1]) == (1, 1), name
        # The call returned: the slot master's replica already holds what the master holds.
        held = dump(redis_cluster, master.port, namespace)
        assert dump(redis_cluster, replica.port, namespace) == held, name
    assert store.get("a") is None and store.get("b") is not None  # pruned, started
    assert held[store.keys.wait_barrier_key.encode()] is not None  # the barrier is a key
    before = sent(redis_cluster, master.port)
    store.get("b")
    store.query(TaskQuery())
    store.counts()
    store.history("b")
    store.changes("0")
    store.server_time()
    store.task_types()
    assert sent(redis_cluster, master.port) == before


def test_the_check_at_open_asks_the_slot_master(
    redis_cluster: RedisClusterProcs, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="chongming_redis.store"):
        two = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True,
                                      durability_replicas=2, durability_timeout=0.1)  # fmt: skip
    try:
        assert any("but the server has 1 connected replica(s)" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
        with pytest.raises(StoreUnavailable, match="only 1 of 2 replica"):
            two.create(task("a"))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="chongming_redis.store"):
            RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True,
                                    durability_replicas=1).close()  # fmt: skip
        assert not [r for r in caplog.records if "replica" in r.getMessage()]
    finally:
        two.drop_namespace()
        two.close()


def test_a_stopped_replica_makes_writes_unavailable_and_a_retry_is_consistent(
    redis_cluster: RedisClusterProcs, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True,
                                    durability_replicas=1, durability_timeout=0.3)  # fmt: skip
    plain = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True)
    master, replica = holders(redis_cluster, store)
    try:
        store.create(task("a"))
        # Stopped for well under the cluster's node timeout (2 s): nobody fails it over.
        redis_cluster.server(replica.port).sigstop()
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match=r"only 0 of 1 replica\(s\) confirmed"):
                store.save(task("a", 2), expect_version=1)
            assert time.monotonic() - began >= 0.3  # WAIT waited its whole timeout
            got = store.get("a")  # reads do not wait: they see the unconfirmed save
            assert got is not None and got.status_version == 2
            assert store.counts()[TaskStatus.PENDING] == 1
            plain.touch("a", heartbeat_at=T0)  # without durability_replicas: acknowledged
        finally:
            redis_cluster.server(replica.port).sigcont()
        redis_cluster.wait_stable()
        # The retry meets the first attempt's write: a conflict that shows it, no second bump.
        with pytest.raises(ConcurrencyConflict) as conflict:
            store.save(task("a", 2), expect_version=1)
        assert conflict.value.actual == 2
        store.save(task("a", 3, heartbeat_at=T0), expect_version=2)
        held = dump(redis_cluster, replica.port, namespace)
        assert held == dump(redis_cluster, master.port, namespace)
        assert plain.get("a") == task("a", 3, heartbeat_at=T0)
    finally:
        store.drop_namespace()
        store.close()
        plain.close()


def test_a_flushed_script_cache_is_loaded_again(
    redis_cluster: RedisClusterProcs, store: RedisTaskStore, namespace: str
) -> None:
    store.create(task("a"))
    master, replica = holders(redis_cluster, store)
    with redis_cluster.client(master.port) as node:
        node.script_flush()
    store.save(task("a", 2), expect_version=1)  # NOSCRIPT on the master, loaded, sent again
    assert dump(redis_cluster, replica.port, namespace) == dump(
        redis_cluster, master.port, namespace
    )
    assert store.get("a") == task("a", 2)


def test_a_moved_reply_is_never_a_success() -> None:
    """The ``WAIT`` behind a ``MOVED`` (or a refused barrier) counted replicas of nothing: the
    refusal is raised for the caller to send the call again, whatever ``WAIT`` said."""
    rule = WaitForReplicas(1, 0.1, write_barrier("{ns}:wait"))

    def judged(replies: list[Any]) -> Any:
        return rule.evalsha_via(lambda commands: replies, lambda: "sha",
                                _Script(), ["{ns}:t:a"], [])  # type: ignore[arg-type]  # fmt: skip

    moved = redis.exceptions.MovedError("3999 127.0.0.1:7001")
    with pytest.raises(redis.exceptions.MovedError):
        judged([moved, moved, 1])
    with pytest.raises(redis.exceptions.AskError):  # the script ran, its barrier did not
        judged([[b"ok"], redis.exceptions.AskError("3999 127.0.0.1:7001"), 1])
    with pytest.raises(redis.exceptions.TryAgainError):
        judged([redis.exceptions.TryAgainError("Multiple keys request during rehashing"), 1, 1])
    with pytest.raises(StoreUnavailable, match="only 0 of 1"):
        judged([[b"ok"], True, 0])
    unblocked = redis.exceptions.ResponseError(
        "UNBLOCKED force unblock from blocking operation, instance state changed (master -> "
        "replica?)"
    )  # a failover while WAIT waited: sent again (a lost connection), never a StoreError
    with pytest.raises(PrimaryDemoted, match="stopped being a primary"):
        judged([[b"ok"], True, unblocked])
    assert judged([[b"ok"], True, 1]) == [b"ok"]


class _Script:
    sha, script = "sha", "return 1"


def test_a_write_to_a_master_that_lost_the_slot_follows_it_once(
    redis_cluster: RedisClusterProcs, store: RedisTaskStore, namespace: str
) -> None:
    store.create(task("a"))
    slot = redis_cluster.keyslot(store.keys.root)
    source = redis_cluster.master_of(slot)
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    redis_cluster.move_slot(slot, target.port)  # the store's slot map still names the source
    store.save(task("a", 2), expect_version=1)  # MOVED, map updated, sent to the target
    assert store._cluster is not None and store._cluster.node().port == target.port
    replica = redis_cluster.replica_of(target)
    assert dump(redis_cluster, replica.port, namespace) == dump(
        redis_cluster, target.port, namespace
    )
    with pytest.raises(ConcurrencyConflict):  # applied once
        store.save(task("a", 2), expect_version=1)


def test_a_write_during_the_slot_migration_waits_and_lands_once(
    redis_cluster: RedisClusterProcs, store: RedisTaskStore, namespace: str
) -> None:
    """A ``save`` sent while half the slot's keys have moved is refused on both masters
    (``TRYAGAIN``/``ASK``, the barrier too), retried until the move is over, then applied
    once and replicated by the new master."""
    for i in range(4):
        store.create(task(f"a{i}"))
    slot = redis_cluster.keyslot(store.keys.root)
    source = redis_cluster.master_of(slot)
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    saved: list[BaseException | None] = []
    with redis_cluster.client(source.port) as src, redis_cluster.client(target.port) as dst:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source.node_id)  # type: ignore[no-untyped-call]
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target.node_id)  # type: ignore[no-untyped-call]
        moved = [store.keys.task("a0"), store.keys.wait_barrier_key]
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *moved)  # type: ignore[no-untyped-call]

        def save() -> None:
            try:
                store.save(task("a3", 2), expect_version=1)
                saved.append(None)
            except BaseException as exc:
                saved.append(exc)

        thread = threading.Thread(target=save)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and not saved  # waiting for the migration to end
        redis_cluster.move_slot(slot, target.port)
    thread.join(30)
    assert saved == [None]
    assert store.get("a3") == task("a3", 2)
    with pytest.raises(ConcurrencyConflict) as conflict:
        store.save(task("a3", 2), expect_version=1)
    assert conflict.value.actual == 2
    replica = redis_cluster.replica_of(redis_cluster.master_of(slot))
    assert dump(redis_cluster, replica.port, namespace) == dump(
        redis_cluster, target.port, namespace
    )


def test_writes_of_every_kind_during_a_reshard_all_land_once(
    redis_cluster: RedisClusterProcs, store: RedisTaskStore, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    slot = redis_cluster.keyslot(store.keys.root)
    source = redis_cluster.master_of(slot)
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    refusals = count_refusals(monkeypatch)
    with Hammer(store) as hammer:
        hammer.wait_for(10)
        redis_cluster.move_slot(slot, target.port, batch=2, pause=0.01)
        hammer.wait_for(3)
    assert hammer.errors == []
    assert refusals  # the writes met the migration and waited it out
    check_everything_written_once(store, hammer.done)


def test_writes_during_a_failover_of_the_namespace_master_all_land_once(
    redis_cluster: RedisClusterProcs, store: RedisTaskStore, namespace: str
) -> None:
    """``CLUSTER FAILOVER``: the old master answers ``MOVED`` (to its replica, now the master,
    which lacks the scripts), and becomes the new master's replica, which ``WAIT`` counts."""
    master, _ = holders(redis_cluster, store)
    with Hammer(store) as hammer:
        hammer.wait_for(5)
        promoted = redis_cluster.failover(master.port)
        hammer.wait_for(3)
    assert hammer.errors == []
    assert holders(redis_cluster, store)[0].port == promoted
    check_everything_written_once(store, hammer.done)
    new_master, replica = holders(redis_cluster, store)
    store.create(task("after"))
    assert dump(redis_cluster, replica.port, namespace) == dump(
        redis_cluster, new_master.port, namespace
    )


@pytest.fixture
def own_cluster(redis_cluster: RedisClusterProcs) -> Iterator[RedisClusterProcs]:
    """A cluster of its own, for a test that kills a master (the session's stays untouched;
    asking for it skips, or fails in CI, without redis-server and redis-cli)."""
    cluster = RedisClusterProcs()
    yield cluster
    cluster.close()


def test_a_dead_master_never_acknowledges_and_its_promoted_replica_waits_for_a_replica(
    own_cluster: RedisClusterProcs, namespace: str
) -> None:
    """kill -9 of the namespace's master: writes are ``StoreUnavailable`` (the master is
    unreachable, then the promoted replica has no replica of its own: "only 0 of 1")
    until the old master is back as the new one's replica; then the writes are confirmed
    again, and every acknowledged version is there."""
    store = RedisTaskStore.from_url(own_cluster.url, namespace=namespace, cluster=True,
                                    durability_replicas=1, durability_timeout=0.3)  # fmt: skip
    try:
        store.create(task("a"))
        for version in range(2, 6):
            store.save(task("a", version), expect_version=version - 1)
        master, replica = holders(own_cluster, store)
        dead = own_cluster.server(master.port)
        dead.kill9()
        refusals: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with pytest.raises(StoreUnavailable) as refused:  # never acknowledged
                store.save(task("a", 6), expect_version=5)
            refusals.append(str(refused.value))
            if "only 0 of 1" in refusals[-1]:  # promoted, alone
                break
            time.sleep(0.1)
        assert "only 0 of 1" in refusals[-1], refusals[-3:]
        with own_cluster.client(replica.port) as promoted:
            assert promoted.info("replication")["role"] == "master"
        dead.restart()  # rejoins as the promoted node's replica
        own_cluster.wait_stable()
        # wait_stable can pass while the restarted node still calls itself a (slotless) master,
        # before gossip turns it into the promoted node's replica: wait for that link itself.
        wait_for_online_replica(own_cluster, replica.port)
        # The link is up, but the replica may still be loading its first full sync on a busy
        # machine: a WAIT in that window confirms nothing yet. Retrying is safe (it is what the
        # error says); a confirmed write must come within a few seconds.
        confirm_by = time.monotonic() + 15
        while True:
            try:
                store.save(task("a", 6), expect_version=5)
                break
            except ConcurrencyConflict as conflict:  # an unconfirmed attempt had landed
                assert conflict.actual == 6
                break
            except StoreUnavailable as exc:
                assert time.monotonic() < confirm_by, exc
                time.sleep(0.2)
        store.save(task("a", 7), expect_version=6)
        assert store.get("a") == task("a", 7)
        assert dump(own_cluster, master.port, namespace) == dump(
            own_cluster, replica.port, namespace
        )  # the old master, now the replica, holds it all
    finally:
        store.close()


def wait_for_online_replica(cluster: RedisClusterProcs, port: int, timeout: float = 30.0) -> None:
    """Until the master on ``port`` has a replica whose link is online (``WAIT`` can count it)."""
    deadline = time.monotonic() + timeout
    while True:
        with cluster.client(port) as master:
            replication = master.info("replication")
        replicas = [v for k, v in replication.items() if k.startswith("slave") and k[5:].isdigit()]
        if any(isinstance(r, dict) and r.get("state") == "online" for r in replicas):
            return
        assert time.monotonic() < deadline, f"no online replica of {port}: {replication}"
        time.sleep(0.05)


def test_the_async_store_waits_on_the_slot_master(
    redis_cluster: RedisClusterProcs, store: RedisTaskStore, namespace: str
) -> None:
    master, replica = holders(redis_cluster, store)

    async def main() -> None:
        made = AsyncRedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True,
                                        durability_replicas=1, durability_timeout=0.3)  # fmt: skip
        try:
            load_scripts(redis_cluster, master, store)
            assert await made.commit_tasks([(task("a"), None, [])]) == [None]
            before = sent(redis_cluster, master.port)
            assert await made.commit_tasks([(task("b"), None, [])]) == [None]
            await made.submit_command(Command("c1", "a", CommandKind.STOP, T0))
            after = sent(redis_cluster, master.port)
            assert (after[0] - before[0], after[1] - before[1]) == (2, 2)
            assert dump(redis_cluster, replica.port, namespace) == dump(
                redis_cluster, master.port, namespace
            )
            await made.get("a")
            await made.query()
            assert sent(redis_cluster, master.port) == after  # reads never wait
            with redis_cluster.client(master.port) as node:
                node.script_flush()
            assert await made.commit_tasks([(task("c"), None, [])]) == [None]  # NOSCRIPT
            redis_cluster.server(replica.port).sigstop()
            try:
                with pytest.raises(StoreUnavailable, match="only 0 of 1"):
                    await made.commit_tasks([(task("d"), None, [])])
            finally:
                redis_cluster.server(replica.port).sigcont()
        finally:
            await made.aclose()

    asyncio.run(main())
    redis_cluster.wait_stable()
    assert store.get("c") is not None and store.get("d") is not None  # on the master


def test_a_cli_worker_with_cluster_and_durability_replicas_finishes_tasks(
    redis_cluster: RedisClusterProcs, store: RedisTaskStore, namespace: str
) -> None:
    where = (f"--redis={redis_cluster.url}", f"--namespace={namespace}", "--cluster",
             "--durability-replicas=1")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    worker = subprocess.Popen(
        [sys.executable, "-m", "chongming_redis.cli", "worker", APP, *where,
         "--log-level=WARNING", "--worker-lease=2"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ids = ok(cli("submit", APP, "work", "--count=6", *where)).split()
        ok(cli("wait", *ids, *where, "--timeout=60"))
    finally:
        worker.send_signal(signal.SIGINT)
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    warnings = [line for line in stderr.splitlines() if " WARNING " in line]
    assert all("shutting down" in line for line in warnings), stderr  # no outage, no refusal
    master, replica = holders(redis_cluster, store)
    held = dump(redis_cluster, replica.port, namespace)
    for task_id in ids:
        snapshot = store.get(task_id)
        assert snapshot is not None and snapshot.status is TaskStatus.SUCCEEDED
        assert (
            held[store.keys.task(task_id).encode()]
            == dump(redis_cluster, master.port, namespace)[store.keys.task(task_id).encode()]
        )
