"""``chongming-redis changes``: the feed as JSON lines, run as a real process against a real
redis-server — a full read, resuming from a printed cursor, following new changes until
interrupted, and one-line errors for bad cursors and limits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest

from chongming_redis import TaskSnapshot, TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc
from tests.test_cli import ROOT, cli, ok, user_error

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def lines(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines()]


def _default_sigint() -> None:
    """The child starts with Ctrl-C as a fresh shell gives it (default, unblocked), whatever
    state the test runner's process is in: the tests are about the follower, not the runner."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_full_read_then_a_resume_from_the_printed_cursor(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    for i in range(5):
        store.create(TaskSnapshot(f"t{i}", "job", TaskStatus.SUCCEEDED, 1, T0, T0, bucket=i))
    common = ("--redis", redis_proc.url, "--namespace", namespace)
    out = lines(ok(cli("changes", "--limit", "2", *common)))
    items = [o for o in out if "task_id" in o]
    assert [o["task_id"] for o in items] == [f"t{i}" for i in range(5)]
    assert [o["next_cursor"] for o in out if "next_cursor" in o] == ["2", "4", "5"]
    store.prune(keep_terminal=3)
    store.save(TaskSnapshot("t4", "job", TaskStatus.SUCCEEDED, 2, T0, T0, bucket=4),
               expect_version=1)  # fmt: skip
    again = lines(ok(cli("changes", "--after", "5", *common)))
    assert [(o.get("task_id"), o.get("status")) for o in again[:-1]] == [
        ("t0", "removed"), ("t1", "removed"), ("t4", "succeeded")]  # fmt: skip
    assert again[-1] == {"next_cursor": "8"}
    assert lines(ok(cli("changes", "--after", "8", *common))) == [{"next_cursor": "8"}]


def test_follow_prints_new_changes_until_interrupted(redis_proc: RedisProc, namespace: str) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    store.create(TaskSnapshot("first", "job", TaskStatus.PENDING, 1, T0, T0))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    follower = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "chongming_redis.cli", "changes", "--follow",
         "--interval", "0.05",
         "--redis", redis_proc.url, "--namespace", namespace],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_default_sigint,
    )  # fmt: skip
    assert follower.stdout is not None
    assert json.loads(follower.stdout.readline())["task_id"] == "first"
    assert json.loads(follower.stdout.readline()) == {"next_cursor": "1"}
    time.sleep(0.3)
    store.create(TaskSnapshot("second", "job", TaskStatus.PENDING, 1, T0, T0))
    assert json.loads(follower.stdout.readline())["task_id"] == "second"
    follower.send_signal(signal.SIGINT)
    try:
        _, err = follower.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # where it hangs: faulthandler dumps every thread
        follower.send_signal(signal.SIGABRT)
        _, err = follower.communicate(timeout=10)
        raise AssertionError(f"no exit 10 s after SIGINT:\n{err}") from None
    assert follower.returncode == 0, err
    assert "Traceback" not in err


@pytest.mark.parametrize("bad", ["007", "-1", "1e3", " 5", ""])
def test_a_malformed_cursor_is_one_line_and_exit_1(
    redis_proc: RedisProc, namespace: str, bad: str
) -> None:
    result = cli("changes", "--after", bad, "--redis", redis_proc.url, "--namespace", namespace)
    user_error(result, "cursor")
    assert result.stdout == ""


def test_a_cursor_ahead_of_the_feed_and_a_bad_limit_are_one_line(
    redis_proc: RedisProc, namespace: str
) -> None:
    common = ("--redis", redis_proc.url, "--namespace", namespace)
    user_error(cli("changes", "--after", "99", *common), "ahead of the feed")
    user_error(cli("changes", "--limit", "257", *common), "limit")
    user_error(cli("changes", "--limit", "0", *common), "limit")
