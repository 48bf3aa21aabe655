"""The dashboard's pages through HTTP, on the in-memory store and on a real Redis: what the
overview counts is what the store counts; every filter of the list shows exactly what
``query`` finds, in its order; keyset paging walks every task once in both directions; a task
page shows its history and escapes whatever a task carries; bad input is a 400 page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from html import escape, unescape
from urllib.parse import quote, urlencode

import pytest
from starlette.testclient import TestClient

from chongming_redis.dashboard import create_app
from chongming_redis.model import TaskQuery, TaskStatus, Transition
from chongming_redis.stores.protocol import TaskStore
from tests.support.dashboard import AWKWARD_IDS, BASE, fill, link, row_ids, snapshot

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def store(memory_or_redis_store: TaskStore) -> TaskStore:
    return memory_or_redis_store


@pytest.fixture
def web(store: TaskStore) -> Iterator[TestClient]:
    with TestClient(create_app(store, namespace="pages")) as client:
        yield client


def shown_counts(html: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r'<b data-status="([a-z]+)">(\d+)</b>', html)}


# -- overview ------------------------------------------------------------------------------------


def test_the_overview_of_an_empty_store_says_so_and_counts_zero(web: TestClient) -> None:
    page = web.get("/")
    assert page.status_code == 200
    assert shown_counts(page.text) == {**{s.value: 0 for s in TaskStatus}, "total": 0}
    assert "No live worker" in page.text and "No task yet" in page.text
    assert 'data-events="/events/overview"' in page.text


def test_the_overview_names_a_task_type_whose_due_tasks_wait_with_nobody_to_run_them(
    web: TestClient, store: TaskStore
) -> None:
    from datetime import datetime, timedelta, timezone

    from chongming_redis.model import TaskSnapshot

    long_ago = datetime.now(timezone.utc) - timedelta(minutes=5)
    store.create(TaskSnapshot("old", "mail.send", TaskStatus.PENDING, 1, long_ago, long_ago))
    page = web.get("/").text
    assert "of type <b>mail.send</b> have been due for up to 30" in page
    store.create(TaskSnapshot("new", "fresh", TaskStatus.PENDING, 1, datetime.now(timezone.utc),
                              datetime.now(timezone.utc)))  # fmt: skip
    assert "<b>fresh</b>" not in web.get("/").text


def test_the_overview_counts_what_the_store_counts_and_follows_it(
    web: TestClient, store: TaskStore
) -> None:
    fill(store)
    counts = store.counts()
    expected = {s.value: n for s, n in counts.items()} | {"total": sum(counts.values())}
    assert shown_counts(web.get("/").text) == expected
    # A change is seen on the next read (the shared overview lives one second at most).
    task = store.get("task-000")
    assert task is not None and task.status is TaskStatus.PENDING
    store.save(task.evolve(status=TaskStatus.RUNNING, status_version=2), expect_version=1)
    import time

    time.sleep(1.1)
    again = shown_counts(web.get("/").text)
    assert again["pending"] == expected["pending"] - 1
    assert again["running"] == expected["running"] + 1
    assert again["total"] == expected["total"]


# -- the list ------------------------------------------------------------------------------------

FILTERS = [
    ({}, TaskQuery()),
    ({"status": ["running"]}, TaskQuery(statuses=frozenset({TaskStatus.RUNNING}))),
    ({"status": ["failed", "lost"]},
     TaskQuery(statuses=frozenset({TaskStatus.FAILED, TaskStatus.LOST}))),
    ({"name": ["mail"]}, TaskQuery(name="mail")),  # exact: not mail.send
    ({"prefix": ["mail"]}, TaskQuery(name_prefix="mail")),
    ({"tag": ["io"]}, TaskQuery(tag="io")),  # exact: not ios
    ({"bucket": ["1,3"]}, TaskQuery(buckets=frozenset({1, 3}))),
    ({"bucket": ["2"], "status": ["pending"]},
     TaskQuery(buckets=frozenset({2}), statuses=frozenset({TaskStatus.PENDING}))),
    ({"pipeline": ["run-1"]}, TaskQuery(pipeline_run_id="run-1")),
    ({"tag": ["<tag>"]}, TaskQuery(tag="<tag>")),
    ({"name": ["nothing-like-it"]}, TaskQuery(name="nothing-like-it")),
]  # fmt: skip


@pytest.mark.parametrize("order", ["oldest", "newest"])
@pytest.mark.parametrize(("params", "query"), FILTERS)
def test_each_filter_shows_exactly_what_query_finds_in_its_order(
    web: TestClient, store: TaskStore, params: dict[str, list[str]], query: TaskQuery, order: str
) -> None:
    fill(store)
    pairs = [(k, v) for k, values in params.items() for v in values]
    page = web.get("/tasks?" + urlencode([*pairs, ("order", order), ("limit", "500")]))
    assert page.status_code == 200
    expected = store.query(TaskQuery(**{**query.__dict__, "newest_first": order == "newest"}))
    assert row_ids(page.text) == [t.task_id for t in expected]
    if not expected:
        assert "No task matches these filters" in page.text


def walk(web: TestClient, url: str, direction: str) -> list[list[str]]:
    pages: list[list[str]] = []
    next_url: str | None = url
    while next_url is not None:
        page = web.get(next_url)
        assert page.status_code == 200
        pages.append(row_ids(page.text))
        next_url = link(page.text, direction)
        assert len(pages) < 100, "paging does not end"
    return pages


@pytest.mark.parametrize("order", ["oldest", "newest"])
@pytest.mark.parametrize("size", [1, 7, 17, 68])
def test_paging_walks_every_task_once_forwards_and_backwards(
    web: TestClient, store: TaskStore, order: str, size: int
) -> None:
    tasks = fill(store)
    expected = [t.task_id for t in store.query(TaskQuery(newest_first=order == "newest"))]
    assert len(expected) == len(tasks) == 68
    forwards = walk(web, f"/tasks?order={order}&limit={size}", "next-page")
    assert [i for page in forwards for i in page] == expected
    assert all(len(page) == size for page in forwards[:-1]) and 0 < len(forwards[-1]) <= size
    # From the last page back to the first through "previous": the same pages, reversed.
    last = web.get(f"/tasks?order={order}&limit={size}")
    url = link(last.text, "next-page")
    while url is not None:
        last_url, url = url, link(web.get(url).text, "next-page")
    if len(forwards) > 1:
        backwards = walk(web, last_url, "prev-page")
        assert backwards == list(reversed(forwards))


def test_paging_with_a_filter_and_the_first_page_link(web: TestClient, store: TaskStore) -> None:
    fill(store)
    # No order given: newest first (the default).
    expected = [t.task_id for t in store.query(TaskQuery(name_prefix="mail", newest_first=True))]
    pages = walk(web, "/tasks?prefix=mail&limit=5", "next-page")
    assert [i for page in pages for i in page] == expected
    second = web.get(link(web.get("/tasks?prefix=mail&limit=5").text, "next-page") or "")
    first = link(second.text, "first-page")
    assert first is not None and "after" not in first and "prefix=mail" in first


def test_a_page_after_a_pruned_task_still_follows_on(web: TestClient, store: TaskStore) -> None:
    fill(store)
    mark = f"{int((BASE.timestamp()) * 1_000_000)}.task-000"  # the first task's mark
    page = web.get("/tasks?order=oldest&limit=500&after=" + quote(mark, safe=""))
    expected = [t.task_id for t in store.query()][1:]
    assert row_ids(page.text) == expected


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("/tasks?status=bogus", "status must be one of"),
        ("/tasks?limit=0", "limit must be"),
        ("/tasks?limit=501", "limit must be"),
        ("/tasks?limit=x", "limit must be"),
        ("/tasks?bucket=-1", "bucket must be"),
        ("/tasks?order=sideways", "order must be"),
        ("/tasks?after=1.a&before=1.b", "not both"),
        ("/tasks?after=nonsense", "after must be"),
        ("/tasks?before=99999999999999999999.x", "before"),
        ("/tasks?name=a&name=b", "given 2 times"),
        ("/tasks?colour=red", "unknown parameter"),
        ("/tasks?after=1." + "x" * 2000, "at most 1024"),  # an id no task can have
        ("/tasks?before=1.", "before must be"),
    ],
)
def test_a_bad_list_url_is_a_400_page_that_says_why(web: TestClient, url: str, says: str) -> None:
    page = web.get(url)
    assert page.status_code == 400
    message = re.search(r'id="error-message">([^<]*)<', page.text)
    assert message is not None and says in unescape(message.group(1))


# -- a task --------------------------------------------------------------------------------------


def test_a_task_page_shows_its_state_history_params_and_failure(
    web: TestClient, store: TaskStore
) -> None:
    fill(store)
    store.append(Transition("task-000", 1, None, TaskStatus.PENDING, BASE, "submitted by me"))
    store.append(Transition("task-000", 2, TaskStatus.PENDING, TaskStatus.RUNNING, BASE))
    page = web.get("/tasks/task-000")
    assert page.status_code == 200
    text = unescape(page.text)
    assert 'data-status="pending"' in text and 'data-version="1"' in text
    assert "submitted by me" in text and text.count("<li>") >= 2
    assert '"i": 0' in text  # params, as JSON
    assert "bad <input>" in text and "Traceback ..." in text  # the failure, escaped in HTML
    assert "bad <input>" not in page.text
    assert 'id="progress-bar"' in page.text and 'aria-valuenow="0.0"' in page.text
    assert "No command was sent" in text or "cannot list" in text
    assert "btn-stop" not in page.text  # read-only by default


def test_a_task_page_shows_a_lease_only_while_held_and_names_the_time_zone(
    web: TestClient, store: TaskStore
) -> None:
    """Before, a finished task showed "held by w1 until ..." (a lease long over) and every time
    was printed without its zone (issue 30, item 5)."""
    until = BASE + timedelta(seconds=30)
    for task_id, status in (("held", TaskStatus.RUNNING), ("over", TaskStatus.SUCCEEDED)):
        store.create(snapshot(task_id, 0, status=status, lease_owner="w1", lease_until=until))
    held = unescape(web.get("/tasks/held").text)
    assert "<dt>held by</dt>" in held
    assert f"w1 until {until:%Y-%m-%d %H:%M:%S}.000 UTC" in held
    over = unescape(web.get("/tasks/over").text)
    assert "<dt>held by</dt>" not in over and " until " not in over
    assert '<dt>last run by</dt><dd id="task-holder">w1</dd>' in over
    assert f"{BASE:%Y-%m-%d %H:%M:%S}.000 UTC" in over  # created, with its zone


@pytest.mark.parametrize("task_id", AWKWARD_IDS)
def test_any_task_id_has_a_page_and_its_markup_is_escaped(
    web: TestClient, store: TaskStore, task_id: str
) -> None:
    fill(store)
    page = web.get("/tasks/" + quote(task_id, safe=""))
    assert page.status_code == 200
    assert "<b>bold</b>" not in page.text and "<tag>" not in page.text
    listed = web.get("/tasks?name=odd&limit=500")
    assert task_id in row_ids(listed.text)


def test_an_unknown_task_is_a_404_page(web: TestClient, store: TaskStore) -> None:
    page = web.get("/tasks/no-such-task")
    assert page.status_code == 404 and "does not exist" in page.text


def test_static_files_ship_with_the_package(web: TestClient) -> None:
    js = web.get("/static/dashboard.js")
    assert js.status_code == 200 and "EventSource" in js.text
    assert web.get("/static/dashboard.css").status_code == 200
    assert "http" not in js.text.replace("https://", "")  # nothing fetched from elsewhere


@pytest.mark.parametrize("task_id", [".", "..", "line\nbreak", "trailing/", "?q=1#frag"])
def test_ids_a_path_mangles_have_a_working_link(
    web: TestClient, store: TaskStore, task_id: str
) -> None:
    from tests.support.dashboard import snapshot

    store.create(snapshot(task_id, 1, name="odd"))
    listed = web.get("/tasks?name=odd")
    links = re.findall(r'<td class="id"><a href="([^"]+)">', listed.text)
    assert len(links) == 1
    page = web.get(unescape(links[0]))
    assert page.status_code == 200 and 'data-status="pending"' in page.text
    assert f'<span class="id">{escape(task_id)}</span>' in page.text


def test_unknown_paths_are_a_404_page(web: TestClient) -> None:
    page = web.get("/nothing/here")
    assert page.status_code == 404 and "Nothing at /nothing/here" in page.text


def test_a_task_page_shows_its_policies_its_retries_and_a_timeout(
    web: TestClient, store: TaskStore
) -> None:
    from chongming_redis.model import Failure, TaskSnapshot
    from chongming_redis.policy import RetryPolicy

    policy = RetryPolicy(max_attempts=4, retry_on=(KeyError,))
    store.create(TaskSnapshot("timed", "job", TaskStatus.FAILED, 1, BASE, BASE, attempt=3,
                              retry=policy, timeout=30.0, retention=120.0, unique="inv-7",
                              failure=Failure("TaskTimeout", "ran past its timeout")))  # fmt: skip
    store.create(TaskSnapshot("plain", "job", TaskStatus.PENDING, 1, BASE, BASE))
    timed = unescape(web.get("/tasks/timed").text)
    assert "4 attempts" in timed and "retry on KeyError" in timed and "retried 2 times" in timed
    assert "30.0s per attempt" in timed and "timed out" in timed
    assert "120.0s after it finished" in timed and "inv-7" in timed
    plain = unescape(web.get("/tasks/plain").text)
    assert "the worker's default" in plain and "retried" not in plain and "timed out" not in plain


def test_the_bucket_tables_counts_line_up_under_their_headings(
    web: TestClient, store: TaskStore
) -> None:
    """Each count column's heading is aligned as its cells are (right, class ``n``): before,
    the headings sat left over right-aligned numbers."""
    fill(store)
    table = web.get("/").text.split('<table class="buckets">', 1)[1].split("</table>", 1)[0]
    head, body = table.split("</thead>", 1)
    headings = re.findall(r"<th( class=\"n\")?>([^<]+)</th>", head)
    counted = [name for cls, name in headings if cls]
    assert counted == [s.value for s in TaskStatus]
    first_row = body.split("</tr>", 1)[0]
    assert first_row.count('<td class="n">') == len(counted)


def test_the_list_shows_the_newest_tasks_first_unless_asked_otherwise(
    web: TestClient, store: TaskStore
) -> None:
    """Before, a plain /tasks listed the oldest first: a newcomer looking for what just ran
    had to find the order menu (issue 30, item 5)."""
    fill(store)
    newest = [t.task_id for t in store.query(TaskQuery(newest_first=True, limit=5))]
    oldest = [t.task_id for t in store.query(TaskQuery(limit=5))]
    plain = web.get("/tasks?limit=5").text
    assert row_ids(plain) == newest
    assert '<option value="newest" selected>' in plain
    asked = web.get("/tasks?limit=5&order=oldest").text
    assert row_ids(asked) == oldest
    assert "order=oldest" in (link(asked, "next-page") or "")  # paging keeps the order asked
    assert "order=" not in (link(plain, "next-page") or "")  # the default needs no parameter
