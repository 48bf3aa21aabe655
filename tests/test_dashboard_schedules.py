"""The dashboard and schedules: ``/schedules`` lists every schedule with its definition, pause,
next tick, counts and recent outcomes (their tasks linking to the task page), linked from the
navigation; ``/api/v1/schedules`` has the same as JSON; ``/metrics`` has
``chongming_schedule_ticks_total`` per schedule and outcome, equal to the stored counts, and
``chongming_schedule_paused``. A store without schedules says so instead of failing. On the
in-memory store and a real Redis (``memory_or_redis_store``), through starlette's test client.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from chongming_redis import InMemoryTaskStore
from chongming_redis.client.client import Client
from chongming_redis.dashboard import create_app
from chongming_redis.schedules import Overlap, Schedule

TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z"
SHOWN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC"


class NoSchedules(InMemoryTaskStore):
    """A store with a change feed and no ``SchedulesStore``."""

    write_schedule = schedule_record = schedule_records = delete_schedule = None  # type: ignore[assignment]


@pytest.fixture
def store(memory_or_redis_store: Any) -> Any:
    return memory_or_redis_store


@pytest.fixture
def web(store: Any) -> Iterator[TestClient]:
    with TestClient(create_app(store, namespace="sched")) as client:
        yield client


def text_of(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def schedule_rows(html: str) -> dict[str, str]:
    """The summary table: schedule id -> its row's text."""
    rows = re.findall(r'<tr data-schedule="([^"]+)">(.*?)</tr>', html, re.S)
    return {unescape(sid): text_of(row) for sid, row in rows}


def sections(html: str) -> dict[str, str]:
    found = re.findall(r'<section class="schedule" id="[^"]+" data-schedule="([^"]+)">(.*?)'
                       r"</section>", html, re.S)  # fmt: skip
    return {unescape(sid): body for sid, body in found}


def fill(store: Any) -> dict[str, list[str]]:
    """Two schedules: ``a/b <x>`` (every 60 s, triggered twice) and ``nightly`` (cron, paused,
    no outcome); the triggered task ids."""
    client = Client(store, name="dash-test")
    client.schedules.upsert(Schedule("a/b <x>", "echo", {"n": 1}, every=60,
                                     overlap=Overlap.ALLOW))  # fmt: skip
    client.schedules.upsert(Schedule("nightly", "report", cron="0 3 * * *", tz="Europe/Berlin"))
    client.schedules.pause("nightly")
    ids = [client.schedules.trigger("a/b <x>").task_id for _ in range(2)]
    return {"a/b <x>": ids}


def test_the_navigation_links_to_the_schedules_page(web: TestClient) -> None:
    for path in ("/", "/tasks", "/schedules"):
        assert '<a href="/schedules">Schedules</a>' in web.get(path).text


def test_a_namespace_without_schedules_says_so(web: TestClient) -> None:
    page = web.get("/schedules")
    assert page.status_code == 200
    note = re.search(r'<p class="muted" id="no-schedules">(.*?)</p>', page.text, re.S)
    assert note is not None and text_of(note.group(1)).startswith("No schedules in namespace sched")
    assert web.get("/api/v1/schedules").json()["schedules"] == []


def test_the_page_lists_each_schedule_with_its_state_and_recent_outcomes(
    web: TestClient, store: Any
) -> None:
    ids = fill(store)["a/b <x>"]
    page = web.get("/schedules")
    assert page.status_code == 200
    rows = schedule_rows(page.text)
    assert list(rows) == ["a/b <x>", "nightly"]
    assert re.fullmatch(rf"a/b <x> echo every 60 s allow no {SHOWN} 0 0 0 2 {re.escape(ids[1])}",
                        rows["a/b <x>"]), rows["a/b <x>"]  # fmt: skip
    assert rows["nightly"] == "nightly report cron 0 3 * * * (Europe/Berlin) skip yes – 0 0 0 0 –"
    parts = sections(page.text)
    assert set(parts) == {"a/b <x>", "nightly"}
    body = parts["a/b <x>"]
    assert '"n": 1' in text_of(body) and "every 60 s" in text_of(body)
    outcomes = re.findall(r'<tr data-outcome="([^"]+)">(.*?)</tr>', body, re.S)
    assert [o for o, _ in outcomes] == ["triggered", "triggered"]
    links = [re.search(r'<a href="([^"]+)">([^<]+)</a>', row) for _, row in outcomes]
    assert [unescape(m.group(2)) for m in links if m] == ids  # newest last
    for m in links:
        assert m is not None
        task_page = web.get(unescape(m.group(1)))
        assert task_page.status_code == 200 and unescape(m.group(2)) in unescape(task_page.text)
    assert "No outcomes yet." in parts["nightly"]
    assert "(paused)" in text_of(parts["nightly"])


def test_the_api_has_every_schedule(web: TestClient, store: Any) -> None:
    ids = fill(store)["a/b <x>"]
    doc = web.get("/api/v1/schedules").json()
    assert set(doc) == {"namespace", "read_at", "schedules"} and doc["namespace"] == "sched"
    assert re.fullmatch(TIME, doc["read_at"])
    first, second = doc["schedules"]
    assert set(first) == {"id", "version", "definition", "paused", "next_tick", "updated_at",
                          "last_task", "buffered", "counts", "recent"}  # fmt: skip
    assert first["definition"] == {"id": "a/b <x>", "task": "echo", "params": {"n": 1},
                                   "cron": None, "every": 60, "tz": "UTC",
                                   "overlap": "allow"}  # fmt: skip
    assert first["counts"] == {"fired": 0, "skipped": 0, "missed": 0, "triggered": 2}
    assert [r["task_id"] for r in first["recent"]] == ids and first["last_task"] == ids[1]
    assert (second["id"], second["paused"], second["recent"]) == ("nightly", True, [])
    assert second["definition"]["cron"] == "0 3 * * *"


def metric_samples(web: TestClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = web.get("/metrics")
    assert response.status_code == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_metrics_export_the_stored_counts_per_schedule_and_outcome(
    web: TestClient, store: Any
) -> None:
    fill(store)
    found = metric_samples(web)
    ticks = {(dict(labels)["schedule"], dict(labels)["outcome"]): v
             for (name, labels), v in found.items()
             if name == "chongming_schedule_ticks_total"}  # fmt: skip
    assert ticks == {
        ("a/b <x>", "fired"): 0, ("a/b <x>", "skipped"): 0, ("a/b <x>", "missed"): 0,
        ("a/b <x>", "triggered"): 2,
        ("nightly", "fired"): 0, ("nightly", "skipped"): 0, ("nightly", "missed"): 0,
        ("nightly", "triggered"): 0,
    }  # fmt: skip
    labels = {("namespace", "sched"), ("schedule", "a/b <x>"), ("outcome", "triggered")}
    assert ("chongming_schedule_ticks_total", frozenset(labels)) in found
    paused = {dict(labels)["schedule"]: v for (name, labels), v in found.items()
              if name == "chongming_schedule_paused"}  # fmt: skip
    assert paused == {"a/b <x>": 0, "nightly": 1}
    Client(store, name="dash-test").schedules.trigger("nightly")  # read at scrape time
    again = metric_samples(web)
    key = frozenset({("namespace", "sched"), ("schedule", "nightly"), ("outcome", "triggered")})
    assert again[("chongming_schedule_ticks_total", key)] == 1


def test_a_store_without_schedules_says_so_everywhere() -> None:
    store = NoSchedules()
    with TestClient(create_app(store, namespace="bare")) as web:
        page = web.get("/schedules")
        assert page.status_code == 200
        assert '<p class="muted" id="no-schedules">This store keeps no schedules.</p>' in page.text
        api = web.get("/api/v1/schedules")
        assert api.status_code == 501
        assert api.json() == {"error": "no_schedules", "message": "this store keeps no schedules"}
        metrics = web.get("/metrics")
        assert metrics.status_code == 200 and "chongming_tasks" in metrics.text
        assert "chongming_schedule" not in metrics.text
