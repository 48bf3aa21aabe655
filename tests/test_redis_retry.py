"""Retries without double effects (RELIABILITY fact 2, F7).

A loopback proxy lets the next ``EVALSHA`` reach Redis and run, swallows its reply and resets
the connection. redis-py then silently sends the same call again. The store's scripts must
recognise the second run as a retry of the first: a ``save`` is reported applied (not a
conflict), a ``create`` or ``submit_command`` is not "already exists", and a
``claim_commands`` returns the batch the first run leased instead of stranding it and leasing
another. Each test asserts that the proxy really fired and that the script really ran twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import redis

from chongming_redis import (
    Command,
    CommandKind,
    StoreUnavailable,
    TaskAlreadyExists,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stress.fault_proxy import FaultProxy
from tests.support.redis_server import RedisProc

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
def proxy(redis_proc: RedisProc) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", redis_proc.port) as fault_proxy:
        yield fault_proxy


def through(proxy: FaultProxy, namespace: str, *, retries: int = 3) -> RedisTaskStore:
    store = RedisTaskStore.from_url(proxy.url, namespace=namespace, retries=retries)
    # Warm every script so the call under test is exactly one EVALSHA (no NOSCRIPT detour).
    for script in store._scripts.values():
        script.sha = store._client.script_load(script.script)
    return store


def task(task_id: str = "t1", version: int = 1) -> TaskSnapshot:
    return TaskSnapshot(task_id, "job", TaskStatus.PENDING, version, T0, T0)


def evalshas_during(proxy: FaultProxy, call: object) -> int:
    before = proxy.commands_seen["EVALSHA"]
    assert callable(call)
    call()
    return proxy.commands_seen["EVALSHA"] - before


def test_a_retried_save_whose_reply_was_lost_is_reported_applied(
    proxy: FaultProxy, redis_proc: RedisProc, namespace: str
) -> None:
    store = through(proxy, namespace)
    store.create(task())
    running = dataclasses.replace(task(), status=TaskStatus.RUNNING, status_version=2)
    toxic = proxy.drop_reply_of("EVALSHA", nth=1)

    sent = evalshas_during(proxy, lambda: store.save(running, expect_version=1))

    assert toxic.fired == 1
    assert sent == 2, "the script ran, its reply was lost, and redis-py sent it again"
    direct = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    assert direct.get("t1") == running


def test_a_retried_create_is_not_reported_as_already_existing(
    proxy: FaultProxy, namespace: str
) -> None:
    store = through(proxy, namespace)
    toxic = proxy.drop_reply_of("EVALSHA", nth=1)

    sent = evalshas_during(proxy, lambda: store.create(task("t2")))

    assert toxic.fired == 1 and sent == 2
    assert store.get("t2") == task("t2")
    assert store.counts()[TaskStatus.PENDING] == 1, "created once: counters bumped once"


def test_a_retried_submit_command_is_not_reported_as_already_existing(
    proxy: FaultProxy, namespace: str
) -> None:
    store = through(proxy, namespace)
    toxic = proxy.drop_reply_of("EVALSHA", nth=1)
    command = Command("c1", "t1", CommandKind.STOP, T0)

    sent = evalshas_during(proxy, lambda: store.submit_command(command))

    assert toxic.fired == 1 and sent == 2
    assert store.task_commands("t1") == [command], "listed under its task once"
    (claimed,) = store.claim_commands(now=T0, lease_seconds=30)
    assert claimed.command_id == "c1"


def test_a_retried_claim_returns_the_batch_it_leased_and_strands_nothing(
    proxy: FaultProxy, namespace: str
) -> None:
    store = through(proxy, namespace)
    for i in range(6):
        store.submit_command(Command(f"c{i}", "t1", CommandKind.STOP, T0 + timedelta(seconds=i)))
    toxic = proxy.drop_reply_of("EVALSHA", nth=1)

    batches: list[list[Command]] = []
    sent = evalshas_during(
        proxy, lambda: batches.append(store.claim_commands(now=T0, lease_seconds=60, limit=2))
    )

    assert toxic.fired == 1 and sent == 2
    assert [c.command_id for c in batches[0]] == ["c0", "c1"], "the first run's batch"
    nxt = store.claim_commands(now=T0, lease_seconds=60, limit=10)
    assert [c.command_id for c in nxt] == ["c2", "c3", "c4", "c5"], "nothing was leased twice"


def test_appends_touches_and_completions_are_idempotent_under_retry(
    proxy: FaultProxy, namespace: str
) -> None:
    store = through(proxy, namespace)
    store.create(task())
    store.submit_command(Command("c1", "t1", CommandKind.STOP, T0))
    entry = Transition("t1", 1, None, TaskStatus.PENDING, T0)

    for call in (
        lambda: store.append(entry),
        lambda: store.touch("t1", heartbeat_at=T0),
        lambda: store.complete_command("c1", now=T0, outcome="stopped"),
    ):
        toxic = proxy.drop_reply_of("EVALSHA", nth=1)
        assert evalshas_during(proxy, call) == 2
        assert toxic.fired == 1

    assert store.history("t1") == [entry]
    snapshot = store.get("t1")
    assert snapshot is not None and snapshot.status_version == 1 and snapshot.heartbeat_at == T0
    assert store.claim_commands(now=T0 + timedelta(days=1), lease_seconds=1) == []


def test_negative_control_without_retries_the_write_lands_but_the_caller_sees_a_failure(
    proxy: FaultProxy, redis_proc: RedisProc, namespace: str
) -> None:
    """The ambiguity is real: with retries off the caller gets StoreUnavailable although the
    script ran. This is the case the retry tokens exist for."""
    store = through(proxy, namespace, retries=0)
    store.create(task())
    running = dataclasses.replace(task(), status=TaskStatus.RUNNING, status_version=2)
    toxic = proxy.drop_reply_of("EVALSHA", nth=1)

    with pytest.raises(StoreUnavailable):
        store.save(running, expect_version=1)

    assert toxic.fired == 1
    direct = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    assert direct.get("t1") == running, "the save ran although its caller saw an error"


def test_negative_control_a_script_without_a_token_double_applies_under_retry(
    proxy: FaultProxy, redis_proc: RedisProc
) -> None:
    """Why the tokens matter: the same proxy fault makes a naive INCR script run twice."""
    client = redis.Redis(port=proxy.port)
    naive = client.register_script("return redis.call('INCR', KEYS[1])")
    naive.sha = client.script_load(naive.script)
    key = "negative-control-counter"
    redis_proc.client().delete(key)
    toxic = proxy.drop_reply_of("EVALSHA", nth=1)

    naive(keys=[key])

    assert toxic.fired == 1
    assert int(redis_proc.client().get(key) or 0) == 2, "one call, two increments"


# -- a create retried after a worker moved the task on ---------------------------------------
# The reply of a create is lost, and before the client's retry arrives a worker has started the
# task (its write replaced the token in 'w'). The retry carries the create's token; the task
# keeps that token in 'ct', so the retry is the same create, never TaskAlreadyExists.


def started_by_a_worker(store: RedisTaskStore, task_id: str) -> TaskSnapshot:
    (started,) = store.start_tasks(owner="w1", now=T0 + timedelta(seconds=1),
                                   lease_until=T0 + timedelta(seconds=60), buckets=[0])  # fmt: skip
    assert started.task_id == task_id and started.status is TaskStatus.RUNNING
    return started


@pytest.mark.parametrize("path", ["create", "commit_tasks"])
def test_a_create_retried_after_a_worker_started_the_task_is_the_same_create(
    redis_proc: RedisProc, namespace: str, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    new = task("t1")

    def create() -> object:
        if path == "create":
            return store.create(new)
        (error,) = store.commit_tasks([(new, None, [])])
        return error

    import chongming_redis.stores._redis.rows as rows

    monkeypatch.setattr(rows, "write_token", lambda: "tokenAAA")
    assert create() is None
    running = started_by_a_worker(store, "t1")
    assert create() is None, "the retry of the landed create is the same create"
    assert store.get("t1") == running, "and it wrote nothing"
    assert store.counts()[TaskStatus.RUNNING] == 1 and store.counts()[TaskStatus.PENDING] == 0
    assert [e.version for e in store.history("t1")] == [2], "no second creation entry"

    monkeypatch.setattr(rows, "write_token", lambda: "tokenBBB")
    if path == "create":
        with pytest.raises(TaskAlreadyExists):
            create()  # another call with the same snapshot is a second create: refused
    else:
        assert isinstance(create(), TaskAlreadyExists)
    assert store.get("t1") == running


def test_a_save_may_neither_write_nor_delete_the_create_token(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    store.create(task("t1"))
    script = store._scripts["save"]
    key, root = store.keys.task("t1"), store.keys.root
    fields = ["s", "pending", "b", "0", "c", "1", "n", "job", "v", "2", "u", "1"]
    reply = script(keys=[key, root], args=["t1", "tok", "1", 0, "ct", "forged", *fields])
    assert reply[0] == b"BADARG"
    for token_field in ("ct", "w"):  # nor delete it: the retry check would be gone for good
        reply = script(keys=[key, root], args=["t1", "tok", "1", 1, token_field, *fields])
        assert reply[0] == b"BADARG", token_field
    assert store._client.hget(key, "ct") is not None and store.get("t1") == task("t1")


def test_a_retried_schedule_write_answers_what_it_did_and_fires_once(
    proxy: FaultProxy, namespace: str
) -> None:
    """A tick's firing (or a trigger) whose reply was lost: the retry finds its token, answers
    the new version and that the task was created, and writes nothing more (without it, the
    caller saw a conflict, read again and triggered a second task)."""
    store = through(proxy, namespace)
    store.write_schedule("s", "v1", expect_version=0)
    toxic = proxy.drop_reply_of("EVALSHA", nth=1)

    sent = evalshas_during(
        proxy, lambda: store.write_schedule("s", "v2", expect_version=1, task=task("s@tick"))
    )
    assert toxic.fired == 1 and sent == 2
    assert store.schedule_record("s") == (2, "v2")
    assert store.counts()[TaskStatus.PENDING] == 1

    toxic = proxy.drop_reply_of("EVALSHA", nth=1)
    assert evalshas_during(proxy, lambda: store.delete_schedule("s")) == 2
    assert toxic.fired == 1 and store.schedule_record("s") is None


def test_the_retried_write_reports_the_task_it_created(proxy: FaultProxy, namespace: str) -> None:
    store = through(proxy, namespace)
    store.write_schedule("s", "v1", expect_version=0)
    proxy.drop_reply_of("EVALSHA", nth=1)
    assert store.write_schedule("s", "v2", expect_version=1, task=task("s@tick")) == (2, True)
    proxy.drop_reply_of("EVALSHA", nth=1)
    assert store.delete_schedule("s") is True  # deleted by the first run: still "it existed"
