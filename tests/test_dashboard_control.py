"""``--allow-control``: without it there is no control route and no button; with it, only a
user signed in with the token, posting a form that carries the page's CSRF value from the
dashboard's own origin, changes anything — every refusal leaves the store as it was. Scripts
use ``Authorization: Bearer``. Buttons go through the ``Client`` and report its outcome."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape
from urllib.parse import unquote

import pytest
from starlette.testclient import TestClient

from chongming_redis.dashboard import create_app
from chongming_redis.model import TaskStatus
from chongming_redis.stores.memory import InMemoryTaskStore
from tests.support.dashboard import fill

TOKEN = "a-token-of-twenty-chars"


@pytest.fixture
def store() -> Iterator[InMemoryTaskStore]:
    made = InMemoryTaskStore()
    fill(made, 10)
    yield made
    made.close()


@pytest.fixture
def web(store: InMemoryTaskStore) -> Iterator[TestClient]:
    app = create_app(store, namespace="ctl", control_token=TOKEN, command_timeout=2)
    with TestClient(app, base_url="http://dash.test") as client:
        yield client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, "no CSRF value on the page"
    return found.group(1)


def sign_in(web: TestClient) -> str:
    page = web.get(f"/login?token={TOKEN}", follow_redirects=False)
    assert page.status_code == 303 and "chongming_session" in page.headers["set-cookie"]
    assert "httponly" in page.headers["set-cookie"].lower()
    assert "samesite=strict" in page.headers["set-cookie"].lower()
    assert TOKEN not in page.headers["set-cookie"]
    session = page.cookies["chongming_session"]
    web.cookies.clear()  # one cookie in the jar, whatever domain the response gave it
    web.cookies.set("chongming_session", session)
    return csrf_of(web.get("/tasks/task-000").text)


def nothing_changed(store: InMemoryTaskStore) -> None:
    task = store.get("task-000")
    assert task is not None and task.status is TaskStatus.PENDING and task.status_version == 1
    assert store.task_commands("task-000") == []


def test_read_only_by_default_no_route_and_no_button() -> None:
    store = InMemoryTaskStore()
    fill(store, 3)
    with TestClient(create_app(store, namespace="ro")) as web:
        page = web.get("/tasks/task-000")
        assert "btn-stop" not in page.text and "task-control" in page.text
        assert "Sign in" not in page.text and "/login" not in page.text
        assert web.get("/login").status_code == 404
        form = {"task_id": "task-000", "action": "stop", "csrf": "x"}
        assert web.post("/control", data=form).status_code in (404, 405)
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        api = web.post("/api/v1/control", json={"task_id": "task-000", "action": "stop"},
                       headers=bearer)  # fmt: skip
        assert api.status_code in (404, 405)
    task = store.get("task-000")
    assert task is not None and task.status is TaskStatus.PENDING


def test_signed_out_users_see_no_button_and_cannot_post(
    web: TestClient, store: InMemoryTaskStore
) -> None:
    page = web.get("/tasks/task-000")
    assert "btn-stop" not in page.text and "Sign in" in page.text
    refused = web.post("/control", data={"task_id": "task-000", "action": "stop", "csrf": "0"})
    assert refused.status_code == 403
    nothing_changed(store)


def test_a_wrong_token_does_not_sign_in(web: TestClient, store: InMemoryTaskStore) -> None:
    assert web.get("/login?token=wrong-token-0000000").status_code == 403
    page = web.post("/login", data={"token": "wrong-token-0000000"}, follow_redirects=False)
    assert page.status_code == 403 and "set-cookie" not in page.headers
    web.cookies.set("chongming_session", "0" * 64)  # a forged cookie
    assert "btn-stop" not in web.get("/tasks/task-000").text


def test_signed_in_stop_of_a_task_nobody_holds_stops_it(
    web: TestClient, store: InMemoryTaskStore
) -> None:
    csrf = sign_in(web)
    page = web.get("/tasks/task-000")
    assert all(b in page.text for b in ("btn-stop", "btn-pause")) and "btn-retry" not in page.text
    done = web.post("/control", data={"task_id": "task-000", "action": "stop", "csrf": csrf},
                    follow_redirects=False)  # fmt: skip
    assert done.status_code == 303
    assert unquote(done.headers["location"]).startswith("/tasks/task-000?done=stop: stopped&sig=")
    task = store.get("task-000")
    assert task is not None and task.status is TaskStatus.STOPPED
    after = web.get(done.headers["location"])
    assert "stop: stopped" in unescape(after.text) and "btn-retry" in after.text
    again = web.post("/control", data={"task_id": "task-000", "action": "retry", "csrf": csrf},
                     follow_redirects=False)  # fmt: skip
    assert again.status_code == 303
    task = store.get("task-000")
    assert task is not None and task.status is TaskStatus.PENDING and task.attempt == 2


@pytest.mark.parametrize(
    ("form", "headers"),
    [
        ({"task_id": "task-000", "action": "stop"}, {}),  # no CSRF value
        ({"task_id": "task-000", "action": "stop", "csrf": "f" * 64}, {}),  # a wrong one
        ({"task_id": "task-000", "action": "stop", "csrf": None}, {"origin": "http://evil.test"}),
        ({"task_id": "task-000", "action": "stop", "csrf": None},
         {"referer": "http://evil.test/page"}),
    ],
)  # fmt: skip
def test_a_forged_form_is_refused_and_changes_nothing(
    web: TestClient, store: InMemoryTaskStore, form: dict[str, str | None], headers: dict[str, str]
) -> None:
    csrf = sign_in(web)
    data = {k: (csrf if v is None else v) for k, v in form.items()}
    assert web.post("/control", data=data, headers=headers).status_code == 403
    nothing_changed(store)


@pytest.mark.parametrize(
    "form",
    [{"task_id": "task-000", "action": "delete"}, {"task_id": "", "action": "stop"},
     {"action": "stop"}],
)  # fmt: skip
def test_a_bad_control_form_is_a_400(
    web: TestClient, store: InMemoryTaskStore, form: dict[str, str]
) -> None:
    csrf = sign_in(web)
    assert web.post("/control", data={**form, "csrf": csrf}).status_code == 400
    nothing_changed(store)


def test_the_same_origin_is_accepted(web: TestClient, store: InMemoryTaskStore) -> None:
    csrf = sign_in(web)
    done = web.post("/control", data={"task_id": "task-000", "action": "pause", "csrf": csrf},
                    headers={"origin": "http://dash.test"}, follow_redirects=False)  # fmt: skip
    assert done.status_code == 303 and "pause" in unquote(done.headers["location"])


def test_sign_out_needs_the_csrf_value_and_ends_the_session(web: TestClient) -> None:
    csrf = sign_in(web)
    copied = web.cookies["chongming_session"]
    assert web.post("/logout", data={}).status_code == 403
    out = web.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303
    web.cookies.clear()
    assert "btn-stop" not in web.get("/tasks/task-000").text
    web.cookies.set("chongming_session", copied)  # a copy of the cookie dies with its session
    assert "btn-stop" not in web.get("/tasks/task-000").text
    form = {"task_id": "task-000", "action": "stop", "csrf": csrf}
    assert web.post("/control", data=form).status_code == 403


def test_each_sign_in_is_its_own_session(web: TestClient, store: InMemoryTaskStore) -> None:
    first = sign_in(web)
    cookie = web.cookies["chongming_session"]
    second = sign_in(web)
    assert web.cookies["chongming_session"] != cookie and second != first
    web.cookies.set("chongming_session", cookie)  # the first session still works
    assert "btn-stop" in web.get("/tasks/task-000").text
    form = {
        "task_id": "task-000",
        "action": "pause",
        "csrf": second,
    }  # but not with the other's CSRF
    assert web.post("/control", data=form).status_code == 403
    nothing_changed(store)


def test_an_outcome_note_only_shows_when_this_dashboard_wrote_it(
    web: TestClient, store: InMemoryTaskStore
) -> None:
    forged = web.get("/tasks/task-000?done=stop: sign in again at evil.example&sig=" + "0" * 32)
    assert "evil.example" not in forged.text
    unsigned = web.get("/tasks/task-000?done=stop: sign in again at evil.example")
    assert "evil.example" not in unsigned.text
    csrf = sign_in(web)
    done = web.post("/control", data={"task_id": "task-000", "action": "stop", "csrf": csrf})
    assert 'id="control-result">stop: stopped' in done.text


def test_the_control_api_takes_a_bearer_token(web: TestClient, store: InMemoryTaskStore) -> None:
    body = {"task_id": "task-000", "action": "stop"}
    assert web.post("/api/v1/control", json=body).status_code == 401
    wrong = {"Authorization": "Bearer wrong-token-0000000"}
    assert web.post("/api/v1/control", json=body, headers=wrong).status_code == 401
    nothing_changed(store)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert web.post("/api/v1/control", json={"action": "stop"}, headers=auth).status_code == 400
    assert web.post("/api/v1/control", content=b"{", headers=auth).status_code == 400
    missing = web.post("/api/v1/control", json={**body, "task_id": "nope"}, headers=auth)
    assert missing.status_code == 404 and missing.json()["error"] == "no_such_task"
    done = web.post("/api/v1/control", json=body, headers=auth)
    assert done.status_code == 200 and done.json()["outcome"] == "stopped"
    again = web.post("/api/v1/control", json=body, headers=auth)
    assert again.json()["outcome"] == "already-terminal"
    refused = web.post("/api/v1/control", json={"task_id": "task-001", "action": "retry"},
                       headers=auth)  # fmt: skip
    assert refused.status_code == 409  # a running task has no new attempt to make


def test_a_short_token_is_refused() -> None:
    with pytest.raises(ValueError, match="16 characters"):
        create_app(InMemoryTaskStore(), namespace="x", control_token="short")
