"""``query.lua`` picks the index it walks by cardinality, from the counters alone: with a tag or
pipeline filter plus a status, bucket, name or name prefix filter it walks whichever of the
tag/pipeline index and the composite keys ``ix:<status>:<bucket>:<name>`` holds fewer tasks,
and checks the rest per task. Here: each choice is made (the script reports the source it
walked), the answers equal the in-memory store's whichever side is smaller, both directions,
with tiny pages and with keyset paging; a tag on every task with a rare status is one round
trip (it was one call per 1,000 tagged tasks: ~1.4 s at 100,000); and a query whose choice
flips between the calls of one paging loop (the counts change in between) still returns every
match once, in order.

Why a flip is safe: every source is ordered by ``(created_at, task_id)`` and the cursor is a
position in that order, not in a source. Each source holds every match (the tag index and the
composite keys both imply their own filters, and every other filter is checked per task), so
the matches strictly after the cursor are the same whichever source is walked."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone

import pytest

from chongming_redis.model import TaskQuery, TaskSnapshot, TaskStatus
from chongming_redis.stores._redis import ops
from chongming_redis.stores._redis.replies import text
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.redis import QUERY_BUDGET, QUERY_PAGE, RedisTaskStore
from chongming_redis.testing.contract.support import CORE_STATUSES
from tests.support.redis_server import RedisProc
from tests.test_redis_dashboard_reads import requests_during as round_trips

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]
BASE = datetime(2026, 1, 1, tzinfo=timezone.utc)
F, S, R, P = TaskStatus.FAILED, TaskStatus.SUCCEEDED, TaskStatus.RUNNING, TaskStatus.PENDING
Stores = tuple[RedisTaskStore, InMemoryTaskStore]


def make(
    task_id: str,
    *,
    ms: int,
    name: str = "a",
    status: TaskStatus = S,
    bucket: int = 0,
    tags: frozenset[str] = frozenset(),
    pipeline: str | None = None,
) -> TaskSnapshot:
    at = BASE + timedelta(milliseconds=ms)
    return TaskSnapshot(task_id=task_id, name=name, status=status, status_version=1,
                        created_at=at, updated_at=at, bucket=bucket, tags=tags,
                        pipeline_run_id=pipeline)  # fmt: skip


def add(stores: Stores, tasks: list[TaskSnapshot]) -> None:
    redis_store, memory = stores
    for start in range(0, len(tasks), 100):
        assert not any(
            redis_store.commit_tasks([(t, None, ()) for t in tasks[start : start + 100]])
        )
    for t in tasks:
        memory.create(t)


def run(
    store: RedisTaskStore,
    query: TaskQuery,
    *,
    page: int = QUERY_PAGE,
    budget: int = QUERY_BUDGET,
    after: tuple[datetime, str] | None = None,
    between: Callable[[int], None] | None = None,
) -> tuple[list[str], list[str]]:
    """``query`` (``query_page`` with ``after``) with the given page sizes: the ids found, and
    the source each script call walked. ``between(n)`` runs before call n + 1 (n >= 1)."""
    plan = ops.query(store.keys, query, page_size=page, page_budget=budget, after=after)
    reply, sources = None, []
    while True:
        try:
            request = plan.send(reply)
        except StopIteration as done:
            return [t.task_id for t in done.value], sources
        if sources and between is not None:
            between(len(sources))
        reply = store._request(request)
        sources.append(text(reply[4]))


def ids(tasks: list[TaskSnapshot]) -> list[str]:
    return [t.task_id for t in tasks]


# -- either side the smaller ------------------------------------------------------------------


def mixed(i: int) -> TaskSnapshot:
    """800 tasks: a tag on 90% and one on 3%, a pipeline on 80% and one on 3%, 20 FAILED,
    bucket 5 on 16, the names z / zeta on 18; created_at with ties."""
    name = "zeta" if i % 90 == 2 else "z" if i % 45 == 2 else ("a", "b")[i % 2]
    tags = {"common"} if i % 10 != 9 else set()
    if i % 37 == 0:
        tags.add("rare")
    pipeline = "small" if i % 31 == 0 else "big" if i % 10 != 8 else None
    return make(f"t{(i * 7919) % 800:03d}", ms=(i * 389) % 300, name=name,
                status=F if i % 40 == 0 else (S, R, P)[i % 3],
                bucket=5 if i % 50 == 1 else i % 5, tags=frozenset(tags),
                pipeline=pipeline)  # fmt: skip


@pytest.fixture(scope="module")
def stores(redis_proc: RedisProc) -> Iterator[Stores]:
    redis_store = RedisTaskStore.from_url(redis_proc.url, namespace="source-test")
    memory = InMemoryTaskStore()
    add((redis_store, memory), [mixed(i) for i in range(800)])
    yield redis_store, memory
    redis_store.drop_namespace()
    redis_store.close()


#: (query, the source the script walks): the composite keys when they hold fewer tasks than
#: the tag / pipeline index, else that index (the smaller of the two when both are named).
CHOICES = [
    (TaskQuery(tag="common", statuses=frozenset({F})), "ix"),  # 20 against 720
    (TaskQuery(tag="rare", statuses=frozenset({S, R})), "tag"),  # ~500 against 22
    (TaskQuery(pipeline_run_id="big", buckets=frozenset({5})), "ix"),  # 16 against ~620
    (TaskQuery(pipeline_run_id="small", buckets=frozenset({0, 1, 2})), "p"),  # ~470 against 26
    (TaskQuery(tag="common", name="z"), "ix"),  # by the name counts: 9 against 720
    (TaskQuery(tag="rare", name="a"), "tag"),
    (TaskQuery(tag="common", name_prefix="z"), "ix"),  # z and zeta: 18 against 720
    (TaskQuery(tag="rare", name_prefix="b", statuses=frozenset({S})), "tag"),
    (TaskQuery(tag="common", pipeline_run_id="small"), "p"),
    (TaskQuery(tag="rare", pipeline_run_id="big"), "tag"),
    (TaskQuery(tag="common", pipeline_run_id="big", statuses=frozenset({F})), "ix"),
    (TaskQuery(tag="common", statuses=frozenset({F}), name="a", buckets=frozenset({0, 2})), "ix"),
    (TaskQuery(tag="common", name="z", name_prefix="a"), "ix"),  # nothing: no composite key
]


@pytest.mark.parametrize(("query", "source"), CHOICES, ids=[str(i) for i in range(len(CHOICES))])
@pytest.mark.parametrize("newest_first", [False, True], ids=["asc", "desc"])
@pytest.mark.parametrize(("page", "budget"), [(QUERY_PAGE, QUERY_BUDGET), (2, 3), (1, 1)])
def test_each_source_answers_as_the_memory_store(
    stores: Stores, query: TaskQuery, source: str, newest_first: bool, page: int, budget: int
) -> None:
    redis_store, memory = stores
    for limit in (None, 7):
        q = TaskQuery(**{**query.__dict__, "newest_first": newest_first, "limit": limit})
        found, sources = run(redis_store, q, page=page, budget=budget)
        assert found == ids(memory.query(q))
        assert set(sources) == {source}


def test_every_choice_but_the_empty_one_has_matches(stores: Stores) -> None:
    _, memory = stores
    assert [bool(memory.query(q)) for q, _ in CHOICES] == [True] * (len(CHOICES) - 1) + [False]


@pytest.mark.parametrize(("query", "source"), CHOICES, ids=[str(i) for i in range(len(CHOICES))])
@pytest.mark.parametrize("newest_first", [False, True], ids=["asc", "desc"])
def test_keyset_pages_on_either_source_equal_the_memory_store(
    stores: Stores, query: TaskQuery, source: str, newest_first: bool
) -> None:
    redis_store, memory = stores
    q = TaskQuery(**{**query.__dict__, "newest_first": newest_first, "limit": 3})
    after: tuple[datetime, str] | None = None
    walked: list[str] = []
    while True:
        found, sources = run(redis_store, q, page=2, budget=2, after=after)
        assert found == ids(memory.query_page(q, after=after))
        assert set(sources) == {source}
        if not found:
            break
        walked += found
        last = redis_store.get(found[-1])
        assert last is not None
        after = (last.created_at, last.task_id)
    everything = TaskQuery(**{**q.__dict__, "limit": None})
    assert walked == ids(memory.query(everything))


def test_an_undecided_choice_keeps_the_tag_index(redis_proc: RedisProc, namespace: str) -> None:
    """A name filter over more than 64 (status, bucket) pairs whose counts do not settle it
    within 64 name-count reads: the tag index is walked, and the answer is the same."""
    redis_store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    memory = InMemoryTaskStore()
    statuses = list(CORE_STATUSES)  # seven: a WAITING task would need parents
    tasks = [make(f"t{i:04d}", ms=i % 97, name="rare" if i % 250 == 0 else "job",
                  status=statuses[i % 7], bucket=(i // 7) % 16,
                  tags=frozenset({"some"}) if i % 8 == 0 else frozenset())
             for i in range(7 * 16 * 9)]  # fmt: skip
    add((redis_store, memory), tasks)
    q = TaskQuery(tag="some", name="rare")
    found, sources = run(redis_store, q)
    assert sources == ["tag"] and found == ids(memory.query(q)) and found
    redis_store.drop_namespace()
    redis_store.close()


# -- the bound --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tagged(redis_proc: RedisProc) -> Iterator[Stores]:
    """20,000 tasks, every one tagged ``prod`` and in pipeline ``run``; 3 FAILED, 4 named
    ``rare``, 5 in bucket 31."""
    redis_store = RedisTaskStore.from_url(redis_proc.url, namespace="source-bound")
    memory = InMemoryTaskStore()
    add((redis_store, memory), [
        make(f"t{i:05d}", ms=i // 3, status=F if i % 7000 == 5 else S,
             name="rare" if i % 5003 == 7 else "job", bucket=31 if i % 4001 == 9 else i % 16,
             tags=frozenset({"prod"}), pipeline="run")
        for i in range(20_000)
    ])  # fmt: skip
    yield redis_store, memory
    redis_store.drop_namespace()
    redis_store.close()


@pytest.mark.parametrize(
    ("query", "matches"),
    [
        (TaskQuery(tag="prod", statuses=frozenset({F}), limit=50), 3),
        (TaskQuery(tag="prod", statuses=frozenset({F}), limit=50, newest_first=True), 3),
        (TaskQuery(tag="prod", name="rare", limit=50), 4),
        (TaskQuery(pipeline_run_id="run", buckets=frozenset({31}), limit=50), 5),
    ],
)
def test_a_rare_status_among_20000_tagged_tasks_is_one_round_trip(
    tagged: Stores, query: TaskQuery, matches: int
) -> None:
    redis_store, memory = tagged
    redis_store.query(query)  # the first call may load the script (NOSCRIPT)
    assert round_trips(lambda: redis_store.query(query)) == 1
    assert ids(redis_store.query(query)) == ids(memory.query(query))
    assert len(memory.query(query)) == matches


# -- a choice that flips between the calls of one query --------------------------------------

#: Calls after which the other source becomes the smaller one.
FLIPS = 12


@pytest.mark.parametrize("newest_first", [False, True], ids=["asc", "desc"])
def test_a_query_whose_source_flips_between_calls_finds_every_match_once(
    redis_proc: RedisProc, namespace: str, newest_first: bool
) -> None:
    """12 FAILED tasks tagged ``t`` (created_at in ties of three) among 30 FAILED untagged: the
    tag index (12) is walked first. Between calls, alternately, tagged SUCCEEDED tasks (the
    tag index outgrows the composite keys: they are walked next) or untagged FAILED tasks
    (the other way: the tag index is walked next), at the same instants, with ids before,
    between and after the matches'; so each of the first FLIPS calls walks the other source.
    None of them matches, so the answer is the 12 in order, each once, whatever each call
    walked; one match a call and two entries examined, so calls end inside a tie and on
    entries that do not match."""
    redis_store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    memory = InMemoryTaskStore()
    both = (redis_store, memory)
    tag = frozenset({"t"})
    add(both, [make(f"m{i:02d}", ms=i // 3, status=F, tags=tag, bucket=i % 3) for i in range(12)])
    add(both, [make(f"f{i:02d}", ms=i % 5, status=F, bucket=i % 4) for i in range(30)])

    def grow(call: int) -> None:
        if call > FLIPS:
            return  # growth ahead of the cursor would outpace a walk of two entries a call
        prefix = "amz"[call % 3]
        tagged, failed = len(memory.query(TaskQuery(tag="t"))), memory.counts()[F]
        if call % 2:  # the tag index outgrows the composite keys
            extra = [make(f"{prefix}{call:03d}t{k:02d}", ms=k % 5, tags=tag)
                     for k in range(failed - tagged + 5)]  # fmt: skip
        else:  # the composite keys outgrow the tag index
            extra = [make(f"{prefix}{call:03d}f{k:02d}", ms=k % 5, status=F, bucket=k % 4)
                     for k in range(tagged - failed + 5)]  # fmt: skip
        add(both, extra)

    q = TaskQuery(tag="t", statuses=frozenset({F}), newest_first=newest_first)
    found, sources = run(redis_store, q, page=1, budget=2, between=grow)
    assert found == ids(memory.query(q))
    assert sorted(found) == [f"m{i:02d}" for i in range(12)]
    assert len(sources) > FLIPS + 1, sources
    assert sources[: FLIPS + 1] == ["tag", "ix"] * (FLIPS // 2) + ["tag"], sources
    redis_store.drop_namespace()
    redis_store.close()
