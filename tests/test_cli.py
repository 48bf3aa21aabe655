"""The ``chongming-redis`` command line, run as a real process (``python -m chongming_redis.cli``)
against the session's redis-server.

Happy paths: submit / tasks / show / stats / reconcile / prune, and ``--redis`` read from
``CHONGMING_REDIS_URL`` (stop / pause / resume: ``test_cli_control.py``; the read commands'
tables and JSON: ``test_cli_read.py``). User mistakes, usage mistakes included (a bad option
value, a missing argument): exit status 1, exactly one line on stderr starting with ``error:``
(also at rich's default 80 columns), never a traceback, nothing written.
"""

from __future__ import annotations

import json
import os
import re
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
from chongming_redis.stores.redis import RedisTaskStore
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
    assert ok(cli("tasks", "--status=succeeded", *common)) == "no tasks match\n"
    shown = ok(cli("show", ids[0], *common, wide=True))
    assert ids[0] in shown and "submitted by cli-" in shown and "pending" in shown.lower()


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

    stats = ok(cli("stats", *common))
    for status, count in (("succeeded", 4), ("running", 1), ("pending", 1), ("failed", 0)):
        assert re.search(rf"│ {status} +│ +{count} │", stats), (status, stats)
    assert "per bucket" in stats and "no workers have joined this namespace" in stats
    assert "TaskStatus" not in stats and "{" not in stats  # words, not reprs or dicts

    reconciled = ok(cli("reconcile", *common))
    assert reconciled.splitlines() == [
        "marked lost (lease expired): 1", "  orphan",
        "queued a new attempt: 1", "  orphan",
        "heartbeat stalled, lease still valid (reported only): 0",
    ]  # fmt: skip
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
    assert json.loads(ok(cli("stats", "--json", env=env)))["counts"]["pending"] == 1
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
    "delay negative": (
        ["submit", APP, "work", "--delay=-1", "--redis={url}"],
        ("--delay must be a number of seconds from 0", "not -1.0"),
    ),
    "delay not a number": (
        ["submit", APP, "work", "--delay=soon", "--redis={url}"],
        ("Invalid value for '--delay'", "submit --help"),
    ),
    "delay infinite": (["submit", APP, "work", "--delay=inf", "--redis={url}"], ("--delay",)),
    "delay nan": (["submit", APP, "work", "--delay=nan", "--redis={url}"], ("--delay",)),
    "delay with count": (
        ["submit", APP, "work", "--count=5", "--delay=-0.5", "--redis={url}"],
        ("--delay must be",),
    ),
    "max attempts zero": (
        ["worker", APP, "--max-attempts=0", "--redis={url}"],
        ("--max-attempts must be at least 1, not 0",),
    ),
    "max attempts not a number": (
        ["worker", APP, "--max-attempts=many", "--redis={url}"],
        ("Invalid value for '--max-attempts'",),
    ),
    "retry backoff negative": (
        ["worker", APP, "--retry-backoff=-2", "--redis={url}"],
        ("--retry-backoff must be a number of seconds",),
    ),
    "log level unknown": (
        ["worker", APP, "--log-level=loud", "--redis={url}"],
        ("--log-level must be one of DEBUG, INFO, WARNING, ERROR", "'loud'"),
    ),
    "limit zero": (["tasks", "--limit=0", "--redis={url}"], ("--limit must be at least 1",)),
    "prune keep negative": (["prune", "--keep=-1", "--redis={url}"], ("--keep must be at least",)),
    "missing argument": (["show", "--redis={url}"], ("Missing argument", "show --help")),
    "unknown option": (["tasks", "--colour", "--redis={url}"], ("No such option", "--colour")),
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
        cli("submit", APP, "work", '--params={"ms": "x", "runs_file": 5}', f"--redis={url}",
            f"--namespace={long_namespace}"),
        "ms: Input should be a valid integer", "runs_file: Input should be a valid string",
    )  # fmt: skip
    assert len(line) > 80


# -- help and version ---------------------------------------------------------------------------


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    assert ok(cli("--version")) == f"chongming-redis {version('chongming-redis')}\n"


@pytest.mark.parametrize(
    "command", ["", "worker", "submit", "tasks", "show", "stats", "reconcile", "prune", "changes"]
)
def test_each_help_has_an_example(command: str) -> None:
    text = ok(cli(*command.split(), "--help"))
    assert "Example:" in text and "chongming-redis " in text.split("Example:")[1], text


def test_the_status_option_lists_its_values() -> None:
    text = " ".join(ok(cli("tasks", "--help")).split())
    values = "one of: waiting, pending, running, paused, succeeded, failed, stopped, lost"
    assert values in text.replace("│ ", "").replace(" │", ""), text


def test_no_arguments_prints_the_help() -> None:
    result = cli()
    assert result.returncode == 2 and "Traceback" not in result.stderr + result.stdout
    assert "Commands" in result.stdout + result.stderr


def test_submit_unique_prints_the_holder_and_show_prints_the_policies(
    url: str, namespace: str, store: RedisTaskStore
) -> None:
    common = (f"--redis={url}", f"--namespace={namespace}")
    first = cli("submit", APP, "work", "--unique=invoice-42", *common)
    task_id = ok(first).strip()
    assert first.stderr == ""
    again = cli("submit", APP, "work", "--unique=invoice-42", *common)
    assert ok(again).strip() == task_id  # the unfinished holder, nothing written
    assert "held by unfinished task" in again.stderr and task_id in again.stderr
    assert len(store.query()) == 1 and store.get(task_id).unique == "invoice-42"
    user_error(cli("submit", APP, "work", "--unique=x", "--count=2", *common), "--unique")
    user_error(cli("submit", APP, "work", "--unique=" + "u" * 1100, *common), "unique")
    assert len(store.query()) == 1  # the refused submits wrote nothing
    shown = ok(cli("show", task_id, *common, wide=True))
    for fragment in ("retry", "the worker's default", "retention", "604800s after it finished",
                     "unique", "invoice-42"):  # fmt: skip
        assert fragment in shown, fragment
    doc = json.loads(ok(cli("show", task_id, "--json", *common)))
    assert doc["task"]["policies"] == {"retry": None, "timeout": None, "deadline": None,
                                       "retention": 604800.0, "unique": "invoice-42"}  # fmt: skip
