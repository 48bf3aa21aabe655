"""The task policies on the Redis store (``TaskPoliciesStore``; ``lua/lib/policies.lua``,
``lua/expire_finished.lua``), on one server and on Redis Cluster, beyond the shipped contract:
the hash fields and the derived keys (``{ns}:uq:<unique>``, ``{ns}:expiry``) as stored, each
kept by the very script that moves the task, and every answer equal to the reference
(``InMemoryTaskStore``) for the same writes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.crc import key_slot

from chongming_redis.embedded.redis_cluster import RedisClusterProcs
from chongming_redis.errors import CorruptRecord, TaskAlreadyExists, UniqueTaken
from chongming_redis.model import Command, CommandKind, TaskSnapshot, TaskStatus, Transition
from chongming_redis.policy import RetryPolicy
from chongming_redis.stores._redis import worker_ops
from chongming_redis.stores._redis.keys import Keys
from chongming_redis.stores._redis.rows import decode_task, fast_snapshot
from chongming_redis.stores.codec import encode_dt
from chongming_redis.stores.extensions import TaskPoliciesStore
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.redis import RedisTaskStore
from chongming_redis.stores.redis_async import AsyncRedisTaskStore
from tests.support.redis_server import RedisProc

T0 = datetime(2026, 1, 1, tzinfo=UTC)
P, R, S = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED
FINAL = [S, TaskStatus.FAILED, TaskStatus.STOPPED, TaskStatus.LOST]


def task(task_id: str, status: TaskStatus = P, version: int = 1, at: float = 0.0,
         **fields: Any) -> TaskSnapshot:  # fmt: skip
    return TaskSnapshot(task_id, "job", status, version, T0, T0 + timedelta(seconds=at), **fields)


def moved(snapshot: TaskSnapshot, status: TaskStatus, at: float = 0.0) -> TaskSnapshot:
    """The snapshot's next version, in ``status``, written ``at`` seconds after T0."""
    return snapshot.evolve(status=status, status_version=snapshot.status_version + 1,
                           updated_at=T0 + timedelta(seconds=at))  # fmt: skip


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture(params=["redis", "cluster"])
def server(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """The URL of a server (a node of the cluster), and whether it is a cluster."""
    if request.param == "redis":
        proc: RedisProc = request.getfixturevalue("redis_proc")
        return proc.url, False
    cluster: RedisClusterProcs = request.getfixturevalue("redis_cluster")
    return cluster.url, True


@pytest.fixture
def store(server: tuple[str, bool], namespace: str) -> Iterator[RedisTaskStore]:
    opened = RedisTaskStore.from_url(server[0], namespace=namespace, cluster=server[1])
    yield opened
    opened.drop_namespace()
    opened.close()


def record(store: RedisTaskStore, unique: str) -> str | None:
    """What ``{ns}:uq:<unique>`` holds, as stored."""
    raw: bytes | None = store.client.get(store.keys.unique(unique))  # type: ignore[assignment]
    return None if raw is None else raw.decode()


def expiry_queue(store: RedisTaskStore) -> list[tuple[str, int]]:
    """``{ns}:expiry`` as stored: (task id, expiry in µs), earliest first."""
    entries: Any = store.client.zrange(store.keys.expiry, 0, -1, withscores=True)
    return [(member.decode(), int(score)) for member, score in entries]


def both(redis_store: RedisTaskStore, scenario: Callable[[Any], Any]) -> Any:
    """``scenario`` run on ``redis_store`` and on a fresh reference store: their answers agree
    (an exception counts as its type and arguments). Returns the Redis answer."""

    def outcome(target: Any) -> Any:
        try:
            return scenario(target)
        except Exception as exc:  # compared, not swallowed
            return (type(exc), exc.args)

    got, want = outcome(redis_store), outcome(InMemoryTaskStore())
    assert got == want
    return got


# -- the fields in the task hash ---------------------------------------------------------------


def test_the_five_policy_fields_round_trip_as_short_hash_fields(store: RedisTaskStore) -> None:
    policy = RetryPolicy(max_attempts=5, base_delay=0.5, retry_on=(ValueError,))
    full = task("a", retry=policy, timeout=1.25, deadline=at(3), retention=86400.0, unique="u-1")
    store.create(full)
    assert store.get("a") == full
    stored = store.client.hgetall(store.keys.task("a"))
    assert {f: stored[f] for f in (b"rt", b"to", b"dl", b"rn", b"uq")} == {
        b"rt": policy.to_json().encode(), b"to": b"1.25",
        b"dl": str(encode_dt(at(3))).encode(), b"rn": b"86400.0",
        b"uq": b"u-1",
    }  # fmt: skip
    # A save to None deletes the fields: absent reads None, as a hash written before them.
    bare = moved(full, P).evolve(retry=None, timeout=None, deadline=None, retention=None,
                                 unique=None)  # fmt: skip
    store.save(bare, expect_version=1)
    assert store.get("a") == bare
    assert not {b"rt", b"to", b"dl", b"rn", b"uq"} & set(store.client.hgetall(store.keys.task("a")))
    assert record(store, "u-1") is None  # its unique id went with the field


def test_the_fast_decoder_reads_the_policy_fields_as_the_strict_one_does() -> None:
    keys = Keys("ns1")
    full = task("a", retry=RetryPolicy(jitter=0.0), timeout=0.5, deadline=at(1), retention=7.0,
                unique="u")  # fmt: skip
    fields = {b"n": b"job", b"s": b"pending", b"v": b"1", b"c": b"%d" % encode_dt(T0),
              b"u": b"%d" % encode_dt(T0), b"b": b"0", b"at": b"1", b"w": b"tok",
              b"rt": full.retry.to_json().encode(), b"to": b"0.5",  # type: ignore[union-attr]
              b"dl": b"%d" % encode_dt(at(1)), b"rn": b"7", b"uq": b"u"}  # fmt: skip
    assert fast_snapshot("a", fields) == decode_task(keys, "a", {**fields, b"zz": b"1"}) == full
    for field, odd in [(b"to", b"nan"), (b"to", b"-1"), (b"to", b"0x10"), (b"rn", b"0"),
                       (b"rt", b"[1]"), (b"uq", b"\xff"), (b"dl", b"soon")]:  # fmt: skip
        broken = {**fields, field: odd}
        assert fast_snapshot("a", broken) is None, (field, odd)
        with pytest.raises(CorruptRecord):
            decode_task(keys, "a", broken)


def test_a_task_without_policies_writes_none_of_their_fields_or_keys(
    store: RedisTaskStore,
) -> None:
    store.create(task("a"))
    store.save(moved(task("a"), S, at=1), expect_version=1)
    assert not {b"rt", b"to", b"dl", b"rn", b"uq"} & set(store.client.hgetall(store.keys.task("a")))
    assert store.client.exists(store.keys.expiry) == 0
    assert isinstance(store, TaskPoliciesStore)


def test_every_policy_key_stays_in_the_namespace_slot() -> None:
    keys = Keys("ns1")
    for key in (keys.unique("u{x}:t:1"), keys.expiry):
        assert key.startswith("{ns1}:") and key_slot(key.encode()) == key_slot(b"ns1"), key
    assert keys.unique("x") not in {keys.task("x"), keys.expiry, keys.counts}


# -- unique ids --------------------------------------------------------------------------------


def test_a_unique_id_held_by_an_unfinished_task_refuses_another_create(
    store: RedisTaskStore,
) -> None:
    store.create(task("a", unique="u"))
    assert store.unique_holder("u") == "a" and record(store, "u") == "a"
    head = store.feed_stats().head
    with pytest.raises(UniqueTaken) as taken:
        store.create(task("b", unique="u"))
    assert (taken.value.unique, taken.value.holder) == ("u", "a")
    assert store.get("b") is None and store.counts()[P] == 1  # nothing written
    assert store.feed_stats().head == head
    with pytest.raises(TaskAlreadyExists):  # the id first, as the reference
        store.create(task("a", unique="other"))
    assert store.unique_holder("other") is None


def test_a_retried_create_is_not_refused_by_its_own_unique_record(store: RedisTaskStore) -> None:
    """The same script call sent twice (the first reply lost): the second finds its token."""
    request = next(worker_ops.create(store.keys, task("a", unique="u")))
    store._request(request)
    assert store._request(request) == ["OK", b"APPLIED"]
    assert store.unique_holder("u") == "a"


@pytest.mark.parametrize("final", FINAL, ids=lambda s: s.value)
def test_the_write_that_finishes_the_task_lets_its_unique_id_go(
    store: RedisTaskStore, final: TaskStatus
) -> None:
    store.create(task("a", unique="u"))
    store.save(moved(task("a", unique="u"), R), expect_version=1)
    store.save(moved(task("a", R, 2, unique="u"), final), expect_version=2)
    assert store.unique_holder("u") is None and record(store, "u") is None
    store.create(task("b", unique="u"))  # free again
    assert store.unique_holder("u") == "b"


def test_a_retry_by_hand_takes_the_id_again_or_is_refused(store: RedisTaskStore) -> None:
    done = moved(task("a", unique="u"), S)
    store.create(task("a", unique="u"))
    store.save(done, expect_version=1)
    store.save(moved(done, P), expect_version=2)  # retried by hand: holds it again
    assert store.unique_holder("u") == "a"
    store.save(moved(moved(done, P), S), expect_version=3)
    store.create(task("b", unique="u"))
    with pytest.raises(UniqueTaken) as taken:  # meanwhile b holds it
        store.save(task("a", P, 5, unique="u"), expect_version=4)
    assert taken.value.holder == "b"
    assert store.get("a").status_version == 4  # type: ignore[union-attr]
    # A finished a written again (final to final) never drops b's record.
    store.save(task("a", TaskStatus.FAILED, 5, unique="u"), expect_version=4)
    assert record(store, "u") == "b" and store.unique_holder("u") == "b"


def test_renaming_an_unfinished_tasks_unique_id_never_takes_anothers(
    store: RedisTaskStore,
) -> None:
    """Not a case the policies write (a task's unique id is frozen at submit), and not one the
    reference refuses: the save goes through, the id stays with its holder, and the renamed
    task never holds it (the reference would count it as a holder too)."""
    store.create(task("a", unique="u"))
    store.create(task("b", unique="v"))
    store.save(moved(task("b", unique="v"), R).evolve(unique="u"), expect_version=1)
    assert (store.unique_holder("u"), store.unique_holder("v")) == ("a", None)
    store.save(moved(task("a", unique="u"), S), expect_version=1)
    assert store.unique_holder("u") is None


def test_a_record_that_names_no_holder_is_taken_over(store: RedisTaskStore) -> None:
    """Left by another client (the task gone, or finished): it holds nothing."""
    store.client.set(store.keys.unique("u"), "ghost")
    assert store.unique_holder("u") is None
    store.create(task("a", unique="u"))
    assert record(store, "u") == "a"


def test_a_unique_record_of_another_type_is_corrupt_and_nothing_is_written(
    store: RedisTaskStore,
) -> None:
    store.client.hset(store.keys.unique("u"), "x", "1")
    with pytest.raises(CorruptRecord) as caught:
        store.create(task("a", unique="u"))
    assert caught.value.key == store.keys.unique("u")
    assert store.get("a") is None and store.counts()[P] == 0


def test_a_stored_retention_that_does_not_decode_is_corrupt_for_a_save(
    store: RedisTaskStore,
) -> None:
    store.create(task("a", retention=5.0))
    store.client.hset(store.keys.task("a"), "rn", "soon")  # another client's write
    with pytest.raises(CorruptRecord) as caught:
        store.save(moved(task("a", retention=5.0), S), expect_version=1)
    assert (caught.value.key, caught.value.field) == (store.keys.task("a"), "rn")
    assert store.client.hget(store.keys.task("a"), "v") == b"1" and expiry_queue(store) == []


def test_commit_tasks_refuses_per_item_and_writes_the_others(store: RedisTaskStore) -> None:
    store.create(task("a", unique="u"))
    entry = Transition("b", 1, None, P, T0)
    results = store.commit_tasks([
        (task("b", unique="u"), None, [entry]),  # held before the call
        (task("c", unique="v"), None, []),
        (task("d", unique="v"), None, []),  # taken by the item before: one holder only
        (task("e", unique="w"), None, []),
    ])  # fmt: skip
    names = [type(r).__name__ if r else None for r in results]
    assert names == ["UniqueTaken", None, "UniqueTaken", None]
    assert (results[0].unique, results[0].holder) == ("u", "a")  # type: ignore[union-attr]
    assert (results[2].unique, results[2].holder) == ("v", "c")  # type: ignore[union-attr]
    assert store.get("b") is None and store.history("b") == [] and store.get("d") is None
    assert {u: store.unique_holder(u) for u in "uvw"} == {"u": "a", "v": "c", "w": "e"}


def test_the_async_stores_commit_tasks_refuses_the_same_way(
    store: RedisTaskStore, server: tuple[str, bool]
) -> None:
    store.create(task("a", unique="u"))

    async def commit() -> list[Any]:
        producer = AsyncRedisTaskStore.from_url(server[0], namespace=store.namespace,
                                                cluster=server[1])  # fmt: skip
        try:
            return await producer.commit_tasks([(task("b", unique="u"), None, []),
                                                (task("c", unique="v"), None, [])])  # fmt: skip
        finally:
            await producer.aclose()

    refused, created = asyncio.run(commit())
    assert isinstance(refused, UniqueTaken) and (refused.unique, refused.holder) == ("u", "a")
    assert created is None and store.unique_holder("v") == "c"


def test_commit_tasks_judges_each_unique_id_after_the_items_before_it(
    store: RedisTaskStore,
) -> None:
    """As if the items were written one by one, as on the reference: finishing a lets b take
    its id in the same call; a retry by hand of b's twin then meets b."""

    def scenario(target: Any) -> Any:
        target.create(task("a", unique="u"))
        target.create(task("c", S, unique="u"))  # finished: holds nothing
        first = target.commit_tasks([(moved(task("a", unique="u"), S), 1, []),
                                     (task("b", unique="u"), None, []),
                                     (moved(task("c", S, unique="u"), P), 1, [])])  # fmt: skip
        return [repr(r) for r in first], target.unique_holder("u")

    results, holder = both(store, scenario)
    assert results[:2] == ["None", "None"] and "UniqueTaken" in results[2] and holder == "b"


def test_a_reconcile_marking_the_task_lost_through_commit_tasks_lets_it_go(
    store: RedisTaskStore,
) -> None:
    store.create(task("a", unique="u"))
    running = moved(task("a", unique="u"), R)
    store.save(running, expect_version=1)
    lost = Transition("a", 3, R, TaskStatus.LOST, at(9), "lease expired")
    assert store.commit_tasks([(moved(running, TaskStatus.LOST, at=9), 2, [lost])]) == [None]
    assert store.unique_holder("u") is None and record(store, "u") is None


# -- start_tasks' deadline ---------------------------------------------------------------------


def test_start_tasks_sets_the_deadline_from_the_timeout_to_the_microsecond(
    store: RedisTaskStore,
) -> None:
    # Awkward timeouts: fractions of a microsecond, halves (rounded to even, as Python does).
    timeouts = [2.5, 1e-06, 1.5e-06, 2.5e-06, 0.0000035, 1234.5678905, 30 * 86400.0]

    def scenario(target: Any) -> Any:
        for i, timeout in enumerate(timeouts):
            target.create(task(f"t{i}", at=i, timeout=timeout))
        target.create(task("kept", at=99, deadline=at(5)))  # no timeout: its deadline stays
        started = target.start_tasks(owner="w", now=at(100) + timedelta(microseconds=7),
                                     lease_until=at(200), buckets=[0])  # fmt: skip
        return sorted((s.task_id, s.deadline) for s in started)

    deadlines = dict(both(store, scenario))
    assert deadlines["t0"] == at(102.5) + timedelta(microseconds=7)
    assert deadlines["kept"] == at(5)
    assert store.get("t0").deadline == deadlines["t0"]  # type: ignore[union-attr]


# -- retention: expire_finished and expiry_backlog --------------------------------------------


def finished(store: Any, task_id: str, retention: float | None, done_at: float,
             **fields: Any) -> None:  # fmt: skip
    """A task created, then finished ``done_at`` seconds after T0."""
    store.create(task(task_id, retention=retention, **fields))
    store.save(moved(task(task_id, retention=retention, **fields), S, at=done_at),
               expect_version=1)  # fmt: skip


def test_the_expiry_queue_follows_the_writes(store: RedisTaskStore) -> None:
    store.create(task("a", retention=10.0))
    assert expiry_queue(store) == []  # unfinished: never in it
    store.save(moved(task("a", retention=10.0), S, at=5), expect_version=1)
    assert expiry_queue(store) == [("a", encode_dt(at(15)))]
    store.save(moved(moved(task("a", retention=10.0), S, at=5), P, at=6), expect_version=2)
    assert expiry_queue(store) == []  # retried by hand: kept again
    store.create(task("b", S, retention=1.0))  # created finished
    assert [m for m, _ in expiry_queue(store)] == ["b"]


def test_expire_finished_removes_the_earliest_expiries_first_within_the_limit(
    store: RedisTaskStore,
) -> None:
    def scenario(target: Any) -> Any:
        finished(target, "late", 100.0, done_at=0)
        finished(target, "early", 1.0, done_at=0, tags=frozenset({"x"}), pipeline_run_id="p")
        finished(target, "tie-b", 10.0, done_at=0)
        finished(target, "tie-a", 5.0, done_at=5)  # the same expiry as tie-b: by id
        finished(target, "unexpired", 1000.0, done_at=0)
        finished(target, "kept-forever", None, done_at=0)
        target.create(task("unfinished", retention=0.5))
        target.submit_command(Command("c1", "early", CommandKind.STOP, T0))
        target.append(Transition("early", 3, S, S, at(1), "noted"))
        first = target.expire_finished(now=at(200), limit=2)
        second = target.expire_finished(now=at(200), limit=1000)
        third = target.expire_finished(now=at(200))
        return (first, second, third, sorted(s.task_id for s in target.query()),
                target.history("early"), target.task_commands("early"),
                target.get_command("c1") is not None, target.counts(),
                target.changes("0", limit=100).tasks)  # fmt: skip

    first, second, third, left, history, commands, command_kept, _, _ = both(store, scenario)
    assert (first, second, third) == (["early", "tie-a"], ["tie-b", "late"], [])
    assert left == ["kept-forever", "unexpired", "unfinished"]
    assert history == [] and commands == [] and command_kept  # listing gone, command readable
    assert not store.client.exists(store.keys.history("early"), store.keys.task_commands("early"))
    for name in ("tag", "pipeline"):
        key = store.keys.tag("x") if name == "tag" else store.keys.pipeline("p")
        assert store.client.exists(key) == 0, name
    assert [m for m, _ in expiry_queue(store)] == ["unexpired"]


def test_expire_finished_in_several_script_calls_keeps_the_order(
    store: RedisTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_ops, "EXPIRE_BATCH", 2)
    for i in range(7):
        finished(store, f"t{i}", 10.0 + (7 - i), done_at=0)
    calls: list[str] = []
    real = store._run

    def counting(name: str, *args: Any, **about: Any) -> Any:
        calls.append(name)
        return real(name, *args, **about)

    monkeypatch.setattr(store, "_run", counting)
    assert store.expire_finished(now=at(100), limit=5) == ["t6", "t5", "t4", "t3", "t2"]
    assert calls == ["expire_finished"] * 3
    assert store.expire_finished(now=at(100), limit=5) == ["t1", "t0"]


def test_expiry_backlog_counts_the_due_and_names_the_next(store: RedisTaskStore) -> None:
    def scenario(target: Any) -> Any:
        before = target.expiry_backlog(now=at(0))
        finished(target, "a", 10.0, done_at=0)
        finished(target, "b", 20.0, done_at=0)
        finished(target, "c", 30.0, done_at=0)
        target.create(task("d", retention=1.0))  # unfinished: not counted
        return (before, target.expiry_backlog(now=at(10)), target.expiry_backlog(now=at(25)),
                target.expiry_backlog(now=at(99)))  # fmt: skip

    assert both(store, scenario) == ((0, None), (1, at(20)), (2, at(30)), (3, None))


def test_a_read_only_dashboard_user_reads_the_holder_and_the_backlog(
    fresh_redis_proc: RedisProc,
) -> None:
    """The rules docs/redis-layout.md gives a read-only dashboard user are enough."""
    writer = RedisTaskStore.from_url(fresh_redis_proc.url, namespace="dash")
    writer.create(task("a", unique="u"))
    finished(writer, "b", 10.0, done_at=0)
    rules = ("-@all", "+@read", "-@dangerous", "+multi", "+exec")
    user = ("ACL", "SETUSER", "reader", "on", ">pw", "resetkeys", writer.keys.pattern(), *rules)
    fresh_redis_proc.client().execute_command(*user)  # type: ignore[no-untyped-call]
    reader = RedisTaskStore.from_url(fresh_redis_proc.url, namespace="dash", username="reader",
                                     password="pw", check_server=False)  # fmt: skip
    assert reader.unique_holder("u") == "a"
    assert reader.expiry_backlog(now=at(5)) == (0, at(10))
    reader.close()
    writer.close()


def test_an_entry_that_does_not_match_its_task_is_put_right_never_removed_from(
    store: RedisTaskStore,
) -> None:
    """Entries another client wrote: an unfinished task, a missing one, a finished one whose
    own expiry is later. None of them is removed; each entry is dropped or re-scored."""
    store.create(task("live", retention=1.0))
    finished(store, "later", 500.0, done_at=0)
    finished(store, "due", 1.0, done_at=0)
    queue = store.keys.expiry
    store.client.zadd(queue, {"live": 0, "gone": 0, "later": 0})
    assert store.expire_finished(now=at(100)) == ["due"]
    assert sorted(expiry_queue(store)) == [("later", encode_dt(at(500)))]
    assert store.get("live") is not None and store.get("later") is not None


def test_prune_removes_the_expiry_entry_and_a_record_still_naming_the_task(
    store: RedisTaskStore,
) -> None:
    finished(store, "a", 10.0, done_at=0, unique="u")
    store.client.set(store.keys.unique("u"), "a")  # left by another client
    assert store.prune(keep_terminal=0) == 1
    assert expiry_queue(store) == [] and record(store, "u") is None
    assert store.expiry_backlog(now=at(100)) == (0, None)


def test_a_random_history_of_writes_agrees_with_the_reference(store: RedisTaskStore) -> None:
    """Creates, saves, commits (creates and saves), starts, expiries and prunes over a few
    unique ids, drawn with a fixed seed: every answer, holder and backlog equal to the
    reference's."""

    def scenario(target: Any) -> Any:
        rng, seen = random.Random(25), []
        for step in range(250):
            seen.append(_random_step(target, rng, step))
            seen.append([target.unique_holder(u) for u in UNIQUES])
            seen.append(target.expiry_backlog(now=at(step)))
        seen.append(sorted(target.query(), key=lambda s: s.task_id))
        return seen

    seen = both(store, scenario)
    # The draw exercises what it is for: refusals, and tasks expired.
    assert sum("UniqueTaken" in repr(s) for s in seen) >= 10
    assert any(isinstance(s, list) and s[:1] == ["expired"] and len(s) > 1 for s in seen)


UNIQUES = ("u0", "u1", "u2")
STEP_KINDS = ["create"] * 3 + ["save"] * 3 + ["commit"] * 2 + ["start", "expire", "prune"]


def _random_step(target: Any, rng: random.Random, step: int) -> Any:
    kind = rng.choice(STEP_KINDS)
    try:
        if kind == "create":
            target.create(_random_task(rng, step))
            return kind
        if kind == "save":
            item = _random_save(target, rng, step)
            if item is None:
                return None
            target.save(item[0], expect_version=item[1])
            return kind
        if kind == "commit":
            return _random_commit(target, rng, step)
        if kind == "start":
            started = target.start_tasks(owner="w", now=at(step), lease_until=at(step + 9),
                                         buckets=[0], limit=2)  # fmt: skip
            return [(s.task_id, s.deadline) for s in started]
        if kind == "expire":
            return ["expired", *target.expire_finished(now=at(step), limit=rng.randint(1, 3))]
        return target.prune(keep_terminal=rng.randint(0, 4))
    except Exception as exc:  # compared with the reference's
        return (type(exc).__name__, exc.args)


def _random_task(rng: random.Random, step: int) -> TaskSnapshot:
    return task(f"t{rng.randrange(12)}", status=rng.choice([P, P, P, S]), at=step,
                unique=rng.choice([None, *UNIQUES]), retention=rng.choice([None, 1.0, 5.5, 30.0]),
                timeout=rng.choice([None, 0.5]))  # fmt: skip


def _random_save(target: Any, rng: random.Random, step: int) -> tuple[TaskSnapshot, int] | None:
    """The next version of a stored task in a random status (sometimes with another unique
    id or retention), and the version to expect; ``None`` when the task drawn is not stored."""
    current = target.get(f"t{rng.randrange(12)}")
    if current is None:
        return None
    new = moved(current, rng.choice([P, R, *FINAL]), at=step)
    if rng.random() < 0.2:
        new = new.evolve(retention=rng.choice([None, 2.0]))
    # Another unique id only on a write from or to a final status: an unfinished task renamed
    # to an id another one holds keeps no claim on it here, while the reference counts both.
    if rng.random() < 0.2 and (current.status.is_terminal or new.status.is_terminal):
        new = new.evolve(unique=rng.choice([None, *UNIQUES]))
    return new, current.status_version


def _random_commit(target: Any, rng: random.Random, step: int) -> list[str]:
    items: list[Any] = []
    for _ in range(rng.randint(1, 3)):
        drawn = _random_save(target, rng, step) if rng.random() < 0.6 else None
        snapshot, expect = drawn if drawn else (_random_task(rng, step), None)
        if snapshot.task_id not in {i[0].task_id for i in items}:
            items.append((snapshot, expect, []))
    return [repr(r) for r in target.commit_tasks(items)]
