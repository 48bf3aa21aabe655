"""What is specific to the dashboard reads on RedisTaskStore (the semantics are
``ExtensionsContract``'s): the keys they use and leave, one round trip per call, and data of
the wrong shape reported as ``CorruptRecord`` with nothing written."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chongming_redis import (
    Command,
    CommandBacklog,
    CommandKind,
    CorruptRecord,
    InMemoryTaskStore,
    StoreError,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
)
from chongming_redis.stores import redis as redis_module
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.test_redis_store import dump_namespace

pytestmark = pytest.mark.redis

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def task(task_id: str, status: TaskStatus = TaskStatus.PENDING, seconds: float = 0) -> TaskSnapshot:
    created = T0 + timedelta(seconds=seconds)
    return TaskSnapshot(task_id, "job", status, 1, created, created)


def stop(command_id: str, task_id: str, seconds: float = 0) -> Command:
    return Command(command_id, task_id, CommandKind.STOP, T0 + timedelta(seconds=seconds))


@pytest.fixture
def store(redis_proc: RedisProc, namespace: str) -> Iterator[RedisTaskStore]:
    opened = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    yield opened
    opened.drop_namespace()
    opened.close()


def requests_during(call: Callable[[], object]) -> int:
    """How many times redis-py wrote a request (one command, or a whole pipeline) while
    ``call`` ran: the round trips it cost."""
    sent = 0
    original = redis.connection.AbstractConnection.send_packed_command

    def counting(self: redis.connection.AbstractConnection, *args: object, **kw: object) -> None:
        nonlocal sent
        sent += 1
        original(self, *args, **kw)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
        call()
    return sent


def test_each_dashboard_read_is_one_round_trip(store: RedisTaskStore) -> None:
    for i in range(30):
        store.create(task(f"t{i:02d}", seconds=i // 3))
        store.submit_command(stop(f"c{i:02d}", "t01", seconds=i))
    store.pool_tick(worker="w1", now=T0, lease_seconds=5, num_buckets=4, wanted=[0])
    store.claim_commands(now=T0, lease_seconds=5, limit=3)
    calls: dict[str, Callable[[], object]] = {
        "query_page": lambda: store.query_page(TaskQuery(limit=10), after=(T0, "t01")),
        "task_commands": lambda: store.task_commands("t01", limit=20),
        "command_backlog": store.command_backlog,
        "worker_beats": store.worker_beats,
    }
    for name, call in calls.items():
        call()  # the first call may load its script (NOSCRIPT)
        assert requests_during(call) == 1, name
    assert len(store.task_commands("t01", limit=20)) == 20
    assert store.command_backlog() == CommandBacklog(27, 3, T0 + timedelta(seconds=3))


def test_prune_drops_a_tasks_command_list_and_leaves_the_commands(
    store: RedisTaskStore, redis_proc: RedisProc, namespace: str
) -> None:
    store.create(task("done", TaskStatus.SUCCEEDED))
    store.create(task("live", seconds=1))
    store.submit_command(stop("c1", "done"))
    store.submit_command(stop("c2", "live", seconds=1))
    k = store.keys
    assert store.prune(keep_terminal=0) == 1
    keys = set(dump_namespace(redis_proc.client(), namespace))
    assert k.task_commands("done").encode() not in keys
    assert k.task_commands("live").encode() in keys
    assert store.get_command("c1") == stop("c1", "done"), "the hash stays, readable by id"
    assert store.task_commands("done") == []


def test_a_repeated_tick_keeps_one_beat_and_the_last_to_leave_leaves_no_hash(
    store: RedisTaskStore, redis_proc: RedisProc
) -> None:
    for _ in range(2):  # the same call twice, as redis-py re-sends after a lost reply
        store.pool_tick(worker="w1", now=T0, lease_seconds=5, num_buckets=4, wanted=[0])
    assert store.worker_beats() == {"w1": T0}
    store.pool_tick(worker="w1", now=T0, lease_seconds=5, num_buckets=4, wanted=[], leaving=True)
    assert redis_proc.client().exists(store.keys.worker_beats) == 0


def test_a_command_list_of_the_wrong_type_refuses_the_submit_and_writes_nothing(
    store: RedisTaskStore, redis_proc: RedisProc, namespace: str
) -> None:
    client = redis_proc.client()
    client.set(store.keys.task_commands("t1"), "not a sorted set")
    before = dump_namespace(client, namespace)
    with pytest.raises(CorruptRecord) as caught:
        store.submit_command(stop("c1", "t1"))
    assert caught.value.key == store.keys.task_commands("t1")
    with pytest.raises(CorruptRecord):
        store.task_commands("t1")
    assert dump_namespace(client, namespace) == before
    assert store.get_command("c1") is None and store.command_backlog().unclaimed == 0


@pytest.mark.parametrize("damage", ["missing", "not a hash", "bad field"])
def test_a_listed_command_that_does_not_decode_is_corrupt_and_changes_nothing(
    store: RedisTaskStore, redis_proc: RedisProc, namespace: str, damage: str
) -> None:
    client = redis_proc.client()
    store.submit_command(stop("c1", "t1"))
    key = store.keys.command("c1")
    if damage == "missing":
        client.delete(key)
    elif damage == "not a hash":
        client.delete(key)
        client.set(key, "x")
    else:
        client.hset(key, "c", "yesterday")
    before = dump_namespace(client, namespace)
    with pytest.raises(CorruptRecord) as caught:
        store.task_commands("t1")
    assert caught.value.key == key
    assert dump_namespace(client, namespace) == before


def test_a_backlog_or_beats_key_of_the_wrong_shape_is_corrupt(
    store: RedisTaskStore, redis_proc: RedisProc
) -> None:
    client = redis_proc.client()
    k = store.keys
    client.set(k.command_leases, "x")
    with pytest.raises(CorruptRecord) as leases:
        store.command_backlog()
    assert leases.value.key == k.command_leases
    client.delete(k.command_leases)
    client.zadd(k.command_queue, {"c9": -5})
    with pytest.raises(CorruptRecord) as queue:
        store.command_backlog()
    assert queue.value.key == k.command_queue
    client.hset(k.worker_beats, "w1", "soon")
    with pytest.raises(CorruptRecord) as beats:
        store.worker_beats()
    assert (beats.value.key, beats.value.field) == (k.worker_beats, "w1")


def test_a_read_only_dashboard_user_reads_all_four_with_multi_and_exec(
    fresh_redis_proc: RedisProc,
) -> None:
    """The rules ``docs/redis-layout.md`` gives a read-only dashboard user: the read-only
    categories, the read-only script call, and ``MULTI``/``EXEC`` for the backlog."""
    writer = RedisTaskStore.from_url(fresh_redis_proc.url, namespace="dash")
    writer.create(task("t1"))
    writer.submit_command(stop("c1", "t1"))
    writer.pool_tick(worker="w1", now=T0, lease_seconds=5, num_buckets=4, wanted=[0])
    admin = fresh_redis_proc.client()
    admin.script_flush()  # the reader loads task_commands.lua itself (SCRIPT LOAD)
    rules = ("-@all", "+@read", "-@dangerous", "+evalsha_ro", "+script|load")
    for user, extra in (("reader", ("+multi", "+exec")), ("no-multi", ())):
        admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "resetkeys",
                              writer.keys.pattern(), *rules, *extra)  # fmt: skip
    reader = RedisTaskStore.from_url(
        fresh_redis_proc.url, namespace="dash", username="reader", password="pw"
    )
    assert [s.task_id for s in reader.query_page(TaskQuery(), after=(T0, "t0"))] == ["t1"]
    assert reader.task_commands("t1") == [stop("c1", "t1")]
    assert reader.command_backlog() == CommandBacklog(1, 0, T0)
    assert reader.worker_beats() == {"w1": T0}
    refused = RedisTaskStore.from_url(
        fresh_redis_proc.url, namespace="dash", username="no-multi", password="pw"
    )
    with pytest.raises(StoreError, match="no permissions") as caught:
        refused.command_backlog()
    assert isinstance(caught.value.__cause__, redis.exceptions.NoPermissionError)
    for store in (reader, refused, writer):
        store.close()


# -- query_page against the reference, from any position ---------------------------------------

IDS = ("a", "b", "t1", "t10", "t2", "T", "é", "a b", "{x}", "z")
POSITION_IDS = (*IDS, "", "0", "t", "t11", "zz", "\U0001f642")  # "" stands for no position
FILTERS = st.fixed_dictionaries(
    {},
    optional={
        "statuses": st.frozensets(st.sampled_from(list(TaskStatus)), min_size=1, max_size=3),
        "name": st.sampled_from(["resize", "send"]),
        "name_prefix": st.sampled_from(["res", "se", "x"]),
        "tag": st.sampled_from(["io", "cpu"]),
        "buckets": st.frozensets(st.integers(0, 2), min_size=1, max_size=2),
        "pipeline_run_id": st.sampled_from(["p1", "p2"]),
        "limit": st.integers(0, 7),
        "newest_first": st.booleans(),
    },
)
TASKS = st.lists(
    st.tuples(
        st.sampled_from(IDS),
        st.integers(0, 4),  # microseconds after T0: many exact ties
        st.sampled_from(["resize", "resize.x", "send"]),
        st.sampled_from([s for s in TaskStatus if s is not TaskStatus.WAITING]),
        st.integers(0, 2),
        st.frozensets(st.sampled_from(["io", "cpu"]), max_size=2),
        st.sampled_from([None, "p1", "p2"]),
    ),
    max_size=12,
    unique_by=lambda t: t[0],
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    tasks=TASKS,
    filters=FILTERS,
    position=st.tuples(st.integers(-1, 5), st.sampled_from(POSITION_IDS)),
    page=st.sampled_from((1, 2, 3)),
    budget=st.sampled_from((1, 2, 5)),
)
def test_query_page_matches_the_reference_from_any_position_with_tiny_script_pages(
    redis_proc: RedisProc,
    tasks: list[tuple[Any, ...]],
    filters: dict[str, Any],
    position: tuple[int, str],
    page: int,
    budget: int,
) -> None:
    """Tiny script pages and budgets make the store loop on the query script's cursor from
    the given position, across ties, sources and filters the script checks itself."""
    namespace = f"qp-{uuid.uuid4().hex[:12]}"
    redis_store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    memory = InMemoryTaskStore()
    for task_id, micros, name, status, bucket, tags, pipeline in tasks:
        created = T0 + timedelta(microseconds=micros)
        snapshot = TaskSnapshot(task_id, name, status, 1, created, created, tags=tags,
                                bucket=bucket, pipeline_run_id=pipeline)  # fmt: skip
        redis_store.create(snapshot)
        memory.create(snapshot)
    micros, task_id = position
    after = None if not task_id else (T0 + timedelta(microseconds=micros), task_id)
    query = TaskQuery(**filters)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(redis_module, "QUERY_PAGE", page)
            patch.setattr(redis_module, "QUERY_BUDGET", budget)
            got = redis_store.query_page(query, after=after)
        assert got == memory.query_page(query, after=after)
    finally:
        redis_store.drop_namespace()
        redis_store.close()
