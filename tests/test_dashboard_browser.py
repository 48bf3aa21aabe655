"""The dashboard in a real browser (headless Chromium through selenium), served by the real CLI
(``chongming-redis dashboard``) on a real Redis, with a real worker process of the demo app:
the overview is live and counts what the store counts; the list's filter form narrows the rows
to exactly the matching tasks and its pager walks every task once; a running task's progress
bar advances and its status turns live, without a reload; the control buttons stop, pause and
resume (only for a signed-in user of a dashboard with ``--allow-control``); a bad feed cursor is
a 400, never an empty page.

The run also saves screenshots of the three pages (checked to be whole PNGs); with
``CHONGMING_UPDATE_SCREENSHOTS=1`` (``make screenshots``) they replace ``docs/screenshots/``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from chongming_redis.client.client import Client
from chongming_redis.model import TaskQuery, TaskStatus
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.browser import (
    Dashboard,
    Screenshots,
    fetch,
    js,
    start_chrome,
    start_worker,
    stop_process,
    wait_for,
)
from tests.support.redis_server import RedisProc

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]

TOKEN = "browser-test-token-0123456789"
#: Never due during a test: such a task stays pending, whatever the worker does.
LATER = 3600.0

#: A second task type, of an app the test's worker does not run (submitted delayed, so no
#: worker ever tries): the client gets its type, since it refuses names its workers lack.
ELSEWHERE = App("elsewhere")


@ELSEWHERE.task()
def encode(ctx: TaskContext, params: dict[str, Any]) -> None:
    raise AssertionError("never run")


ENCODE = ELSEWHERE.get("encode")


def submit_encodes(client: Client, n: int, tags: tuple[str, ...] = ()) -> list[str]:
    """``n`` pending ``encode`` tasks, never due."""
    handles = client.submit_many(ENCODE, [{"n": i} for i in range(n)], tags=tags, delay=LATER)
    return [h.task_id for h in handles]


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chrome() -> Iterator[webdriver.Chrome]:
    made = start_chrome()
    yield made
    made.quit()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Screenshots:
    return Screenshots(tmp_path_factory.mktemp("screenshots"))


@pytest.fixture
def driver(chrome: webdriver.Chrome) -> Iterator[webdriver.Chrome]:
    """The session's browser on a blank page, with no cookie (no one signed in)."""
    chrome.get("about:blank")
    chrome.execute_cdp_cmd("Network.clearBrowserCookies", {})
    yield chrome
    chrome.get("about:blank")
    chrome.execute_cdp_cmd("Network.clearBrowserCookies", {})


@pytest.fixture
def store(redis_proc: RedisProc, namespace: str) -> Iterator[RedisTaskStore]:
    made = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    yield made
    made.close()


@pytest.fixture
def client(store: RedisTaskStore) -> Client:
    return Client(store, name="browser-test")


@pytest.fixture
def worker(redis_proc: RedisProc, namespace: str, tmp_path: Path) -> Iterator[None]:
    """A worker process of ``chongming_redis.demo.app:app`` on the test's namespace."""
    process = start_worker(redis_proc.url, namespace, tmp_path / "worker.log")
    yield
    stop_process(process)


@pytest.fixture
def start_dashboard(
    redis_proc: RedisProc, namespace: str, tmp_path: Path, driver: webdriver.Chrome
) -> Iterator[Callable[..., Dashboard]]:
    """Starts ``chongming-redis dashboard`` (``control=True``: with ``--allow-control``)."""
    started: list[Dashboard] = []

    def start(*, control: bool = False) -> Dashboard:
        log = tmp_path / f"dashboard-{len(started)}.log"
        made = Dashboard.start(redis_proc.url, namespace, log, token=TOKEN if control else None)
        started.append(made)
        return made

    yield start
    driver.get("about:blank")  # the page's event stream ends before its server does
    for made in started:
        made.close()


@pytest.fixture
def dashboard(start_dashboard: Callable[..., Dashboard]) -> Dashboard:
    return start_dashboard()


# -- reading the page ----------------------------------------------------------------------------


def open_live(driver: webdriver.Chrome, url: str) -> None:
    """Load ``url``, wait for its event stream, and mark the page: ``reloaded`` tells whether it
    was loaded again since."""
    driver.get(url)
    wait_for(driver, lambda d: d.find_element(By.ID, "live").text == "live", "the live indicator")
    js(driver, "window.__marker = 1;")


def reloaded(driver: webdriver.Chrome) -> bool:
    return js(driver, "return window.__marker !== 1;") is True


def shown_counts(driver: webdriver.Chrome) -> dict[str, int]:
    counts: dict[str, int] = js(driver, """
        const shown = {};
        document.querySelectorAll("#counts b[data-status]").forEach(
            (b) => { shown[b.dataset.status] = Number(b.textContent); });
        return shown;""")  # fmt: skip
    return counts


def store_counts(store: RedisTaskStore) -> dict[str, int]:
    counts = store.counts()
    return {s.value: n for s, n in counts.items()} | {"total": sum(counts.values())}


def shown_rows(driver: webdriver.Chrome) -> list[tuple[str, str]]:
    """``[(task id, status)]`` of the list's rows, in order."""
    rows: list[list[str]] = js(driver, """
        return Array.from(document.querySelectorAll('#task-table tr[id^="row-"]')).map((tr) =>
            [tr.querySelector("td.id").textContent, tr.querySelector("td[data-status]")
             ?.dataset.status ?? "removed"]);""")  # fmt: skip
    return [(task_id, status) for task_id, status in rows]


def shown_ids(driver: webdriver.Chrome) -> list[str]:
    return [task_id for task_id, _ in shown_rows(driver)]


def row_progress(driver: webdriver.Chrome, task_id: str) -> float | None:
    """The progress bar's value in the list's row of ``task_id``."""
    value: str | None = js(driver, """
        for (const tr of document.querySelectorAll('#task-table tr[id^="row-"]')) {
            if (tr.querySelector("td.id").textContent !== arguments[0]) continue;
            const bar = tr.querySelector("[aria-valuenow]");
            return bar === null ? null : bar.getAttribute("aria-valuenow");
        }
        return null;""", task_id)  # fmt: skip
    return None if value is None else float(value)


def task_status(driver: webdriver.Chrome) -> str | None:
    status: str | None = js(driver, """
        const el = document.getElementById("task-status");
        return el === null ? null : el.dataset.status;""")  # fmt: skip
    return status


def progress(driver: webdriver.Chrome) -> float | None:
    value: str | None = js(driver, """
        const bar = document.getElementById("progress-bar");
        return bar === null ? null : bar.getAttribute("aria-valuenow");""")  # fmt: skip
    return None if value is None else float(value)


def wait_status(driver: webdriver.Chrome, status: str) -> None:
    wait_for(driver, lambda d: task_status(d) == status, f"the page to show status {status}")


def wait_stored(store: RedisTaskStore, task_id: str, status: TaskStatus) -> None:
    deadline = time.monotonic() + 30
    while (task := store.get(task_id)) is None or task.status is not status:
        assert time.monotonic() < deadline, f"{task_id} never became {status.value}: {task}"
        time.sleep(0.05)


def text(driver: webdriver.Chrome, element_id: str) -> str:
    """An element's text, read in one step: the live parts are replaced whenever a patch
    comes, so an element found first and read after may be gone."""
    shown: str | None = js(driver, """
        const el = document.getElementById(arguments[0]);
        return el === null ? null : el.innerText;""", element_id)  # fmt: skip
    assert shown is not None, f"no #{element_id}"
    return shown


def buttons(driver: webdriver.Chrome) -> list[str]:
    """The ids of the task page's control buttons."""
    ids: list[str] = js(driver, """return Array.from(
        document.querySelectorAll("#task-control button"), (b) => b.id);""")  # fmt: skip
    return ids


def click(driver: webdriver.Chrome, element_id: str) -> None:
    """Click, again if a patch replaced the element between finding and clicking it."""
    for _ in range(10):
        try:
            driver.find_element(By.ID, element_id).click()
            return
        except StaleElementReferenceException:
            time.sleep(0.1)
    raise AssertionError(f"#{element_id} was replaced ten times in a row")


def click_and_load(driver: webdriver.Chrome, element_id: str) -> None:
    """Click a link or a submit button and wait for the next page's event stream. The old
    page is told by a mark on its window (an element's staleness, asked while the page is
    being replaced, sometimes fails in chromedriver with an inspector error instead)."""
    js(driver, "window.__leaving = true;")
    click(driver, element_id)

    def replaced(d: webdriver.Chrome) -> bool:
        try:
            new = js(d, "return window.__leaving !== true && document.readyState !== 'loading';")
        except WebDriverException:  # between the two documents
            return False
        return new is True

    wait_for(driver, replaced, f"the page after #{element_id}")
    wait_for(driver, lambda d: d.find_element(By.ID, "live").text == "live", "the live indicator")


def apply_filters(driver: webdriver.Chrome, *, statuses: tuple[str, ...] = (),
                  **fields: str) -> None:  # fmt: skip
    """Set the filter form (unticked statuses and fields not given are emptied) and Apply."""
    form = driver.find_element(By.ID, "filters")
    for box in form.find_elements(By.CSS_SELECTOR, "input[name=status]"):
        if box.is_selected() != (box.get_attribute("value") in statuses):
            box.click()
    for name in ("name", "prefix", "tag", "bucket", "pipeline"):
        field = form.find_element(By.NAME, name)
        field.clear()
        if fields.get(name):
            field.send_keys(fields[name])
    Select(form.find_element(By.NAME, "order")).select_by_value(fields.get("order", "oldest"))
    limit = form.find_element(By.NAME, "limit")
    limit.clear()
    limit.send_keys(fields.get("limit", "50"))
    click_and_load(driver, "apply")


def ids_of(store: RedisTaskStore, **filters: Any) -> list[str]:
    return [t.task_id for t in store.query(TaskQuery(**filters))]


# -- the overview --------------------------------------------------------------------------------


def test_the_overview_is_live_and_counts_what_the_store_counts(
    driver: webdriver.Chrome, client: Client, store: RedisTaskStore, worker: None,
    dashboard: Dashboard, screenshots: Screenshots,
) -> None:  # fmt: skip
    done = [client.submit("render", {"frames": 2, "frame_ms": 10}, tags=["quick"])
            for _ in range(6)]  # fmt: skip
    submit_encodes(client, 4)
    for handle in done:
        assert handle.wait(timeout=60) == {"frames": 2, "attempt": 1}
    client.stop(submit_encodes(client, 1)[0])

    open_live(driver, dashboard.url)
    expected = store_counts(store)
    assert expected["succeeded"] == 6 and expected["pending"] == 4 and expected["total"] == 11
    assert shown_counts(driver) == expected
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#workers tbody tr"),
             "the worker in #workers")  # fmt: skip
    assert len(driver.find_elements(By.CSS_SELECTOR, "#workers tbody tr")) == 1
    assert driver.find_elements(By.CSS_SELECTOR, "#buckets tbody tr")

    # Tasks submitted now show in the counts without a reload; a running one too.
    submit_encodes(client, 3)
    running = client.submit("render", {"frames": 60, "frame_ms": 100}, tags=["slow"])
    wait_for(driver, lambda d: shown_counts(d)["running"] == 1, "the running task counted")
    wait_stored(store, running.task_id, TaskStatus.RUNNING)
    wait_for(driver, lambda d: shown_counts(d) == store_counts(store), "the counts to match")
    assert shown_counts(driver)["total"] == 15
    screenshots.take(driver, "overview")
    client.stop(running.task_id)
    wait_for(driver, lambda d: shown_counts(d)["stopped"] == 2, "the stop counted")
    wait_for(driver, lambda d: shown_counts(d) == store_counts(store), "the counts to match")
    assert not reloaded(driver)


def test_pages_left_behind_free_their_stream_and_listen_again_when_back(
    driver: webdriver.Chrome, client: Client, store: RedisTaskStore, dashboard: Dashboard
) -> None:
    """A page kept in the back/forward cache once held its event stream open: the browser's
    six connections to the host ran out and the seventh page hung. Closed on ``pagehide``,
    reopened when the page is shown again."""
    submit_encodes(client, 2)
    open_live(driver, dashboard.url)
    for i in range(10):
        open_live(driver, f"{dashboard.url}tasks?limit={i + 1}")
    open_live(driver, dashboard.url)
    open_live(driver, f"{dashboard.url}tasks")
    # Back to the overview: Chromium restores it from the cache (its window.__marker is still
    # there), so it is its pageshow that opens the stream again; a browser that loads it
    # again instead passes as well.
    driver.back()
    wait_for(driver, lambda d: d.current_url == dashboard.url, "the overview again")
    wait_for(driver, lambda d: d.find_element(By.ID, "live").text == "live", "it to listen")
    submit_encodes(client, 3)
    wait_for(driver, lambda d: shown_counts(d)["pending"] == 5, "the new tasks counted")
    assert shown_counts(driver) == store_counts(store)


# -- the list ------------------------------------------------------------------------------------


def test_the_filter_form_narrows_the_list_to_exactly_the_matching_tasks(
    driver: webdriver.Chrome, client: Client, store: RedisTaskStore, worker: None,
    dashboard: Dashboard, screenshots: Screenshots,
) -> None:  # fmt: skip
    quick = [client.submit("render", {"frames": 1, "frame_ms": 0}, tags=["alpha"])
             for _ in range(3)]  # fmt: skip
    encode = submit_encodes(client, 4, ("beta",))
    later = [h.task_id for h in client.submit_many("render", [{"frames": 5}] * 2,
                                                   tags=["alpha"], delay=LATER)]  # fmt: skip
    for handle in quick:
        handle.wait(timeout=60)
    # Running throughout (30 s unless stopped), so the status filters below never see it move.
    slow = client.submit("render", {"frames": 300, "frame_ms": 100}, tags=["alpha", "slow"])
    wait_stored(store, slow.task_id, TaskStatus.RUNNING)
    quick_ids = [h.task_id for h in quick]

    open_live(driver, dashboard.url + "tasks")
    assert len(shown_ids(driver)) == 10

    def exactly(expected: list[str], **query: Any) -> None:
        """The rows are ``expected`` (any order given), in the order ``query`` finds them."""
        shown = shown_ids(driver)
        assert sorted(shown) == sorted(expected), (query, shown, expected)
        assert shown == ids_of(store, **query), query

    apply_filters(driver, name="encode")
    assert "name=encode" in driver.current_url
    exactly(encode, name="encode")
    assert driver.find_element(By.NAME, "name").get_attribute("value") == "encode"

    apply_filters(driver, statuses=("succeeded",))
    exactly(quick_ids, statuses=frozenset({TaskStatus.SUCCEEDED}))
    assert {status for _, status in shown_rows(driver)} == {"succeeded"}
    assert driver.find_element(By.CSS_SELECTOR, "input[name=status][value=succeeded]").is_selected()

    apply_filters(driver, statuses=("pending",), tag="alpha")
    exactly(later, statuses=frozenset({TaskStatus.PENDING}), tag="alpha")
    assert {status for _, status in shown_rows(driver)} == {"pending"}

    apply_filters(driver, statuses=("pending", "succeeded"), prefix="ren")
    both = frozenset({TaskStatus.PENDING, TaskStatus.SUCCEEDED})
    exactly(quick_ids + later, statuses=both, name_prefix="ren")

    apply_filters(driver, tag="beta", order="newest")
    exactly(encode, tag="beta", newest_first=True)
    assert shown_ids(driver) == ids_of(store, tag="beta")[::-1]

    apply_filters(driver, tag="alpha")
    exactly([*quick_ids, *later, slow.task_id], tag="alpha")
    assert shown_ids(driver)[-1] == slow.task_id  # the newest
    wait_for(driver, lambda d: (row_progress(d, slow.task_id) or 0) >= 5,
             "the running row's progress")  # fmt: skip
    screenshots.take(driver, "tasks")

    apply_filters(driver, tag="nothing-has-this")
    assert shown_ids(driver) == []
    assert "No task matches these filters" in driver.find_element(By.ID, "task-table").text
    client.stop(slow.task_id)


def test_the_pager_walks_every_task_once_both_ways(
    driver: webdriver.Chrome, client: Client, store: RedisTaskStore, dashboard: Dashboard
) -> None:
    # submit_many writes tasks in batches that may share created_at: ties are ordered by id.
    submit_encodes(client, 8, ("page",))
    for i in range(3):
        client.submit("render", {"frames": i + 1}, tags=["page"], delay=LATER)
    submit_encodes(client, 1)  # not tagged: filtered out
    everything = ids_of(store, tag="page")
    assert len(everything) == 11

    open_live(driver, dashboard.url + "tasks")
    apply_filters(driver, tag="page", limit="3")
    assert driver.find_elements(By.ID, "prev-page") == []
    assert driver.find_elements(By.ID, "first-page") == []
    pages = [shown_ids(driver)]
    while driver.find_elements(By.ID, "next-page"):
        click_and_load(driver, "next-page")
        pages.append(shown_ids(driver))
        assert len(pages) <= 11, pages
    assert [len(p) for p in pages] == [3, 3, 3, 2]
    assert [i for p in pages for i in p] == everything
    assert driver.find_elements(By.ID, "first-page")

    back = [shown_ids(driver)]
    while driver.find_elements(By.ID, "prev-page"):
        click_and_load(driver, "prev-page")
        back.append(shown_ids(driver))
        assert len(back) <= 11, back
    assert back == pages[::-1]

    click_and_load(driver, "next-page")
    click_and_load(driver, "first-page")
    assert shown_ids(driver) == pages[0]
    assert "tag=page" in driver.current_url and "limit=3" in driver.current_url


# -- a task's page -------------------------------------------------------------------------------


def test_a_running_tasks_progress_and_status_update_without_a_reload(
    driver: webdriver.Chrome, client: Client, store: RedisTaskStore, worker: None,
    dashboard: Dashboard, screenshots: Screenshots,
) -> None:  # fmt: skip
    handle = client.submit("render", {"frames": 80, "frame_ms": 100}, tags=["demo"])
    open_live(driver, f"{dashboard.url}tasks/{handle.task_id}")
    wait_status(driver, "running")

    seen: list[float] = []

    def advanced(d: webdriver.Chrome) -> bool:
        value = progress(d)
        if value is not None and (not seen or value != seen[-1]):
            seen.append(value)
        return len(seen) >= 3

    wait_for(driver, advanced, "the progress bar to move twice")
    assert all(a < b for a, b in pairwise(seen)), seen
    shown = text(driver, "progress-text")
    assert shown.endswith("%)") and " / 80 (" in shown, shown
    screenshots.take(driver, "task")

    wait_status(driver, "succeeded")
    assert not reloaded(driver), "the page was reloaded"
    history = text(driver, "task-history")
    assert "running → succeeded" in history, history
    assert '"frames": 80' in text(driver, "task-outcome")
    assert (progress(driver) or 0) >= seen[-1]
    assert store.get(handle.task_id).status is TaskStatus.SUCCEEDED  # type: ignore[union-attr]
    wait_for(driver, lambda d: progress(d) == 100.0, "the bar at 100 % once it succeeded")


def test_parts_the_stream_repeats_unchanged_are_left_alone(
    driver: webdriver.Chrome, client: Client, store: RedisTaskStore, worker: None,
    dashboard: Dashboard,
) -> None:  # fmt: skip
    """The first events of a stream repeat what the page shows; an identical part is not
    replaced (a replaced part loses focus and any click in flight)."""
    handle = client.submit("render", {"frames": 1, "frame_ms": 0})
    handle.wait(timeout=30)
    open_live(driver, f"{dashboard.url}tasks/{handle.task_id}")
    time.sleep(1)  # the first stream's first patch is in
    js(driver, "document.querySelector('#task-summary dl').__kept = 1;")
    # A new stream (as after a trip through the back/forward cache) repeats every part first.
    js(
        driver,
        "window.dispatchEvent(new PageTransitionEvent('pagehide'));"
        "window.dispatchEvent(new PageTransitionEvent('pageshow', {persisted: true}));",
    )
    wait_for(driver, lambda d: d.find_element(By.ID, "live").text == "live", "the new stream")
    time.sleep(2)  # its first patch comes at once; a task that ended sends no other
    assert js(driver, "return document.querySelector('#task-summary dl').__kept === 1;") is True


# -- control -------------------------------------------------------------------------------------


def sign_in(driver: webdriver.Chrome, dash: Dashboard) -> None:
    assert dash.login is not None
    driver.get(dash.login)
    wait_for(driver, lambda d: d.current_url == dash.url, "the redirect to the overview")
    assert driver.find_element(By.CSS_SELECTOR, "header form.inline button").text == "sign out"


def press(driver: webdriver.Chrome, button: str, outcome: str) -> None:
    """Press a control button; wait for the page it leads to, saying ``outcome``."""
    click_and_load(driver, button)
    wait_for(driver, lambda d: d.find_elements(By.ID, "control-result"),
             f"#control-result after #{button}")  # fmt: skip
    result = text(driver, "control-result")
    assert result.startswith(outcome), result


def test_stop_from_the_task_page_ends_the_task_stopped(
    driver: webdriver.Chrome, client: Client, store: RedisTaskStore, worker: None,
    start_dashboard: Callable[..., Dashboard],
) -> None:  # fmt: skip
    dash = start_dashboard(control=True)
    sign_in(driver, dash)
    handle = client.submit("render", {"frames": 600, "frame_ms": 100})
    wait_stored(store, handle.task_id, TaskStatus.RUNNING)
    open_live(driver, f"{dash.url}tasks/{handle.task_id}")
    wait_status(driver, "running")
    assert buttons(driver) == ["btn-stop", "btn-pause"]

    press(driver, "btn-stop", "stop: stopped")
    wait_status(driver, "stopped")
    # The outcome stays once the page's stream is live (it once sat in #alert, which the
    # stream's first event emptied).
    wait_for(driver, lambda d: "stop" in text(d, "task-commands"), "the stop command listed")
    assert text(driver, "control-result").startswith("stop: stopped")
    assert store.get(handle.task_id).status is TaskStatus.STOPPED  # type: ignore[union-attr]
    assert buttons(driver) == ["btn-retry"]


def test_pause_then_resume_from_the_task_page_and_a_stop_elsewhere_shows_live(
    driver: webdriver.Chrome, client: Client, store: RedisTaskStore, worker: None,
    start_dashboard: Callable[..., Dashboard],
) -> None:  # fmt: skip
    dash = start_dashboard(control=True)
    sign_in(driver, dash)
    handle = client.submit("render", {"frames": 600, "frame_ms": 100})
    wait_stored(store, handle.task_id, TaskStatus.RUNNING)
    open_live(driver, f"{dash.url}tasks/{handle.task_id}")

    press(driver, "btn-pause", "pause: paused")
    wait_status(driver, "paused")
    assert store.get(handle.task_id).status is TaskStatus.PAUSED  # type: ignore[union-attr]
    assert buttons(driver) == ["btn-stop", "btn-resume"]

    press(driver, "btn-resume", "resume: resumed")
    wait_status(driver, "running")
    assert store.get(handle.task_id).status is TaskStatus.RUNNING  # type: ignore[union-attr]
    assert buttons(driver) == ["btn-stop", "btn-pause"]

    # Stopped by someone else (the CLI, a script): the page follows, buttons included.
    js(driver, "window.__marker = 1;")
    assert client.stop(handle.task_id, timeout=30) == "stopped"
    wait_status(driver, "stopped")
    wait_for(driver, lambda d: buttons(d) == ["btn-retry"], "only the Retry button")
    assert not reloaded(driver)


def test_no_control_without_allow_control_nor_when_signed_out(
    driver: webdriver.Chrome, client: Client, start_dashboard: Callable[..., Dashboard]
) -> None:
    (task_id,) = submit_encodes(client, 1)
    form = {"task_id": task_id, "action": "stop", "csrf": "x"}

    read_only = start_dashboard()
    open_live(driver, f"{read_only.url}tasks/{task_id}")
    assert buttons(driver) == []
    assert text(driver, "task-control") == ""
    assert fetch(driver, "/control", "POST", form)["status"] == 404
    assert fetch(driver, "/login")["status"] == 404
    assert fetch(driver, "/api/v1/control", "POST", form)["status"] == 404

    control = start_dashboard(control=True)
    open_live(driver, f"{control.url}tasks/{task_id}")
    assert buttons(driver) == []
    assert "Sign in" in text(driver, "task-control")
    assert fetch(driver, "/control", "POST", form)["status"] == 403
    assert fetch(driver, f"/login?token={'x' * 20}")["status"] == 403
    assert client.get(task_id).status is TaskStatus.PENDING  # type: ignore[union-attr]

    sign_in(driver, control)
    open_live(driver, f"{control.url}tasks/{task_id}")
    assert buttons(driver) == ["btn-stop", "btn-pause"]
    # Signed in, a form without this dashboard's CSRF value is refused all the same.
    assert fetch(driver, "/control", "POST", form)["status"] == 403
    assert client.get(task_id).status is TaskStatus.PENDING  # type: ignore[union-attr]


# -- the JSON feed -------------------------------------------------------------------------------


def test_a_bad_feed_cursor_is_a_400_never_an_empty_page(
    driver: webdriver.Chrome, client: Client, store: RedisTaskStore, dashboard: Dashboard
) -> None:
    submit_encodes(client, 3)
    head = store.feed_stats().head
    open_live(driver, dashboard.url)

    for cursor in ("abc", str(head + 1), str(head + 1000), "-1", "1.5", "007", ""):
        answer = fetch(driver, f"/api/v1/tasks?after={cursor}")
        assert answer["status"] == 400, (cursor, answer)
        assert answer["body"]["error"] == "invalid_cursor", (cursor, answer)
        assert answer["body"]["message"], answer

    first = fetch(driver, "/api/v1/tasks?after=0")
    assert first["status"] == 200 and len(first["body"]["tasks"]) == 3
    assert first["body"]["next_cursor"] == str(head)
    caught_up = fetch(driver, f"/api/v1/tasks?after={head}")
    assert caught_up["status"] == 200 and caught_up["body"]["tasks"] == []

    # Navigated to, the browser shows the error, not a page of no tasks.
    driver.get(f"{dashboard.url}api/v1/tasks?after=abc")
    shown = driver.find_element(By.TAG_NAME, "body").text
    assert '"error":"invalid_cursor"' in shown.replace(" ", ""), shown
    assert '"tasks"' not in shown


def svg_nodes(driver: webdriver.Chrome) -> dict[str, dict[str, str]]:
    """The pipeline drawing's nodes: task id -> its status and its box's computed fill."""
    shown: dict[str, dict[str, str]] = js(driver, """
        const found = {};
        document.querySelectorAll("svg.pipeline a.node").forEach((a) => {
            found[a.dataset.task] = {status: a.dataset.status,
                                     fill: getComputedStyle(a.querySelector("rect")).fill};
        });
        return found;""")  # fmt: skip
    return shown


def test_the_pipeline_graph_is_drawn_coloured_by_status_updates_live_and_links_the_tasks(
    driver: webdriver.Chrome, store: RedisTaskStore, dashboard: Dashboard
) -> None:
    wf = Client(store, name="browser-test").workflow(pipeline_run_id="wf-browser")
    top = wf.add("encode", {"n": 0})
    branches = wf.group(("encode", {"n": 1}), ("encode", {"n": 2}), after=[top])
    wf.add("encode", {"n": 3}, after=branches)
    ids = [h.task_id for h in wf.submit()]
    open_live(driver, f"{dashboard.url}pipelines/wf-browser")
    drawn = svg_nodes(driver)
    assert {k: v["status"] for k, v in drawn.items()} == {
        ids[0]: "pending",
        ids[1]: "waiting",
        ids[2]: "waiting",
        ids[3]: "waiting",
    }
    # Each status its own colour: the waiting boxes look alike, the pending one differs.
    assert drawn[ids[1]]["fill"] == drawn[ids[3]]["fill"] != drawn[ids[0]]["fill"]
    assert js(driver, "return document.querySelectorAll('svg.pipeline path.edge').length;") == 4
    first = store.get(ids[0])
    assert first is not None
    store.save(first.evolve(status=TaskStatus.SUCCEEDED, status_version=first.status_version + 1),
               expect_version=first.status_version)  # fmt: skip
    wait_for(driver, lambda d: svg_nodes(d).get(ids[1], {}).get("status") == "pending",
             "the released branch to turn pending on the drawing")  # fmt: skip
    assert svg_nodes(driver)[ids[0]]["status"] == "succeeded"
    assert not reloaded(driver), "the page was reloaded"
    # A node is a link to its task's page, which lists the parents.
    driver.find_element(By.CSS_SELECTOR, f'svg.pipeline a.node[data-task="{ids[3]}"]').click()
    wait_for(driver, lambda d: d.current_url.endswith(f"/tasks/{ids[3]}"), "the join's page")
    parents = text(driver, "task-parents")
    assert ids[1] in parents and ids[2] in parents and "pending" in parents, parents
