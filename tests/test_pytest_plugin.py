"""The pytest plugin users get (``chongming_redis.pytest_plugin``, the ``pytest11`` entry
point): a user's test file, run by a separate pytest process that only has the installed
package, gets a throwaway Redis, a namespace per test, a client and a real worker."""

from __future__ import annotations

import pytest

from tests.support.redis_server import RedisProc

pytest_plugins = ["pytester"]
pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

USER_TESTS = """
import threading, time
from pydantic import BaseModel
import pytest

from chongming_redis import App, TaskContext, TaskFailed, TaskStatus

app = App("users-app")
seen_namespaces = []

class Resize(BaseModel):
    width: int

@app.task()
def resize(ctx: TaskContext, params: Resize) -> dict:
    ctx.checkpoint(current=1, total=1)
    return {"width": params.width * 2}

@app.task()
def broken(ctx: TaskContext, params: dict) -> None:
    raise RuntimeError("broken on purpose")

def test_a_real_worker_runs_the_tasks(chongming):
    client = chongming.client(app)
    seen_namespaces.append(chongming.namespace)
    with chongming.worker(app, concurrency=2):
        assert resize.submit(client, width=320).wait(timeout=20) == {"width": 640}
        with pytest.raises(TaskFailed, match="broken on purpose"):
            client.submit("broken", {}).wait(timeout=20)
    history = [t.to_status.value for t in client.history(client.list()[0].task_id)]
    assert history == ["pending", "running", "succeeded"]

def test_run_drains_what_was_submitted(chongming):
    client = chongming.client(app)
    seen_namespaces.append(chongming.namespace)
    handles = [resize.submit(client, width=n) for n in range(5)]
    assert client.stats()[TaskStatus.PENDING] == 5
    chongming.run(app)
    assert [h.result() for h in handles] == [{"width": 2 * n} for n in range(5)]

def test_each_test_has_its_own_empty_namespace(chongming, chongming_redis_url):
    assert chongming_redis_url.startswith(("redis://", "unix://"))
    assert chongming.namespace not in seen_namespaces
    assert chongming.client().list() == []
"""


def test_a_users_test_file_gets_redis_a_client_and_a_worker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_users_app=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=3)


def test_the_namespace_is_deleted_after_each_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_cleanup="""
import redis

NAMESPACES = []

def test_writes(chongming):
    chongming.client().submit("anything", {"x": 1})
    NAMESPACES.append((chongming.url, chongming.namespace))
    assert chongming.client().list()

def test_nothing_left(chongming):
    url, namespace = NAMESPACES[0]
    keys = list(redis.Redis.from_url(url).scan_iter(match="{" + namespace + "}*"))
    assert keys == []
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2)


def test_a_redis_named_by_the_environment_is_used_instead_of_starting_one(
    pytester: pytest.Pytester, redis_proc: RedisProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHONGMING_REDIS_URL", redis_proc.url)
    pytester.makepyfile(
        test_given=f"""
def test_the_given_redis(chongming_redis_url, chongming):
    assert chongming_redis_url == {redis_proc.url!r}
    chongming.client().submit("anything", {{"x": 1}})
    assert chongming.client().list()
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1)
