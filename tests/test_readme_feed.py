"""The README's change-feed example runs as shown (only the Redis URL is this test's server):
started as a process, it applies what the store holds and what is written while it follows,
and stops on Ctrl-C. Each test runs on README.md and on its Chinese translation README.zh-CN.md."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from chongming_redis import TaskSnapshot, TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.redis_server import RedisProc

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]
ROOT = Path(__file__).resolve().parents[1]
# Each README and the heading of its feed section.
FEED_SECTIONS = {"README.md": "## Follow the change feed", "README.zh-CN.md": "## 跟随变更流"}
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


@pytest.fixture(params=FEED_SECTIONS)
def readme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def feed_example(readme: str) -> str:
    text = (ROOT / readme).read_text("utf-8")
    assert FEED_SECTIONS[readme] in text, (readme, FEED_SECTIONS[readme])
    section = text.split(FEED_SECTIONS[readme], 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def _default_sigint() -> None:
    """The child starts with Ctrl-C as a fresh shell gives it (default, unblocked), whatever
    state the test runner's process is in: the tests are about the follower, not the runner."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_the_readme_feed_example_follows_the_store(
    redis_proc: RedisProc, tmp_path: Path, readme: str
) -> None:
    code = feed_example(readme)
    assert len(code.strip().splitlines()) <= 12
    code = code.replace("redis://127.0.0.1:6379/0", redis_proc.url)
    store = RedisTaskStore.from_url(redis_proc.url, namespace="app")
    store.client.delete(*store.client.keys("{app}:*") or ["{app}:none"])
    store.create(TaskSnapshot("before", "job", TaskStatus.PENDING, 1, T0, T0))
    process = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", code], cwd=tmp_path,
                               text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"},
                               preexec_fn=_default_sigint)  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.readline() == "1 changes applied; caught up: False\n"
    assert process.stdout.readline() == "0 changes applied; caught up: True\n"  # it says so
    store.create(TaskSnapshot("during", "job", TaskStatus.SUCCEEDED, 1, T0, T0))
    store.prune(keep_terminal=0)
    deadline = time.monotonic() + 20
    rows: list[tuple[str, str]] = []
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            rows = sqlite3.connect(tmp_path / "feed.db").execute(
                "SELECT id, status FROM seen ORDER BY id").fetchall()  # fmt: skip
        except sqlite3.OperationalError:
            continue
        if rows == [("before", "pending"), ("during", "removed")]:
            break
    process.send_signal(signal.SIGINT)
    try:
        process.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # where it hangs: faulthandler dumps every thread
        process.send_signal(signal.SIGABRT)
        _, err = process.communicate(timeout=10)
        raise AssertionError(f"no exit 10 s after SIGINT:\n{err}") from None
    assert rows == [("before", "pending"), ("during", "removed")]


def test_on_an_empty_namespace_it_says_it_is_caught_up(
    redis_proc: RedisProc, tmp_path: Path, readme: str
) -> None:
    """Before, it printed nothing at all until a first change came."""
    code = feed_example(readme).replace("redis://127.0.0.1:6379/0", redis_proc.url)
    code = code.replace('namespace="app"', 'namespace="app-empty"')
    process = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"},
                               preexec_fn=_default_sigint)  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "0 changes applied; caught up: True\n"
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=10)
