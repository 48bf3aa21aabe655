"""The ``chongming-redis`` command line, run as a real process (``python -m chongming_redis.cli``)
against the session's redis-server.

Happy paths: submit / tasks / show / pause / resume / stop (applied by a running controller
through the command queue) / stats / reconcile / prune, and ``--redis`` read from
``CHONGMING_REDIS_URL``. User mistakes: exit status 1, exactly one line on stderr starting with
``error:`` (also at rich's default 80 columns), never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.model import TaskSnapshot, TaskStatus
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.pool_app import app as pool_app
from tests.support.redis_server import RedisProc, free_port

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[1]
APP = "tests.support.pool_app:app"


def cli(*args: str, env: dict[str, str] | None = None, wide: bool = False) -> Any:
    """Run the CLI; the environment has no CHONGMING_* settings unless ``env`` gives them."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    base.pop("COLUMNS", None)
    if wide:  # tables: no truncated ids
        base["COLUMNS"] = "250"
    return subprocess.run(
        [sys.executable, "-m", "chongming_redis.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
    )


def ok(result: Any) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return str(result.stdout)


def user_error(result: Any, *fragments: str) -> str:
    """Exit 1, one line on stderr starting with ``error:`` that contains ``fragments``."""
    assert result.returncode == 1, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return str(line)


@pytest.fixture
def url(redis_proc: RedisProc) -> str:
    return redis_proc.url


@pytest.fixture
def store(url: str, namespace: str) -> Iterator[RedisTaskStore]:
    s = RedisTaskStore.from_url(url, namespace=namespace)
    yield s
    s.close()


def wait_for(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


# -- happy paths --------------------------------------------------------------------------------


def test_submit_tasks_show(url: str, namespace: str, store: RedisTaskStore) -> None:
    common = (f"--redis={url}", f"--namespace={namespace}")
    out = ok(cli("submit", APP, "work", '--params={"ms": 5}', "--count=3", "--tag=batch",
                 "--key=user-1", *common))  # fmt: skip
    ids = out.split()
    assert len(ids) == 3
    for task_id in ids:
        snapshot = store.get(task_id)
        assert snapshot is not None
        assert snapshot.status is TaskStatus.PENDING and snapshot.params["ms"] == 5
        assert snapshot.tags == frozenset({"batch"}) and snapshot.key == "user-1"
        assert snapshot.bucket == BucketPolicy(64).bucket_for("user-1")
    listing = ok(cli("tasks", "--status=PENDING", "--tag=batch", *common, wide=True))
    assert "3 task(s)" in listing and all(task_id in listing for task_id in ids)
    assert "0 task(s)" in ok(cli("tasks", "--status=succeeded", *common, wide=True))
    shown = ok(cli("show", ids[0], *common, wide=True))
    assert ids[0] in shown and "submitted by cli-" in shown and "pending" in shown.lower()


def test_pause_resume_stop_through_a_running_controller(
    url: str, namespace: str, store: RedisTaskStore
) -> None:
    common = (f"--redis={url}", f"--namespace={namespace}")
    task_id = ok(cli("submit", APP, "work", *common)).strip()
    # A started controller that serves no bucket: it never starts the task, but it claims and
    # applies the commands the CLI queues.
    worker = Controller(store, app=pool_app, owner="cli-test-worker", command_poll_interval=0.05)
    worker.serve(frozenset())
    worker.start()
    try:

        def status() -> TaskStatus | None:
            snapshot = store.get(task_id)
            return None if snapshot is None else snapshot.status

        assert ok(cli("pause", task_id, *common)).strip().startswith("sent:cmd-")
        wait_for(lambda: status() is TaskStatus.PAUSED)
        assert ok(cli("resume", task_id, *common)).strip().startswith("sent:cmd-")
        wait_for(lambda: status() is TaskStatus.PENDING)
        assert ok(cli("stop", task_id, *common)).strip().startswith("sent:cmd-")
        wait_for(lambda: status() is TaskStatus.STOPPED)
        assert ok(cli("stop", task_id, *common)).strip() == "already-terminal"
        shown = ok(cli("show", task_id, *common, wide=True))
        for reason in ("pause by cli-", "resume by cli-", "stop by cli-"):
            assert reason in shown, shown
    finally:
        worker.shutdown(grace=2)


def test_stats_reconcile_prune(url: str, namespace: str, store: RedisTaskStore) -> None:
    common = (f"--redis={url}", f"--namespace={namespace}")
    long_ago = datetime.now(timezone.utc) - timedelta(hours=1)

    def task(task_id: str, status: TaskStatus, **extra: Any) -> None:
        snapshot = TaskSnapshot(
            task_id=task_id, name="work", status=status, status_version=1,
            created_at=long_ago, updated_at=long_ago, bucket=3, **extra,
        )  # fmt: skip
        store.create(snapshot)

    task("orphan", TaskStatus.RUNNING, lease_owner="gone-worker", lease_until=long_ago)
    for i in range(4):
        task(f"done-{i}", TaskStatus.SUCCEEDED)
    task("waiting", TaskStatus.PENDING)

    stats = ok(cli("stats", *common, wide=True))
    assert "'succeeded': 4" in stats and "'running': 1" in stats and "'pending': 1" in stats
    assert "per bucket" in stats and "workers" in stats

    reconciled = ok(cli("reconcile", *common, wide=True))
    assert "'lost': ['orphan']" in reconciled and "'retried': ['orphan']" in reconciled
    orphan = store.get("orphan")
    assert orphan is not None and orphan.status is TaskStatus.PENDING and orphan.attempt == 2
    shown = ok(cli("show", "orphan", *common, wide=True))
    assert "lease of gone-worker expired" in shown

    assert ok(cli("prune", "--keep=1", *common)).strip() == "pruned 3 task(s)"
    assert sum(store.get(f"done-{i}") is not None for i in range(4)) == 1
    assert store.get("waiting") is not None and store.get("orphan") is not None


def test_redis_url_from_the_environment(url: str, namespace: str, store: RedisTaskStore) -> None:
    env = {"CHONGMING_REDIS_URL": url, "CHONGMING_NAMESPACE": namespace}
    task_id = ok(cli("submit", APP, "work", env=env)).strip()
    assert store.get(task_id) is not None
    assert task_id in ok(cli("tasks", env=env, wide=True))
    assert "'pending': 1" in ok(cli("stats", env=env, wide=True))
    # --redis wins over the environment
    user_error(cli("tasks", "--redis=notaurl://x", env=env), "bad Redis URL")
    user_error(cli("tasks", env={"CHONGMING_REDIS_URL": "notaurl://x"}), "bad Redis URL")


# -- user mistakes ------------------------------------------------------------------------------


MISTAKES: dict[str, tuple[list[str], tuple[str, ...]]] = {
    # name: (arguments, with {url} / {down} filled in; fragments of the one error line)
    "unknown task": (["submit", APP, "nosuch", "--redis={url}"], ("unknown task type 'nosuch'",)),
    "APP without colon": (["submit", "badspec", "work", "--redis={url}"], ("APP must look like",)),
    "APP module missing": (
        ["submit", "no_such_mod_zz:app", "work", "--redis={url}"],
        ("cannot import 'no_such_mod_zz'",),
    ),
    "APP not an App": (
        ["submit", "tests.support.pool_app:Work", "work", "--redis={url}"],
        ("is not a chongming_redis App",),
    ),
    "worker APP not an App": (
        ["worker", "tests.support.pool_app:nothing", "--redis={url}"],
        ("is not a chongming_redis App",),
    ),
    "bad URL tasks": (["tasks", "--redis=notaurl://x"], ("bad Redis URL 'notaurl://x'",)),
    "bad URL submit": (["submit", APP, "work", "--redis=notaurl://x"], ("bad Redis URL",)),
    "bad URL worker": (["worker", APP, "--redis=notaurl://x"], ("bad Redis URL",)),
    "Redis down tasks": (["tasks", "--redis={down}"], ("unreachable",)),
    "Redis down submit": (["submit", APP, "work", "--redis={down}"], ("unreachable",)),
    "Redis down stats": (["stats", "--redis={down}"], ("unreachable",)),
    "Redis down worker": (["worker", APP, "--redis={down}"], ("unreachable",)),
    "Redis down stop": (["stop", "some-task", "--redis={down}"], ("unreachable",)),
    "no Redis at all": (["tasks"], ("no Redis given", "CHONGMING_REDIS_URL")),
    "params not JSON": (
        ["submit", APP, "work", "--params={bad", "--redis={url}"],
        ("--params is not JSON",),
    ),
    "params invalid": (
        ["submit", APP, "work", '--params={"ms": -1}', "--redis={url}"],
        ("parameters of 'work' do not validate", "ms: Input should be greater"),
    ),
    "params wrong type": (
        ["submit", APP, "work", "--params=[1, 2]", "--redis={url}"],
        ("do not validate", "valid dictionary"),
    ),
    "unknown status": (
        ["tasks", "--status=bogus", "--redis={url}"],
        ("unknown status 'bogus'", "pending"),
    ),
    "show unknown id": (["show", "no-such-id", "--redis={url}"], ("no task 'no-such-id'",)),
    "stop unknown id": (["stop", "no-such-id", "--redis={url}"], ("no task 'no-such-id'",)),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_user_mistakes_give_one_line_and_exit_1(
    case: str, url: str, namespace: str, store: RedisTaskStore
) -> None:
    args, fragments = MISTAKES[case]
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    filled = [a.replace("{url}", url).replace("{down}", down) for a in args]
    if any(a.startswith("--redis=") for a in filled) and args[0] != "worker":
        filled.append(f"--namespace={namespace}")
    started = time.monotonic()
    line = user_error(cli(*filled), *fragments)
    assert time.monotonic() - started < 30
    assert store.counts()[TaskStatus.PENDING] == 0  # a refused submit created nothing
    print(f"\n{case}: {line}")


def test_a_long_error_is_still_one_line_at_80_columns(url: str) -> None:
    long_namespace = "n" * 60
    line = user_error(
        cli("submit", APP, "work", '--params={"ms": "x", "runs_key": 5}', f"--redis={url}",
            f"--namespace={long_namespace}"),
        "ms: Input should be a valid integer", "runs_key: Input should be a valid string",
    )  # fmt: skip
    assert len(line) > 80
