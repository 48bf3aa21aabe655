"""The dashboard's JSON and metrics: ``/api/v1/tasks`` pages are the feed's pages (valid against
the feed's JSON Schema, walked to the end they hold every task once), a malformed or future
cursor is a 400 with a JSON error and never an empty page; ``/metrics`` parses with the
Prometheus text parser and every value equals what the store says."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from chongming_redis.dashboard import create_app
from chongming_redis.model import Command, CommandKind, TaskStatus
from chongming_redis.stores.memory import InMemoryTaskStore
from chongming_redis.stores.protocol import ChangeFeed, TaskStore
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.dashboard import fill
from tests.support.redis_server import RedisProc

pytestmark = pytest.mark.timeout(120)
SCHEMA = json.loads((Path(__file__).parent.parent / "docs" / "feed-page.schema.json").read_text())


@pytest.fixture
def store(memory_or_redis_store: TaskStore) -> TaskStore:
    return memory_or_redis_store


@pytest.fixture
def web(store: TaskStore) -> Iterator[TestClient]:
    with TestClient(create_app(store, namespace="api")) as client:
        yield client


# -- the feed ------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 9, 256])
def test_feed_pages_walked_to_the_end_hold_every_task_once_and_match_the_store(
    web: TestClient, store: TaskStore, limit: int
) -> None:
    assert isinstance(store, ChangeFeed)
    fill(store)
    store.prune(keep_terminal=0)  # tombstones too
    cursor, seen = "0", []
    while True:
        page = web.get(f"/api/v1/tasks?after={cursor}&limit={limit}")
        assert page.status_code == 200 and page.headers["content-type"] == "application/json"
        body = page.json()
        jsonschema.validate(body, SCHEMA)
        direct = store.changes(after=cursor, limit=limit)
        assert [t["task_id"] for t in body["tasks"]] == [t.task_id for t in direct.tasks]
        assert body["next_cursor"] == direct.next_cursor
        if not body["tasks"]:
            assert body["next_cursor"] == cursor  # caught up: the cursor it was given
            break
        assert len(body["tasks"]) <= limit
        seen += [t["task_id"] for t in body["tasks"]]
        cursor = body["next_cursor"]
    assert len(seen) == len(set(seen)) == 68
    assert sum(1 for _ in seen) == store.feed_stats().items


def test_the_feed_defaults_to_the_start_and_a_full_page(web: TestClient, store: TaskStore) -> None:
    fill(store)
    body = web.get("/api/v1/tasks").json()
    assert len(body["tasks"]) == 68 and body["next_cursor"] != "0"


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("after=abc", "invalid_cursor"),
        ("after=-1", "invalid_cursor"),
        ("after=01", "invalid_cursor"),
        ("after=1.5", "invalid_cursor"),
        ("after=", "invalid_cursor"),
        ("after=%20%201", "invalid_cursor"),
        ("after=999999", "invalid_cursor"),  # ahead of the head: a restore, never an empty page
        ("limit=0", "bad_limit"),
        ("limit=257", "bad_limit"),
        ("limit=ten", "bad_limit"),
        ("limit=-5", "bad_limit"),
        ("cursor=5", "bad_request"),
        ("after=zz&after=0", "bad_request"),  # never the last value of a repeated one
        ("limit=999&limit=2", "bad_request"),
    ],
)
def test_a_bad_feed_request_is_a_400_with_a_json_error(
    web: TestClient, store: TaskStore, query: str, error: str
) -> None:
    fill(store)
    page = web.get(f"/api/v1/tasks?{query}")
    assert page.status_code == 400
    body = page.json()
    assert body["error"] == error and body["message"]
    assert "tasks" not in body


def test_one_task_in_full_with_params_result_and_traceback(
    web: TestClient, store: TaskStore
) -> None:
    fill(store)
    body = web.get("/api/v1/tasks/task-000").json()
    assert body["task_id"] == "task-000" and body["params"] == {"i": 0}
    assert body["failure"]["traceback"] == "Traceback ..." and "result" in body
    slash = web.get("/api/v1/tasks/a%2Fb")
    assert slash.status_code == 200 and slash.json()["task_id"] == "a/b"
    missing = web.get("/api/v1/tasks/nope")
    assert missing.status_code == 404 and missing.json()["error"] == "no_such_task"


def test_the_overview_json_counts_what_the_store_counts(web: TestClient, store: TaskStore) -> None:
    fill(store)
    body = web.get("/api/v1/overview").json()
    assert body["counts"] == {s.value: n for s, n in store.counts().items()}
    assert body["feed"]["head"] == store.feed_stats().head  # type: ignore[attr-defined]


# -- metrics -------------------------------------------------------------------------------------


def scrape(web: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    page = web.get("/metrics")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    values = {}
    for family in text_string_to_metric_families(page.text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def value(values: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return values[(name, tuple(sorted({"namespace": "api", **labels}.items())))]  # type: ignore[no-any-return]


def test_metrics_parse_and_equal_the_store(web: TestClient, store: TaskStore) -> None:
    assert isinstance(store, ChangeFeed)
    fill(store)
    store.prune(keep_terminal=3)
    values = scrape(web)
    for status, n in store.counts().items():
        assert value(values, "chongming_tasks", status=status.value) == n
    per_bucket = store.bucket_counts()  # type: ignore[attr-defined]
    for bucket, counts in per_bucket.items():
        for status, n in counts.items():
            assert value(values, "chongming_bucket_tasks", bucket=str(bucket),
                         status=status.value) == n  # fmt: skip
    stats = store.feed_stats()
    assert value(values, "chongming_feed_head") == stats.head
    assert value(values, "chongming_feed_items") == stats.items
    assert value(values, "chongming_feed_tombstones") == stats.tombstones > 0
    assert value(values, "chongming_workers_live") == 0


def test_command_metrics_follow_the_backlog(web: TestClient, store: TaskStore) -> None:
    fill(store)
    now = datetime.now(timezone.utc)
    values = scrape(web)
    assert value(values, "chongming_commands_unclaimed") == 0
    assert value(values, "chongming_command_oldest_unclaimed_age_seconds") == 0
    old = now - timedelta(seconds=120)
    store.submit_command(Command("c1", "task-001", CommandKind.STOP, old))
    store.submit_command(Command("c2", "task-002", CommandKind.PAUSE, now))
    store.submit_command(Command("c3", "task-003", CommandKind.PAUSE, now))
    store.claim_commands(now=now, lease_seconds=60, limit=1)  # takes c1, the oldest
    values = scrape(web)
    assert value(values, "chongming_commands_unclaimed") == 2
    assert value(values, "chongming_commands_leased") == 1
    age = value(values, "chongming_command_oldest_unclaimed_age_seconds")
    assert 0 <= age < 60  # c2's age: c1 (120 s old) is claimed
    store.complete_command("c2", now=now)
    store.complete_command("c3", now=now)
    values = scrape(web)
    assert value(values, "chongming_commands_unclaimed") == 0


@pytest.mark.redis
def test_live_workers_and_bucket_owners_in_metrics(redis_proc: RedisProc, namespace: str) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    now = store.server_time()
    store.pool_tick(worker="w1", now=now, lease_seconds=30, num_buckets=4, wanted=[0, 1])
    store.pool_tick(worker="w2", now=now, lease_seconds=30, num_buckets=4, wanted=[2])
    fill(store, 10)
    with TestClient(create_app(store, namespace="api")) as web:
        values = scrape(web)
        assert value(values, "chongming_workers_live") == 2
        for bucket, owned in ((0, 1), (1, 1), (2, 1), (3, 0)):
            assert value(values, "chongming_bucket_owned", bucket=str(bucket)) == owned
        store.pool_tick(worker="w2", now=now, lease_seconds=30, num_buckets=4, wanted=[],
                        leaving=True)  # fmt: skip
        values = scrape(web)
        assert value(values, "chongming_workers_live") == 1
        assert value(values, "chongming_bucket_owned", bucket="2") == 0
        body = web.get("/api/v1/overview").json()
        assert [w["worker"] for w in body["workers"]] == ["w1"]
        assert body["workers"][0]["buckets"] == [0, 1]
    store.close()


def test_a_store_without_a_feed_is_refused() -> None:
    class NoFeed(InMemoryTaskStore):
        changes = None  # type: ignore[assignment]

    with pytest.raises(TypeError, match="change feed"):
        create_app(NoFeed(), namespace="x")  # type: ignore[arg-type]


def test_statuses_listed_in_metrics_are_all_seven(web: TestClient) -> None:
    values = scrape(web)
    shown = {dict(labels)["status"] for (name, labels) in values if name == "chongming_tasks"}
    assert shown == {s.value for s in TaskStatus}


def test_unknown_api_paths_and_odd_ids_answer_in_json(web: TestClient, store: TaskStore) -> None:
    from tests.support.dashboard import snapshot

    store.create(snapshot("line\nbreak", 1))
    newline = web.get("/api/v1/tasks/line%0Abreak")
    assert newline.status_code == 200 and newline.json()["task_id"] == "line\nbreak"
    missing = web.get("/api/v1/nothing-here")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    too_long = web.get("/api/v1/tasks/" + "x" * 2000)
    assert too_long.status_code == 400 and too_long.json()["error"] == "bad_task_id"
