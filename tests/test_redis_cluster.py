"""``RedisTaskStore`` on a real Redis Cluster (3 masters, 3 replicas): what a cluster adds to
the contracts (``test_contract_cluster.py``) — the connection and its errors, namespaces
spread over the masters, the durability check of every node, scripts reloaded where a master
lacks them, and calls that meet a slot migration or a failover of their namespace.

The migrations here move the namespace's slot while a thread keeps calling the store: every
call must succeed (a refused script is retried until the slot is stable, never run on a
half-moved slot), and what was written must all be there afterwards, once.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import redis

from chongming_redis.embedded.redis_cluster import RedisClusterProcs, namespace_in
from chongming_redis.errors import StoreError, StoreUnavailable
from chongming_redis.model import Command, CommandKind, TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores._redis import cluster as cluster_calls
from chongming_redis.stores._redis.scripts import SCRIPT_NAMES, script_text
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc, free_port

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = T0 + timedelta(seconds=30)


def task(task_id: str, bucket: int = 0) -> TaskSnapshot:
    return TaskSnapshot(task_id=task_id, name="job", status=TaskStatus.PENDING,
                        status_version=1, created_at=T0, updated_at=T0, bucket=bucket)  # fmt: skip


@pytest.fixture
def cluster_store(redis_cluster: RedisClusterProcs, namespace: str) -> Iterator[RedisTaskStore]:
    store = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True)
    yield store
    store.drop_namespace()
    store.close()


def test_from_url_opens_a_cluster_store_that_routes_by_the_namespace(
    redis_cluster: RedisClusterProcs, cluster_store: RedisTaskStore
) -> None:
    cluster_store.create(task("a"))
    assert cluster_store.get("a") == task("a")
    assert cluster_store.counts()[TaskStatus.PENDING] == 1
    assert [t.task_id for t in cluster_store.query(TaskQuery())] == ["a"]
    # Every key is on the slot's master, none elsewhere.
    slot = redis_cluster.keyslot(cluster_store.keys.task("a"))
    owner = redis_cluster.master_of(slot)
    for master in redis_cluster.masters():
        with redis_cluster.client(master.port) as node:
            held = node.execute_command("CLUSTER COUNTKEYSINSLOT", slot)  # type: ignore[no-untyped-call]
        assert (held > 0) == (master.port == owner.port)
    # The server clock is the slot master's (the one machine's clock here).
    assert abs(cluster_store.server_time() - datetime.now(UTC)) < timedelta(seconds=5)


def test_namespaces_land_on_different_masters(redis_cluster: RedisClusterProcs) -> None:
    masters = redis_cluster.masters()
    assert len(masters) == 3
    stores = []
    try:
        for i, master in enumerate(masters):
            low, high = master.slots[0]
            namespace = namespace_in((low + high) // 2, prefix=f"spread{i}-{uuid.uuid4().hex[:6]}")
            store = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True)
            stores.append(store)
            store.create(task("t"))
            store.submit_command(Command(command_id="c", task_id="t", kind=CommandKind.STOP,
                                         created_at=T0))  # fmt: skip
            with redis_cluster.client(master.port) as node:
                assert node.exists(store.keys.task("t"), store.keys.command("c")) == 2
        holders = {redis_cluster.master_of(redis_cluster.keyslot(s.keys.root)).port
                   for s in stores}  # fmt: skip
        assert holders == {m.port for m in masters}
        # Each namespace sees its own task only.
        assert all(s.counts()[TaskStatus.PENDING] == 1 for s in stores)
    finally:
        for store in stores:
            store.drop_namespace()
            store.close()


def test_unreachable_bad_urls_and_a_plain_server_are_typed_errors(namespace: str) -> None:
    with pytest.raises(StoreUnavailable, match="Redis Cluster is unreachable"):
        RedisTaskStore.from_url(f"redis://127.0.0.1:{free_port()}/0", namespace=namespace,
                                cluster=True, socket_connect_timeout=0.5)  # fmt: skip
    with pytest.raises(ValueError, match="bad Redis URL"):
        RedisTaskStore.from_url("unix:///tmp/x.sock", namespace=namespace, cluster=True)
    with pytest.raises(ValueError, match="bad Redis URL"):
        RedisTaskStore.from_url("redis://127.0.0.1:7000/3", namespace=namespace, cluster=True)
    with pytest.raises(ValueError, match="bad Redis URL"):
        RedisTaskStore.from_url("http://127.0.0.1:7000", namespace=namespace, cluster=True)
    with pytest.raises(ValueError, match="durability_replicas must be 0 or more"):  # no I/O
        RedisTaskStore.from_url("redis://127.0.0.1:1/0", namespace=namespace, cluster=True,
                                durability_replicas=-1)  # fmt: skip
    with pytest.raises(ValueError, match="namespace"):  # before any connection
        RedisTaskStore.from_url("redis://127.0.0.1:1/0", namespace="a b", cluster=True)


def test_a_server_that_is_not_a_cluster_node_is_refused(
    redis_proc: RedisProc, namespace: str
) -> None:
    with pytest.raises(StoreError, match="not a Redis Cluster node"):
        RedisTaskStore.from_url(redis_proc.url, namespace=namespace, cluster=True)


def test_the_durability_check_asks_every_node(
    redis_cluster: RedisClusterProcs, cluster_store: RedisTaskStore
) -> None:
    calls = cluster_store._cluster
    assert calls is not None
    assert calls.check_server_settings() == []
    # A replica with AOF off: promoted, it would lose acknowledged writes at its restart.
    replica = next(n for n in redis_cluster.nodes() if not n.master)
    with redis_cluster.client(replica.port) as node:
        node.config_set("appendonly", "no")
        try:
            problems = calls.check_server_settings()
        finally:
            node.config_set("appendonly", "yes")
    assert len(problems) == 1 and "appendonly is off" in problems[0]


def test_a_master_without_the_scripts_gets_them_again(
    redis_cluster: RedisClusterProcs, cluster_store: RedisTaskStore
) -> None:
    cluster_store.create(task("a"))
    owner = redis_cluster.master_of(redis_cluster.keyslot(cluster_store.keys.root))
    with redis_cluster.client(owner.port) as node:
        node.script_flush()
    cluster_store.create(task("b"))  # EVALSHA: NOSCRIPT, SCRIPT LOAD there, EVALSHA
    assert {t.task_id for t in cluster_store.query(TaskQuery())} == {"a", "b"}
    with redis_cluster.client(owner.port) as node:
        node.script_flush()
    assert {t.task_id for t in cluster_store.changes("0").tasks} == {"a", "b"}  # read-only


def test_a_slot_that_stays_half_migrated_is_unavailable_and_nothing_runs(
    redis_cluster: RedisClusterProcs, cluster_store: RedisTaskStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Half of the slot's keys moved, the other half not: no script runs on either node (a
    script on the target would read the keys not moved yet as missing and write keys the
    source still holds); single-key reads are served wherever the key is."""
    for i in range(4):
        cluster_store.create(task(f"a{i}"))
    slot = redis_cluster.keyslot(cluster_store.keys.root)
    source = redis_cluster.master_of(slot)
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    monkeypatch.setattr(cluster_calls, "MIGRATION_WAIT", 0.3)
    with redis_cluster.client(source.port) as src, redis_cluster.client(target.port) as dst:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source.node_id)  # type: ignore[no-untyped-call]
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target.node_id)  # type: ignore[no-untyped-call]
        tasks = [cluster_store.keys.task(f"a{i}") for i in range(2)]
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *tasks)  # type: ignore[no-untyped-call]
        try:
            refused: list[Callable[[], object]] = [
                lambda: cluster_store.create(task("b")),
                lambda: cluster_store.save(replace(task("a3"), status_version=2), expect_version=1),
                lambda: cluster_store.commit_tasks([(task("c"), None, [])]),
                lambda: cluster_store.query(TaskQuery()),
                lambda: cluster_store.changes("0"),
                lambda: cluster_store.prune(keep_terminal=0),
                lambda: cluster_store.start_tasks(
                    owner="w", now=T0, lease_until=LEASE, buckets=[0]
                ),
            ]
            for call in refused:
                with pytest.raises(StoreUnavailable, match="cannot serve the namespace now"):
                    call()
            assert cluster_store.get("a0") == task("a0")  # moved: served by the target (ASK)
            assert cluster_store.get("a3") == task("a3")  # not moved: served by the source
            # Nothing ran on the target: it holds the two moved keys and no other.
            held = dst.execute_command("CLUSTER GETKEYSINSLOT", slot, 100)  # type: ignore[no-untyped-call]
            assert sorted(held) == sorted(tasks)
        finally:
            redis_cluster.move_slot(slot, target.port)  # the rest of the keys, then the owner
    assert cluster_store.get("b") is None
    cluster_store.create(task("b"))
    assert cluster_store.counts()[TaskStatus.PENDING] == 5
    assert [t.task_id for t in cluster_store.query(TaskQuery())] == ["a0", "a1", "a2", "a3", "b"]


class Hammer:
    """Threads that keep calling the store, one per kind of call, so that every kind meets a
    migration or a failover: ``create`` + ``save`` of ``h<i>``, ``commit_tasks`` creating and
    then saving ``k<i>``, ``submit_command`` of ``c<i>``, and the reads (``query``,
    ``changes``, ``get``, ``counts``). Every failed call is recorded (none may fail)."""

    def __init__(self, store: RedisTaskStore) -> None:
        self.store = store
        self.done = {"h": 0, "k": 0, "c": 0, "r": 0}
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(kind,), daemon=True)
                        for kind in self.done]  # fmt: skip

    @property
    def created(self) -> int:
        """Rounds every kind of call has completed."""
        return min(self.done.values())

    def _loop(self, kind: str) -> None:
        step = getattr(self, f"_{kind}")
        while not self.stop.is_set():
            try:
                step(self.done[kind])
            except BaseException as exc:  # every failure is the finding
                self.errors.append(exc)
                return
            self.done[kind] += 1

    def _h(self, i: int) -> None:
        self.store.create(task(f"h{i}", bucket=i % 4))
        self.store.save(replace(task(f"h{i}", bucket=i % 4), status_version=2), expect_version=1)

    def _k(self, i: int) -> None:
        first = task(f"k{i}", bucket=i % 4)
        assert self.store.commit_tasks([(first, None, [])]) == [None]
        assert self.store.commit_tasks([(replace(first, status_version=2), 1, [])]) == [None]

    def _c(self, i: int) -> None:
        self.store.submit_command(Command(command_id=f"c{i}", task_id=f"h{i}",
                                          kind=CommandKind.STOP, created_at=T0))  # fmt: skip

    def _r(self, i: int) -> None:
        self.store.query(TaskQuery(limit=5, statuses=frozenset({TaskStatus.PENDING})))
        self.store.changes("0", limit=8)
        self.store.get(f"h{i // 2}")
        self.store.counts()

    def __enter__(self) -> Hammer:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def wait_for(self, rounds: int) -> None:
        """Until every kind of call completed ``rounds`` more rounds (or one failed)."""
        goal = self.created + rounds
        while self.created < goal and not self.errors:
            threading.Event().wait(0.01)


def check_everything_written_once(store: RedisTaskStore, done: dict[str, int]) -> None:
    written = sorted([f"h{i}" for i in range(done["h"])] + [f"k{i}" for i in range(done["k"])])
    assert store.counts()[TaskStatus.PENDING] == len(written)
    tasks = store.query(TaskQuery())
    assert sorted(t.task_id for t in tasks) == written
    assert all(t.status_version == 2 for t in tasks)
    claimed: list[str] = []
    while batch := store.claim_commands(now=T0, lease_seconds=30, limit=1000):
        claimed += [c.command_id for c in batch]
    assert sorted(claimed) == sorted(f"c{i}" for i in range(done["c"]))
    fed, cursor = [], "0"
    while page := store.changes(cursor, limit=256):  # every task once, at its latest
        if not page.tasks:
            break
        fed += [t.task_id for t in page.tasks if isinstance(t, TaskSnapshot)]
        cursor = page.next_cursor
    assert sorted(fed) == written


def count_refusals(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The migration refusals the store's calls meet from now on (one entry each)."""
    met: list[str] = []
    real = cluster_calls.is_migrating

    def counting(exc: BaseException) -> bool:
        if real(exc):
            met.append(str(exc))
            return True
        return False

    monkeypatch.setattr(cluster_calls, "is_migrating", counting)
    return met


def test_calls_during_a_slow_slot_migration_all_succeed_and_write_once(
    redis_cluster: RedisClusterProcs, cluster_store: RedisTaskStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    slot = redis_cluster.keyslot(cluster_store.keys.root)
    source = redis_cluster.master_of(slot)
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    refusals = count_refusals(monkeypatch)
    with Hammer(cluster_store) as hammer:
        hammer.wait_for(20)  # keys to move: a slow migration
        moved = redis_cluster.move_slot(slot, target.port, batch=2, pause=0.01)
        hammer.wait_for(3)  # a few calls after it
    assert hammer.errors == []
    assert moved > 100 and refusals  # the calls met the migration, and waited it out
    assert redis_cluster.master_of(slot).port == target.port
    check_everything_written_once(cluster_store, hammer.done)
    assert cluster_store.prune(keep_terminal=0) == 0  # a script deriving its keys, moved


def test_calls_during_redis_cli_reshard_all_succeed_and_write_once(
    redis_cluster: RedisClusterProcs,
) -> None:
    source = redis_cluster.masters()[0]
    slot = redis_cluster.lowest_slot(source.port)
    namespace = namespace_in(slot, prefix=f"reshard-{uuid.uuid4().hex[:6]}")
    store = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True)
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    try:
        with Hammer(store) as hammer:
            hammer.wait_for(20)
            redis_cluster.reshard(slot, target.port)
            hammer.wait_for(3)
        assert hammer.errors == []
        assert redis_cluster.master_of(slot).port == target.port
        check_everything_written_once(store, hammer.done)
    finally:
        store.drop_namespace()
        store.close()


def test_calls_during_a_failover_of_the_namespace_master_all_succeed(
    redis_cluster: RedisClusterProcs, cluster_store: RedisTaskStore
) -> None:
    master = redis_cluster.master_of(redis_cluster.keyslot(cluster_store.keys.root))
    with Hammer(cluster_store) as hammer:
        hammer.wait_for(10)
        promoted = redis_cluster.failover(master.port)
        hammer.wait_for(3)  # the new master's first calls may meet NOSCRIPT
    assert hammer.errors == []
    assert redis_cluster.master_of(redis_cluster.keyslot(cluster_store.keys.root)).port == (
        promoted
    )
    check_everything_written_once(cluster_store, hammer.done)


def test_the_plain_client_errors_of_a_cluster_are_unavailable() -> None:
    from chongming_redis.stores._redis import ops

    for exc in (redis.exceptions.TryAgainError("TRYAGAIN"),
                redis.exceptions.ClusterDownError("CLUSTERDOWN"),
                redis.exceptions.ClusterError("TTL exhausted."),
                redis.exceptions.SlotNotCoveredError("no node")):  # fmt: skip
        with pytest.raises(StoreUnavailable), ops.errors():
            raise exc


def test_nudges_reach_a_listener_across_a_failover_and_a_reshard(
    redis_cluster: RedisClusterProcs, namespace: str
) -> None:
    """The work nudge a create publishes (PUBLISH in ``create.lua``) reaches the runtime's
    listener (``RedisNotifier`` on the cluster client: plain pub/sub, which the cluster
    broadcasts to every node), before and after the namespace's master fails over and its
    slot moves to another master."""
    from chongming_redis.runtime.notify import WORK, RedisNotifier

    store = RedisTaskStore.from_url(redis_cluster.url, namespace=namespace, cluster=True)
    notifier = RedisNotifier(store.client, namespace)
    woken = threading.Event()
    notifier.subscribe(WORK, woken)
    try:
        assert notifier.wait_listening(10)
        slot = redis_cluster.keyslot(store.keys.root)
        for i, change in enumerate(("none", "failover", "reshard")):
            if change == "failover":
                redis_cluster.failover(redis_cluster.master_of(slot).port)
            elif change == "reshard":
                owner = redis_cluster.master_of(slot).port
                redis_cluster.move_slot(slot, next(m.port for m in redis_cluster.masters()
                                                   if m.port != owner))  # fmt: skip
            woken.clear()
            store.create(task(f"n{i}"))
            assert woken.wait(10), f"no nudge after {change}"
    finally:
        notifier.close()
        store.drop_namespace()
        store.close()


def test_client_from_url_opens_a_cluster_store(
    redis_cluster: RedisClusterProcs, cluster_store: RedisTaskStore
) -> None:
    from chongming_redis.client.client import Client
    from tests.test_client_async import app

    client = Client.from_url(redis_cluster.url, namespace=cluster_store.namespace, app=app,
                             cluster=True)  # fmt: skip
    try:
        handle = client.submit("resize", {"width": 3})
        assert cluster_store.get(handle.task_id) is not None
    finally:
        client.close()


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_a_script_that_derives_keys_declares_the_root_and_another_key(name: str) -> None:
    """The rule that keeps a script off a half-moved slot (``_redis/keys.py``,
    docs/redis-layout.md): a script that builds key names from the root declares the root and at
    least one more key, so Redis answers TRYAGAIN (or ASK then TRYAGAIN) while the slot migrates; a
    script that builds none touches only the keys it declares."""
    text = script_text(name)
    header = text.split("]]", 1)[0]
    declared = re.findall(r"^KEYS\[(\d+)\]\s+(\S+)", header, re.M)
    derives = "root .." in text.split("]]", 1)[1]
    if derives:
        assert any(key == "{ns}:" for _, key in declared), (name, declared)
        assert len(declared) >= 2, (name, declared)
    else:
        assert not re.search(r"\.\. *'[a-z-]+:", text.split("]]", 1)[1]), name
