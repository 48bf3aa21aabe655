"""What is specific to RedisTaskStore on a real server: key safety, corrupt data written by
another client, bounded failures, server-setting warnings, paging, batching and OOM."""

from __future__ import annotations

import dataclasses
import logging
import random
from datetime import datetime, timedelta, timezone

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from chongming_redis import (
    Command,
    CommandKind,
    CorruptRecord,
    InMemoryTaskStore,
    StoreError,
    StoreUnavailable,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores import redis as redis_module
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores.redis import (
    PRUNE_BATCH,
    QUERY_PAGE,
    RedisTaskStore,
    check_server_settings,
)
from tests.support.fixtures import require_redis_server
from tests.support.redis_server import RedisProc

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)
IDS = st.text(min_size=1, max_size=40).filter(
    lambda s: len(s.encode("utf-8", "ignore")) == len(s.encode("utf-8", "surrogatepass"))
)


def task(task_id: str, **fields: object) -> TaskSnapshot:
    base: dict[str, object] = {"name": "job", "status": TaskStatus.PENDING, "status_version": 1,
                               "created_at": T0, "updated_at": T0}  # fmt: skip
    base.update(fields)
    return TaskSnapshot(task_id, **base)  # type: ignore[arg-type]


def dump_namespace(client: redis.Redis, namespace: str) -> dict[bytes, bytes | None]:
    """Every key of the namespace with its DUMP: byte-identical means untouched."""
    pattern = Keys(namespace).pattern()[1:]  # the ACL pattern is '~' + a glob
    return {key: client.dump(key) for key in client.scan_iter(match=pattern, count=1000)}


# -- keys ------------------------------------------------------------------------------------


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(ident=IDS)
def test_every_key_of_any_identifier_stays_in_the_namespace_slot(ident: str) -> None:
    keys = Keys("ns1")
    slot = key_slot(b"ns1")
    built = [keys.task(ident), keys.history(ident), keys.command(ident), keys.tag(ident),
             keys.index("pending", 7, ident), keys.bucket_names("pending", 7),
             keys.pipeline(ident), keys.claim_memo(ident), keys.task_commands(ident)]  # fmt: skip
    for key in built:
        assert key.startswith("{ns1}:")
        assert key_slot(key.encode()) == slot, key


@settings(max_examples=300)
@given(a=IDS, b=IDS)
def test_keys_of_different_kinds_never_collide(a: str, b: str) -> None:
    keys = Keys("ns1")
    builders = [keys.task, keys.history, keys.command, keys.tag, keys.pipeline, keys.claim_memo,
                keys.task_commands, lambda x: keys.index("lost", 3, x)]  # fmt: skip
    images = [(i, build(x)) for i, build in enumerate(builders) for x in (a, b)]
    fixed = {
        keys.bucket_names("lost", 3),
        keys.counts,
        keys.command_queue,
        keys.command_leases,
        keys.workers,
        keys.worker_beats,
    }
    for i, key in images:
        assert key not in fixed
        for j, other in images:
            if i != j:
                assert key != other


def test_a_task_named_like_an_internal_suffix_is_its_own_task(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    store.create(task("x"))
    store.create(task("x:history"))
    store.append(Transition("x", 1, None, TaskStatus.PENDING, T0))
    assert store.history("x:history") == []
    assert {s.task_id for s in store.query()} == {"x", "x:history"}


@pytest.mark.parametrize("bad", ["", "a b", "{x}", "a:b", "x" * 65, "ü", "ns\n"])
def test_a_bad_namespace_is_refused_before_connecting(bad: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        RedisTaskStore.from_url("redis://127.0.0.1:1/0", namespace=bad)


def test_a_client_that_decodes_responses_is_refused(redis_proc: RedisProc) -> None:
    with pytest.raises(ValueError, match="decode_responses"):
        RedisTaskStore(redis_proc.client(decode_responses=True), namespace="x")


def test_namespaces_on_one_database_do_not_see_each_other(redis_proc: RedisProc) -> None:
    one = RedisTaskStore.from_url(redis_proc.url, namespace="iso-one")
    two = RedisTaskStore.from_url(redis_proc.url, namespace="iso-two")
    one.create(task("same-id", tags=frozenset({"t"})))
    two.create(task("same-id", name="other"))
    one.submit_command(Command("c", "same-id", CommandKind.STOP, T0))
    assert [s.name for s in two.query(TaskQuery(tag="t"))] == []
    assert two.get("same-id") == task("same-id", name="other")
    assert two.claim_commands(now=T0, lease_seconds=5) == []
    assert one.prune(keep_terminal=0) == 0 and one.counts() == two.counts()


# -- corrupt data written by another client (B9, F11) ----------------------------------------


# case -> (field to damage or None for a wrong key type, the value, the detecting operation)
CORRUPT_CASES: dict[str, tuple[str | None, object, str]] = {
    "task is a string": (None, "string", "get"),
    "save over a string": (None, "string", "save"),
    "touch a list": (None, "list", "touch"),
    "create over a list": (None, "list", "create"),
    "version missing": ("v", None, "save"),
    "version abc": ("v", "abc", "save"),
    "version 1e3": ("v", "1e3", "save"),
    "version 0x10": ("v", "0x10", "save"),
    "version -5": ("v", "-5", "save"),
    "unknown status on read": ("s", "zombie", "get"),
    "unknown status on save": ("s", "zombie", "save"),
    "garbled params": ("a", b"\xc1\xc1", "get"),
    "name not utf-8": ("n", b"\xff\xfe", "get"),
    "tags not json": ("g", "[io", "save"),
    "created missing": ("c", None, "save"),
}


def plant(store: RedisTaskStore, client: redis.Redis, field: str | None, value: object) -> None:
    key = store.keys.task("t")
    if field is None:
        if value == "string":
            client.set(key, "x")
        else:
            client.rpush(key, "x")
        return
    store.create(task("t", params={"a": 1}, tags=frozenset({"io"})))
    if value is None:
        client.hdel(key, field)
    else:
        client.hset(key, field, value)  # type: ignore[arg-type]


def detect(store: RedisTaskStore, operation: str) -> None:
    if operation == "get":
        store.get("t")
    elif operation == "save":
        store.save(task("t", status_version=2), expect_version=1)
    elif operation == "touch":
        store.touch("t", heartbeat_at=T0)
    else:
        store.create(task("t"))


@pytest.mark.parametrize("case", sorted(CORRUPT_CASES))
def test_corrupt_task_data_raises_corrupt_record_naming_the_key_and_changes_nothing(
    redis_proc: RedisProc, namespace: str, case: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = redis_proc.client()
    field, value, operation = CORRUPT_CASES[case]
    plant(store, client, field, value)
    before = dump_namespace(client, namespace)

    with pytest.raises(CorruptRecord) as caught:
        detect(store, operation)

    assert caught.value.key == store.keys.task("t")
    assert store.keys.task("t") in str(caught.value)
    assert dump_namespace(client, namespace) == before, "byte-identical: nothing written"


def test_corrupt_history_and_commands_raise_corrupt_record_and_change_nothing(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = redis_proc.client()
    k = store.keys
    client.set(k.history("h1"), "x")
    client.zadd(k.history("h2"), {b"\xc1garbage": 1})
    store.submit_command(Command("c1", "t", CommandKind.STOP, T0))
    client.delete(k.command("c1"))
    client.set(k.command("c1"), "not a hash")
    before = dump_namespace(client, namespace)
    for call in (
        lambda: store.append(Transition("h1", 1, None, TaskStatus.PENDING, T0)),
        lambda: store.history("h1"),
        lambda: store.history("h2"),
        lambda: store.claim_commands(now=T0, lease_seconds=5),
        lambda: store.complete_command("c1", now=T0),
        lambda: store.release_command("c1", now=T0),
    ):
        with pytest.raises(CorruptRecord):
            call()
    assert dump_namespace(client, namespace) == before


def test_a_corrupt_task_found_by_query_or_prune_raises_and_changes_nothing(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = redis_proc.client()
    store.create(task("a", status=TaskStatus.SUCCEEDED))
    store.create(task("b", status=TaskStatus.SUCCEEDED, created_at=T0 + timedelta(seconds=1)))
    client.hset(store.keys.task("a"), "g", "{not json")
    before = dump_namespace(client, namespace)
    with pytest.raises(CorruptRecord, match="field 'g'"):
        store.query()
    with pytest.raises(CorruptRecord):
        store.prune(keep_terminal=0)
    assert dump_namespace(client, namespace) == before


def test_unknown_extra_fields_written_by_another_client_are_ignored(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    store.create(task("t"))
    redis_proc.client().hset(store.keys.task("t"), "zz-extra", "whatever")
    assert store.get("t") == task("t")


# -- failures are clear and bounded ----------------------------------------------------------


def test_connection_loss_raises_store_unavailable_and_the_next_call_after_restart_works(
    fresh_redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(
        fresh_redis_proc.url, namespace=namespace, socket_timeout=0.5,
        socket_connect_timeout=0.5, retries=1,
    )  # fmt: skip
    store.create(task("t"))
    fresh_redis_proc.kill9()
    with pytest.raises(StoreUnavailable) as caught:
        store.get("t")
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    with pytest.raises(StoreUnavailable):
        store.create(task("u"))
    fresh_redis_proc.restart()
    assert store.get("t") == task("t"), "acknowledged under appendfsync always"
    store.create(task("u"))


def test_a_hung_server_raises_store_unavailable_after_the_socket_timeout(
    fresh_redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(
        fresh_redis_proc.url, namespace=namespace, socket_timeout=0.3, retries=0
    )
    store.create(task("t"))
    fresh_redis_proc.sigstop()
    try:
        with pytest.raises(StoreUnavailable, match=r"Timeout|timed out|unreachable"):
            store.get("t")
    finally:
        fresh_redis_proc.sigcont()
    assert store.get("t") == task("t")


def test_a_server_without_durability_settings_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    require_redis_server()
    server = RedisProc(extra_args=("--appendonly", "no", "--maxmemory-policy", "allkeys-lru"))
    try:
        with caplog.at_level(logging.WARNING, logger="chongming_redis.store"):
            RedisTaskStore.from_url(server.url, namespace="warn")
        text = caplog.text
        assert "maxmemory-policy is 'allkeys-lru'" in text
        assert "appendonly is off" in text
        assert len(check_server_settings(server.client())) == 2
    finally:
        server.close()


def test_a_durable_server_gets_no_warning(
    redis_proc: RedisProc, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="chongming_redis.store"):
        RedisTaskStore.from_url(redis_proc.url, namespace="quiet")
    assert caplog.text == ""


def test_out_of_memory_refuses_the_whole_script_and_writes_nothing(
    fresh_redis_proc: RedisProc, namespace: str
) -> None:
    client = fresh_redis_proc.client()
    store = RedisTaskStore.from_url(fresh_redis_proc.url, namespace=namespace)
    store.create(task("before"))
    # Over the limit (noeviction): every write command is refused from now on.
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used // 2)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("tiny", "1")
    before = dump_namespace(client, namespace)
    with pytest.raises(StoreError, match="out of memory"):
        store.create(task("during", tags=frozenset({"a", "b"})))
    with pytest.raises(StoreError, match="out of memory"):
        store.save(task("before", status_version=2), expect_version=1)
    assert dump_namespace(client, namespace) == before
    assert store.get("during") is None


# -- paging, batching and index hygiene ------------------------------------------------------


def twin_stores(
    redis_proc: RedisProc, namespace: str, n: int
) -> tuple[RedisTaskStore, InMemoryTaskStore]:
    rng = random.Random(7)
    redis_store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    memory = InMemoryTaskStore()
    for i in range(n):
        created = T0 + timedelta(microseconds=rng.randrange(n // 3))  # many exact ties
        snapshot = task(
            f"task-{rng.randrange(10**9):09d}-{i}",
            name=rng.choice(["resize", "resize.small", "send", "sendmail", "index"]),
            status=rng.choice([s for s in TaskStatus if s is not TaskStatus.WAITING]),
            bucket=rng.randrange(5),
            tags=frozenset(rng.sample(["io", "ios", "cpu", "gpu"], rng.randrange(3))),
            pipeline_run_id=rng.choice([None, "p1", "p2"]),
            created_at=created,
        )
        redis_store.create(snapshot)
        memory.create(snapshot)
    return redis_store, memory


QUERIES = [
    TaskQuery(),
    TaskQuery(newest_first=True),
    TaskQuery(limit=QUERY_PAGE + 17),
    TaskQuery(statuses=frozenset({TaskStatus.PENDING}), buckets=frozenset({1, 3}), limit=50),
    TaskQuery(statuses=frozenset({TaskStatus.PENDING, TaskStatus.LOST}), newest_first=True),
    TaskQuery(buckets=frozenset({0})),
    TaskQuery(tag="io"),
    TaskQuery(tag="io", statuses=frozenset({TaskStatus.RUNNING}), newest_first=True, limit=30),
    TaskQuery(name="resize"),
    TaskQuery(name_prefix="resize"),
    TaskQuery(name_prefix="send", buckets=frozenset({2, 4}), limit=77),
    TaskQuery(pipeline_run_id="p1", tag="cpu"),
    TaskQuery(name_prefix="nothing"),
    TaskQuery(pipeline_run_id="p2", name="index", newest_first=True),
]


def test_paged_queries_over_many_tasks_with_tied_timestamps_match_the_reference(
    redis_proc: RedisProc, namespace: str
) -> None:
    redis_store, memory = twin_stores(redis_proc, namespace, 1300)
    for query in QUERIES:
        got = [s.task_id for s in redis_store.query(query)]
        assert got == [s.task_id for s in memory.query(query)], query
    assert redis_store.counts() == memory.counts()


def test_prune_runs_in_bounded_batches_and_removes_every_key_of_a_task(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    n = PRUNE_BATCH * 2 + 50
    for i in range(n):
        snapshot = task(f"done-{i:04d}", status=TaskStatus.SUCCEEDED, tags=frozenset({"x"}),
                        created_at=T0 + timedelta(seconds=i), name=f"n{i % 3}")  # fmt: skip
        store.create(snapshot)
        store.append(Transition(snapshot.task_id, 1, None, TaskStatus.SUCCEEDED, T0))
    store.create(task("live", created_at=T0 - timedelta(days=1)))
    calls: list[object] = []
    original = store._run
    store._run = lambda *a, **kw: calls.append(a) or original(*a, **kw)  # type: ignore[method-assign,func-returns-value]

    assert store.prune(keep_terminal=10) == n - 10

    assert len(calls) == 3, "batches of PRUNE_BATCH, each its own script call"
    assert store.get("live") is not None
    kept = [s.task_id for s in store.query(TaskQuery(statuses=frozenset({TaskStatus.SUCCEEDED})))]
    assert kept == [f"done-{i:04d}" for i in range(n - 10, n)]
    keys = set(dump_namespace(redis_proc.client(), namespace))
    k = store.keys
    assert not any(k.task(f"done-{i:04d}").encode() in keys for i in range(n - 10))
    assert not any(k.history(f"done-{i:04d}").encode() in keys for i in range(n - 10))
    assert redis_proc.client().zcard(k.tag("x")) == 10


@pytest.mark.parametrize("batch", [1, 7, PRUNE_BATCH])
def test_prune_merges_the_terminal_indexes_oldest_first_in_bounded_batches(
    redis_proc: RedisProc, namespace: str, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No list of terminal tasks: prune merges the composite index keys of the four terminal
    statuses, across buckets and names (one of them large enough to be a skiplist, so the merge
    refills from it), oldest first with many created_at ties broken by id, leaves every live
    task, and drops at most one batch per script call."""
    monkeypatch.setattr(redis_module, "PRUNE_BATCH", batch)
    redis_store, memory = twin_stores(redis_proc, namespace, 500)
    rng = random.Random(11)
    for i in range(300):  # one big key, interleaved in time with the others
        created = T0 + timedelta(microseconds=rng.randrange(500 // 3))
        status = TaskStatus.SUCCEEDED if i % 5 else TaskStatus.RUNNING
        snapshot = task(f"bulk-{rng.randrange(10**6):06d}-{i}", name="bulk", bucket=3,
                        status=status, created_at=created)  # fmt: skip
        redis_store.create(snapshot)
        memory.create(snapshot)
    live = sorted(s.task_id for s in memory.query() if not s.status.is_terminal)
    terminal = len(memory.query()) - len(live)
    replies: list[list[object]] = []
    original = redis_store._run

    def run(*args: object, **kw: object) -> list[object]:
        reply = original(*args, **kw)  # type: ignore[arg-type]
        replies.append(reply)
        return reply

    redis_store._run = run  # type: ignore[method-assign,assignment]
    for keep in (terminal, terminal - 1, terminal - 60, 150, 150, 3, 0):
        replies.clear()
        expected = memory.prune(keep_terminal=keep)
        assert redis_store.prune(keep_terminal=keep) == expected
        assert len(replies) == max(1, -(-expected // batch)), "one call per batch"
        assert all(int(r[1]) <= batch for r in replies)  # type: ignore[call-overload]
        assert [s.task_id for s in redis_store.query()] == [s.task_id for s in memory.query()]
        assert redis_store.counts() == memory.counts()
    assert sorted(s.task_id for s in redis_store.query()) == live


def test_prune_drops_a_dangling_index_entry_with_its_counters(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    for i, task_id in enumerate(("a", "b", "c")):
        store.create(task(task_id, status=TaskStatus.FAILED, bucket=i,
                          created_at=T0 + timedelta(seconds=i)))  # fmt: skip
    redis_proc.client().delete(store.keys.task("a"))  # another client deletes a task hash
    assert store.prune(keep_terminal=1) == 2
    assert [s.task_id for s in store.query()] == ["c"]
    assert store.counts()[TaskStatus.FAILED] == 1
    assert redis_proc.client().exists(store.keys.index("failed", 0, "job")) == 0


@pytest.mark.parametrize(
    ("field", "value"), [("s", "running"), ("s", "lost"), ("b", "9"), ("n", "other")]
)
def test_prune_refuses_a_task_that_does_not_match_its_index_and_changes_nothing(
    redis_proc: RedisProc, namespace: str, field: str, value: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = redis_proc.client()
    store.create(task("a", status=TaskStatus.SUCCEEDED))
    client.hset(store.keys.task("a"), field, value)
    before = dump_namespace(client, namespace)
    with pytest.raises(CorruptRecord, match=f"field '{field}'"):
        store.prune(keep_terminal=0)
    assert dump_namespace(client, namespace) == before


def test_a_save_that_changes_indexed_fields_leaves_no_stale_index_entry(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = redis_proc.client()
    k = store.keys
    before = task("t", name="old-name", tags=frozenset({"a", "b"}), bucket=1, pipeline_run_id="p")
    store.create(before)
    after = dataclasses.replace(before, status=TaskStatus.SUCCEEDED, status_version=2,
                                name="new-name", tags=frozenset({"b", "c"}), bucket=2,
                                pipeline_run_id=None)  # fmt: skip
    store.save(after, expect_version=1)
    assert client.zscore(k.tag("a"), "t") is None
    assert client.zscore(k.tag("c"), "t") is not None
    assert client.zscore(k.index("pending", 1, "old-name"), "t") is None
    assert client.zscore(k.index("succeeded", 2, "new-name"), "t") is not None
    assert client.hgetall(k.bucket_names("pending", 1)) == {}, "an unused name is dropped"
    assert client.hgetall(k.bucket_names("succeeded", 2)) == {b"new-name": b"1"}
    assert client.zscore(k.pipeline("p"), "t") is None
    assert client.hgetall(k.counts) == {b"succeeded": b"1", b"succeeded:2": b"1"}
    # a terminal task is listed in its composite index only (prune merges those: no other list)
    assert set(dump_namespace(client, namespace)) == {
        key.encode()
        for key in (k.task("t"), k.index("succeeded", 2, "new-name"), k.counts,
                    k.bucket_names("succeeded", 2), k.tag("b"), k.tag("c"), k.feed,
                    k.feed_chunk(0), k.feed_chunks)
    }  # fmt: skip


def test_drop_namespace_deletes_its_keys_and_no_others(redis_proc: RedisProc) -> None:
    """What the demo and the pytest plugin clean up with: every key of one namespace, none of
    a namespace whose name starts the same."""
    name = f"drop-{random.getrandbits(32):08x}"
    keep = RedisTaskStore.from_url(redis_proc.url, namespace=f"{name}-keep")
    gone = RedisTaskStore.from_url(redis_proc.url, namespace=name)
    now = datetime.now(timezone.utc)
    for store in (keep, gone):
        for n in range(600):  # more than one batch of deletes
            store.create(TaskSnapshot(f"t{n}", "job", TaskStatus.PENDING, 1, now, now))
    before = keep.counts()
    assert gone.drop_namespace() >= 600
    assert gone.counts() == dict.fromkeys(TaskStatus, 0) and gone.get("t1") is None
    assert keep.counts() == before and keep.get("t1") is not None
    assert gone.drop_namespace() == 0  # twice: nothing left
    keep.drop_namespace()
    keep.close()
    gone.close()
