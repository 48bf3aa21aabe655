"""A ``worker --processes N`` parent and its children live and die together (issue 29, item 4),
with real processes on a real redis-server:

* the parent killed with SIGKILL (no handler runs): before, both children kept running under
  PID 1 and kept serving buckets; now each hears the end of its control pipe, shuts down
  gracefully and hands its running task back;
* two Ctrl-C as a terminal sends them (SIGINT to the whole process group, 0.5 s apart): before,
  the second reached each child within 2 s of the first and was taken for the same one, so the
  whole 30 s grace ran; now the parent passes the second on and the children hand back at once,
  and the task's line says it was handed back (an INFO line, not "ERROR ... lost").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from chongming_redis.client.client import Client
from chongming_redis.model import TaskStatus
from chongming_redis.stores.redis import RedisTaskStore
from tests.support.pool_app import app as pool_app
from tests.support.redis_server import RedisProc
from tests.test_cli import APP, ROOT

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]


def start_parent(url: str, namespace: str, *options: str) -> subprocess.Popen[str]:
    """``worker --processes 2`` in a session of its own (its process group: a terminal's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    command = [sys.executable, "-m", "chongming_redis.cli", "worker", APP, f"--redis={url}",
               f"--namespace={namespace}", "--processes=2", "--worker-lease=2",
               *options]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip


def wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def alive(pid: int) -> bool:
    """Running, and not a zombie nobody reaped (an orphan's new parent may not reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def a_long_task_running(store: RedisTaskStore) -> str:
    handle = Client(store, app=pool_app).submit("work", {"ms": 60_000})
    wait_for("the task to run", lambda: store.get(handle.task_id).status is TaskStatus.RUNNING,
             30)  # fmt: skip
    return handle.task_id


def handed_back(store: RedisTaskStore, task_id: str) -> bool:
    """PENDING again by the worker's own write (RUNNING -> PENDING in its history), not found
    LOST after its lease ran out."""
    task = store.get(task_id)
    moves = [(t.from_status, t.to_status) for t in store.history(task_id)]
    back = (TaskStatus.RUNNING, TaskStatus.PENDING) in moves
    return task is not None and task.status is TaskStatus.PENDING and back


def test_children_end_and_hand_back_when_the_parent_is_killed(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    parent = start_parent(redis_proc.url, namespace, "--grace=2")
    children: list[psutil.Process] = []
    try:
        me = psutil.Process(parent.pid)
        children = wait_for("two children", lambda: len(c := me.children()) == 2 and c, 30)
        task_id = a_long_task_running(store)
        parent.kill()  # SIGKILL: no handler of the parent's runs
        parent.wait(timeout=10)
        wait_for("both children to exit", lambda: not any(alive(c.pid) for c in children), 20)
        # Each shut down as on a stop: the running task handed back, not left to its lease.
        wait_for("the task handed back", lambda: handed_back(store, task_id), 10)
        assert not store.pool_state()[0], "no member of the pool is left serving buckets"
    finally:
        for child in children:  # only the worker's (the session's servers are children too)
            if alive(child.pid):
                child.kill()
        parent.kill()
        parent.communicate(timeout=30)
        store.close()


def test_a_second_ctrl_c_under_processes_hands_back_at_once(
    redis_proc: RedisProc, namespace: str
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    parent = start_parent(redis_proc.url, namespace, "--grace=30")
    try:
        wait_for("two children", lambda: len(psutil.Process(parent.pid).children()) == 2, 30)
        task_id = a_long_task_running(store)
        began = time.monotonic()
        os.killpg(parent.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of it
        time.sleep(0.5)
        os.killpg(parent.pid, signal.SIGINT)  # the second: "now", not the 30 s grace
        _, err = parent.communicate(timeout=60)
        took = time.monotonic() - began
        assert parent.returncode == 0, err
        assert took < 20, f"the second Ctrl-C was not heard: {took:.1f}s\n{err}"
        assert "handing running tasks back now" in err
        assert handed_back(store, task_id)
        # Logged for what it is (before: "ERROR ... lost" while the task was PENDING).
        assert f"task {task_id} work handed back at shutdown: attempt 1 runs again (pending)" in err
        assert f"task {task_id} work lost" not in err
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.communicate(timeout=30)
        store.close()
