"""``durability_replicas``: a write is acknowledged only once that many replicas confirmed it.

On a real primary with one replica (``tests/support/replicated_redis.py``), behind a proxy
that counts commands: every write call sends one ``WAIT`` (and its barrier ``PUBLISH``), every
read none, and every write script of the store is among those calls; right after each write
returns, the replica's copy of the namespace is byte-identical to the primary's. With the
replica stopped (SIGSTOP) a write raises ``StoreUnavailable`` naming how many replicas
confirmed it, after waiting at least the timeout, while reads still work; a retry after the
replica is back is safe (a conflict showing the first attempt's write, never a second bump).
A server without replicas is warned about at open. ``AsyncRedisTaskStore`` waits the same way.
``durability_replicas=0`` sends no ``WAIT`` at all. Bad values are refused before any I/O.
(The failover proofs: ``stress/test_failover.py``; the CLI flag: ``test_cli_durability.py``.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from chongming_redis import Command, CommandKind, StoreUnavailable, TaskSnapshot, TaskStatus
from chongming_redis.errors import ConcurrencyConflict
from chongming_redis.model import TaskQuery, Transition
from chongming_redis.stores._redis.scripts import READ_ONLY_SCRIPTS, SCRIPT_NAMES
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.redis_async import AsyncRedisTaskStore
from chongming_redis.stress.fault_proxy import FaultProxy
from tests.support.redis_server import RedisProc, free_port
from tests.support.replicated_redis import (
    primary_with_replica,
    wait_replicas,
)
from tests.test_redis_acl import PASSWORD, add_user

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[RedisProc, RedisProc]]:
    """A primary and its replica for this module (tests that stop the replica resume it)."""
    request.getfixturevalue("redis_proc")  # skips, or fails in CI, without redis-server
    with primary_with_replica() as servers:
        yield servers


@pytest.fixture
def proxy(pair: tuple[RedisProc, RedisProc]) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", pair[0].port) as fault_proxy:
        yield fault_proxy


def task(task_id: str, version: int = 1, **fields: Any) -> TaskSnapshot:
    return TaskSnapshot(task_id, "job", TaskStatus.PENDING, version, T0, T0, **fields)


def namespace_dump(server: RedisProc, namespace: str) -> dict[bytes, bytes]:
    with server.client() as client:
        keys = sorted(client.scan_iter(match="{" + namespace + "}:*", count=1000))
        return {key: client.dump(key) for key in keys}


class Calls:
    """Runs store calls and counts the WAIT/PUBLISH commands each sent through the proxy."""

    def __init__(self, store: RedisTaskStore, proxy: FaultProxy) -> None:
        self.store, self.proxy = store, proxy
        self.scripts: set[str] = set()
        for script in store._scripts.values():  # loaded: each call is one EVALSHA, no NOSCRIPT
            script.sha = store._client.script_load(script.script)
        evaluate = store._eval

        def recording(name: str, keys: Any, args: Any) -> Any:
            self.scripts.add(name)
            return evaluate(name, keys, args)

        store._eval = recording  # type: ignore[method-assign]

    def waits(self, call: Callable[[], object]) -> tuple[int, int]:
        before = self.proxy.commands_seen
        call()
        after = self.proxy.commands_seen
        return after["WAIT"] - before["WAIT"], after["PUBLISH"] - before["PUBLISH"]


def test_every_write_waits_once_for_the_replica_and_reads_never_wait(
    pair: tuple[RedisProc, RedisProc], proxy: FaultProxy, namespace: str
) -> None:
    primary, replica = pair
    store = RedisTaskStore.from_url(proxy.url, namespace=namespace, durability_replicas=1)
    calls = Calls(store, proxy)
    now = T0 + timedelta(seconds=1)
    created = task("a", lease_owner="w", lease_until=now)
    writes: dict[str, Callable[[], object]] = {
        "create": lambda: store.create(created),
        "save": lambda: store.save(task("a", 2, params={"x": 1}), expect_version=1),
        "touch": lambda: store.touch("a", heartbeat_at=now),
        "touch_fenced": lambda: store.touch_fenced("a", expect_version=2, heartbeat_at=now),
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
        "commit_start": lambda: store.commit_and_start(
            [(task("b", 2), 1, [])],
            owner="w",
            now=now,
            lease_until=now + timedelta(seconds=30),
            buckets=[0],
        ),
        "pool_tick": lambda: store.pool_tick(
            worker="w", now=now, lease_seconds=5, num_buckets=4, wanted=[0]
        ),
        "record_task_types": lambda: store.record_task_types(["job"]),
        "write_schedule": lambda: store.write_schedule(
            "s", "v1", expect_version=0, task=task("s@tick")
        ),
        "delete_schedule": lambda: store.delete_schedule("s"),
        "release_dependents": lambda: store.release_dependents(limit=10),
        "finish": lambda: store.save(
            task("a", 9).evolve(status=TaskStatus.SUCCEEDED), expect_version=3
        ),  # version 3: started by start_tasks
        "prune": lambda: store.prune(keep_terminal=0),
        "expire_finished": lambda: store.expire_finished(now=now),
    }
    for name, write in writes.items():
        assert calls.waits(write) == (1, 1), name
        # The call returned: the replica already holds exactly what the primary holds.
        assert namespace_dump(replica, namespace) == namespace_dump(primary, namespace), name
    assert calls.scripts == set(SCRIPT_NAMES) - READ_ONLY_SCRIPTS  # every write script ran
    reads: dict[str, Callable[[], object]] = {
        "get": lambda: store.get("b"),
        "query": lambda: store.query(TaskQuery(tag="x", statuses=frozenset({TaskStatus.RUNNING}))),
        "counts": store.counts,
        "history": lambda: store.history("b"),
        "get_command": lambda: store.get_command("c1"),
        "changes": lambda: store.changes("0"),
        "task_commands": lambda: store.task_commands("a"),
        "server_time": store.server_time,
        "pool_state": store.pool_state,
        "task_types": store.task_types,
    }
    for name, read in reads.items():
        assert calls.waits(read) == (0, 0), name
    assert {"query", "changes", "task_commands"} <= calls.scripts
    store.close()


def test_without_durability_replicas_nothing_waits(
    pair: tuple[RedisProc, RedisProc], proxy: FaultProxy, namespace: str
) -> None:
    store = RedisTaskStore.from_url(proxy.url, namespace=namespace)
    assert store.wait_rule is None
    calls = Calls(store, proxy)
    assert calls.waits(lambda: store.create(task("a"))) == (0, 0)
    assert calls.waits(lambda: store.save(task("a", 2), expect_version=1)) == (0, 0)
    store.close()


def test_a_stopped_replica_makes_writes_unavailable_and_reads_still_work(
    pair: tuple[RedisProc, RedisProc], namespace: str
) -> None:
    primary, replica = pair
    store = RedisTaskStore.from_url(primary.url, namespace=namespace, durability_replicas=1,
                                    durability_timeout=0.3)  # fmt: skip
    plain = RedisTaskStore.from_url(primary.url, namespace=namespace)
    store.create(task("a"))
    replica.sigstop()
    try:
        began = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"only 0 of 1 replica\(s\) confirmed"):
            store.save(task("a", 2), expect_version=1)
        assert time.monotonic() - began >= 0.3  # WAIT waited its whole timeout
        with pytest.raises(StoreUnavailable, match="outcome is unknown"):
            store.submit_command(Command("c1", "a", CommandKind.STOP, T0))
        # Reads do not wait: they see the primary, the unconfirmed save included.
        got = store.get("a")
        assert got is not None and got.status_version == 2
        assert store.counts()[TaskStatus.PENDING] == 1
        # Without durability_replicas the same server acknowledges at once.
        plain.save(task("a", 3), expect_version=2)
    finally:
        replica.sigcont()
    wait_replicas(primary, 1)
    # The retry is safe: the first attempt's write is there (a conflict that shows it), never
    # applied twice; the chain goes on from it.
    with pytest.raises(ConcurrencyConflict) as conflict:
        store.save(task("a", 3), expect_version=2)
    assert conflict.value.actual == 3
    store.save(task("a", 4), expect_version=3)
    with replica.client() as client:
        assert client.hget("{" + namespace + "}:t:a", "v") == b"4"
    store.close()
    plain.close()


def test_a_primary_without_replicas_is_warned_about_and_refuses_to_acknowledge(
    fresh_redis_proc: RedisProc, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="chongming_redis.store"):
        store = RedisTaskStore.from_url(fresh_redis_proc.url, namespace=namespace,
                                        durability_replicas=1, durability_timeout=0.1)  # fmt: skip
    assert any("has 0 connected replica(s)" in r.getMessage() for r in caplog.records)
    with pytest.raises(StoreUnavailable, match="only 0 of 1"):
        store.create(task("a"))
    assert store.get("a") is not None  # written on the primary: the outcome was unknown
    store.close()


def test_scripts_flushed_from_the_primary_are_loaded_again(
    pair: tuple[RedisProc, RedisProc], namespace: str
) -> None:
    primary, replica = pair
    store = RedisTaskStore.from_url(primary.url, namespace=namespace, durability_replicas=1)
    store.create(task("a"))
    with primary.client() as client:
        client.script_flush()
    store.save(task("a", 2), expect_version=1)  # NOSCRIPT, loaded, sent again, confirmed
    with replica.client() as client:
        assert client.hget("{" + namespace + "}:t:a", "v") == b"2"
    store.close()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"durability_replicas": -1}, ValueError, "0 or more, not -1"),
        ({"durability_replicas": "1"}, TypeError, "must be an int, not str"),
        ({"durability_replicas": True}, TypeError, "must be an int, not bool"),
        ({"durability_replicas": 1.0}, TypeError, "must be an int, not float"),
        ({"durability_replicas": 1, "durability_timeout": 0}, ValueError, "positive"),
        ({"durability_replicas": 1, "durability_timeout": float("nan")}, ValueError, "positive"),
        ({"durability_replicas": 1, "durability_timeout": "1"}, TypeError, "a number"),
        ({"durability_replicas": 1, "durability_timeout": 5.0}, ValueError, "below the socket"),
    ],
)
def test_bad_durability_options_are_refused_before_any_io(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    nothing = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: any I/O would fail
    with pytest.raises(error, match=message):
        RedisTaskStore.from_url(nothing, namespace="ns", **options)


def test_the_default_timeout_is_half_the_socket_timeout(redis_proc: RedisProc) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace="ns", socket_timeout=3.0,
                                    durability_replicas=2)  # fmt: skip
    assert store.wait_rule is not None
    assert (store.wait_rule.replicas, store.wait_rule.timeout) == (2, 1.5)
    store.close()


def test_a_user_restricted_to_its_namespace_may_wait(
    pair: tuple[RedisProc, RedisProc], namespace: str
) -> None:
    """The barrier is a channel under the namespace's nudges, and ``WAIT`` is ``@connection``:
    the least-privilege user of ``test_redis_acl.py`` writes with ``durability_replicas``."""
    primary, replica = pair
    with primary.client() as admin:
        add_user(admin, f"u-{namespace}", namespace, ("+@all", "-@admin", "-@dangerous"))
    store = RedisTaskStore.from_url(primary.url, namespace=namespace, username=f"u-{namespace}",
                                    password=PASSWORD, durability_replicas=1)  # fmt: skip
    store.create(task("a"))
    store.save(task("a", 2), expect_version=1)
    with replica.client() as client:
        assert client.hget("{" + namespace + "}:t:a", "v") == b"2"
    store.close()


def test_the_async_store_waits_for_the_replica_too(
    pair: tuple[RedisProc, RedisProc], proxy: FaultProxy, namespace: str
) -> None:
    """``AsyncRedisTaskStore`` (``AsyncClient``'s store): its writes, ``commit_tasks`` and
    ``submit_command``, send one ``WAIT`` each, its reads none; with the replica stopped a
    write is ``StoreUnavailable``."""
    primary, replica = pair

    async def main() -> None:
        store = AsyncRedisTaskStore.from_url(proxy.url, namespace=namespace, durability_replicas=1,
                                         durability_timeout=0.3)  # fmt: skip
        try:
            # The first call of each script loads it (NOSCRIPT, sent again): not counted.
            await store.commit_tasks([(task("a"), None, [])])
            await store.submit_command(Command("c0", "a", CommandKind.STOP, T0))
            before = proxy.commands_seen["WAIT"]
            await store.commit_tasks([(task("b"), None, [])])
            await store.submit_command(Command("c1", "a", CommandKind.STOP, T0))
            assert proxy.commands_seen["WAIT"] - before == 2
            assert namespace_dump(replica, namespace) == namespace_dump(primary, namespace)
            await store.get("a")
            await store.query(TaskQuery())
            assert proxy.commands_seen["WAIT"] - before == 2
            replica.sigstop()
            try:
                with pytest.raises(StoreUnavailable, match="only 0 of 1"):
                    await store.commit_tasks([(task("c"), None, [])])
            finally:
                replica.sigcont()
        finally:
            await store.aclose()

    asyncio.run(main())
    wait_replicas(primary, 1)
