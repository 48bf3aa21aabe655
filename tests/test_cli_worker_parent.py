"""Defects a black-box run found in the CLI (issue 11): ``worker --processes N`` exits non-zero
when its children cannot start and restarts a child that dies (logging it); ``submit --count``
below 1 and a ``--num-buckets`` other than the namespace's are refused with one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import psutil
import pytest

from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.pool_app import app as pool_app
from tests.support.redis_server import RedisProc, free_port
from tests.support.store_targets import WITH_CLUSTER, StoreTarget
from tests.test_cli import APP, ROOT, cli, user_error

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


def worker_parent(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    return subprocess.Popen([sys.executable, "-m", "chongming_redis.cli", "worker", APP, *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def test_a_parent_whose_children_cannot_start_exits_non_zero() -> None:
    parent = worker_parent(f"--redis=redis://127.0.0.1:{free_port()}/0", "--processes=2")
    _, err = parent.communicate(timeout=60)
    assert parent.returncode != 0, err
    assert "could not start" in err
    assert "Traceback" not in err.splitlines()[-1]


@pytest.mark.parametrize("target", WITH_CLUSTER, indirect=True)
def test_a_child_that_dies_is_restarted_and_logged(target: StoreTarget) -> None:
    """On every store: the parent imports the store's module and forks; each child opens its
    own connections (a SQLite or PostgreSQL connection never crosses a fork)."""
    parent = worker_parent(*target.cli_args(), "--processes=2", "--worker-lease=1")
    try:
        me = psutil.Process(parent.pid)
        deadline = time.monotonic() + 30
        _two_children(parent, me, deadline)
        time.sleep(4)  # past the start-up window: from now on a death is a crash
        # (On a loaded machine a child can still be restarting: wait for two again.)
        victim = _two_children(parent, me, deadline)[0].pid
        os.kill(victim, signal.SIGKILL)
        while len([c for c in me.children() if c.pid != victim and c.is_running()]) < 2:
            assert time.monotonic() < deadline + 30, "the dead child was not replaced"
            time.sleep(0.1)
        # The children really work on the store: both, the new one included, are in its pool.
        children = {f"{os.uname().nodename}-{c.pid}" for c in me.children()}
        store = target.open()
        try:
            while set(store.pool_state()[0]) != children:
                assert time.monotonic() < deadline + 45, (store.pool_state(), children)
                time.sleep(0.1)
        finally:
            store.close()
        assert parent.poll() is None
    finally:
        parent.send_signal(signal.SIGTERM)
        _, err = parent.communicate(timeout=60)
    assert parent.returncode == 0, err
    assert f"(pid {victim}) exited with -9; restarting" in err


def _two_children(
    parent: subprocess.Popen[str], me: psutil.Process, deadline: float
) -> list[psutil.Process]:
    """The parent's children once there are two, failing with its stderr if it exited."""
    while len(children := [c for c in me.children() if c.is_running()]) < 2:
        if parent.poll() is not None:
            raise AssertionError(f"the parent exited {parent.returncode}: {parent.communicate()}")
        assert time.monotonic() < deadline, "two children never came up"
        time.sleep(0.1)
    return children


def test_submit_refuses_a_count_below_one(redis_proc: RedisProc, namespace: str) -> None:
    for count in ("0", "-3"):
        result = cli("submit", APP, "work", "--count", count, "--redis", redis_proc.url,
                     "--namespace", namespace)  # fmt: skip
        user_error(result, "--count")
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    assert sum(store.counts().values()) == 0


def test_submit_refuses_another_bucket_count_than_the_namespace_s(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    worker = Controller(store, app=pool_app, owner="w", buckets=BucketPolicy(16))
    worker.join_pool().tick()  # records num_buckets=16 for the namespace
    common = ("--redis", redis_proc.url, "--namespace", namespace)
    user_error(cli("submit", APP, "work", "--num-buckets", "8", *common), "num-buckets=16")
    assert sum(store.counts().values()) == 0
    result = cli("submit", APP, "work", *common)  # the recorded count, by default
    assert result.returncode == 0, result.stderr
    (task,) = store.query()
    assert task.bucket == BucketPolicy(16).bucket_for(task.task_id)
    assert datetime.now(timezone.utc) >= task.created_at


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_that_reaches_a_forked_child_before_its_own_handlers_stops_it(
    signum: int,
) -> None:
    """The parent forwards Ctrl-C to a child that may not have installed its worker's handlers
    yet (under load, a child just forked may not have run at all). The signal is neither lost
    (before: Python dropped it, finding SIG_DFL by the time it ran its handlers, and the parent
    waited for that child forever) nor run by the parent's forwarding handler: the child stops
    at once with 130."""
    from chongming_redis.cli.worker_parent import ForkedChild

    child = ForkedChild(lambda: time.sleep(60))  # never installs a handler of its own
    os.kill(child.pid, signum)  # at once: before the child has run a single line
    assert child.wait(timeout=30) == 130
