"""The dashboard and limits: the overview lists each limit with its held and waiting tasks and
busiest keys; the page of a ``PENDING`` task with refs says which of its limits is full (and
the page of a running one says nothing of it); ``/metrics`` has ``chongming_limit_held`` and
``chongming_limit_waiting`` per limit id, equal to what the store reports. On
``InMemoryTaskStore`` (the limits' reference), the store's own start step making the state.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from chongming_redis import InMemoryTaskStore, TaskStatus
from chongming_redis.dashboard import create_app
from chongming_redis.dashboard.reads import read_overview
from tests.support.limits_app import fill


@pytest.fixture
def store() -> Iterator[InMemoryTaskStore]:
    s = InMemoryTaskStore()
    yield s
    s.close()


@pytest.fixture
def web(store: InMemoryTaskStore) -> Iterator[TestClient]:
    with TestClient(create_app(store, namespace="lim")) as client:
        yield client


def text_of(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def limits_rows(html: str) -> dict[str, str]:
    """The overview's limits table: limit id -> its row's text."""
    rows = re.findall(r'<tr data-limit="([^"]+)">(.*?)</tr>', html, re.S)
    return {limit_id: text_of(row) for limit_id, row in rows}


def test_the_overview_lists_the_limits_with_held_waiting_and_busiest_keys(
    web: TestClient, store: InMemoryTaskStore
) -> None:
    fill(store)
    rows = limits_rows(web.get("/").text)
    assert set(rows) == {"export.concurrency", "payments"}
    assert rows["export.concurrency"] == (
        "export.concurrency concurrency 2 per customer 3 1 "
        "acme 2 held / 1 waiting; zeta 1 held / 0 waiting"
    )
    assert rows["payments"].startswith("payments rate 100/1s burst 100 ")


def test_the_overview_of_a_store_without_recorded_limits_says_so(web: TestClient) -> None:
    assert "No limits recorded" in web.get("/").text


def test_a_pending_task_page_says_which_limit_is_full(
    web: TestClient, store: InMemoryTaskStore
) -> None:
    ids = fill(store)
    waiting = next(i for i in ids["acme"] if store.get(i).status is TaskStatus.PENDING)  # type: ignore[union-attr]
    page = web.get(f"/tasks/{waiting}").text
    full = re.search(r'<p class="notice" id="task-limit-full">(.*?)</p>', page, re.S)
    assert full is not None, page
    assert text_of(full.group(1)) == (
        "Waiting for a slot: export.concurrency=acme is full (2 of 2 running)."
    )
    refs = dict(re.findall(r'<li data-ref="([^"]+)" data-full="(yes|no)">', page))
    assert refs == {"export.concurrency=acme": "yes", "payments": "no"}
    assert "1 waiting" in text_of(page)
    running = next(i for i in ids["acme"] if i != waiting)
    assert "task-limit-full" not in web.get(f"/tasks/{running}").text
    assert 'id="task-limits"' in web.get(f"/tasks/{running}").text  # the part, empty


def test_a_pending_task_whose_ref_has_room_is_not_called_full(
    web: TestClient, store: InMemoryTaskStore
) -> None:
    fill(store)
    from chongming_redis.client.client import Client
    from tests.support.limits_app import app

    fresh = Client(store, app=app).submit("export", {"customer": "new"}).task_id
    page = web.get(f"/tasks/{fresh}").text
    assert "task-limit-full" not in page
    assert "export.concurrency=new: 0 of 2 running (has room), 0 waiting" in text_of(page)


def metric_values(web: TestClient) -> dict[tuple[str, str], float]:
    values = {}
    for family in text_string_to_metric_families(web.get("/metrics").text):
        for sample in family.samples:
            if sample.name.startswith("chongming_limit_"):
                assert sample.labels["namespace"] == "lim"
                values[(sample.name, sample.labels["limit"])] = sample.value
    return values


def test_the_gauges_of_held_and_waiting_per_limit_equal_the_store(
    web: TestClient, store: InMemoryTaskStore
) -> None:
    assert metric_values(web) == {}  # no limit recorded: no series
    fill(store)
    values = metric_values(web)
    assert values[("chongming_limit_held", "export.concurrency")] == 3
    assert values[("chongming_limit_waiting", "export.concurrency")] == 1
    rows = {row.limit_id: row for row in read_overview(store).limits or ()}
    for limit_id, row in rows.items():
        assert values[("chongming_limit_held", limit_id)] == row.held
        assert values[("chongming_limit_waiting", limit_id)] == row.waiting
    assert {limit_id for _, limit_id in values} == {"export.concurrency", "payments"}


class NoLimitsStore(InMemoryTaskStore):
    """The in-memory store, its change feed kept, without ``LimitsStore`` (a ``None`` member
    is no member for a runtime protocol check)."""

    limit_usage = None  # type: ignore[assignment]


def test_a_store_without_limits_says_so_and_has_no_limit_gauges() -> None:
    with TestClient(create_app(NoLimitsStore(), namespace="lim")) as client:
        assert "This store does not record limits" in client.get("/").text
        assert "chongming_limit_" not in client.get("/metrics").text


def test_a_waiting_tasks_live_page_follows_its_limit(store: InMemoryTaskStore) -> None:
    """The task page's stream re-reads a PENDING task's limits: a holder that ends shows the
    ref with room again, with no change to the waiting task itself."""
    from datetime import datetime, timezone

    from tests.support.dashboard import served
    from tests.test_dashboard_live import patches_until

    ids = fill(store)
    waiting = next(i for i in ids["acme"] if store.get(i).status is TaskStatus.PENDING)  # type: ignore[union-attr]
    holder = store.get(next(i for i in ids["acme"] if i != waiting))
    assert holder is not None

    def finish_holder() -> None:
        done = holder.evolve(status=TaskStatus.SUCCEEDED, status_version=holder.status_version + 1,
                             updated_at=datetime.now(timezone.utc))  # fmt: skip
        store.save(done, expect_version=holder.status_version)

    with served(create_app(store, namespace="lim", feed_interval=0.05)) as base:
        patches = patches_until(
            f"{base}/events/task?id={waiting}",
            lambda p: "1 of 2 running (has room)" in p.get("task-limits", ""),
            act=finish_holder,
        )
    assert "is full (2 of 2 running)" in text_of(patches[0]["task-limits"])
