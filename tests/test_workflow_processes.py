"""Workflows run by real ``chongming-redis worker`` processes on every store (issue 28): a
diamond a → (b, c) → d whose branch b's worker is SIGKILLed while b runs (b is found LOST and
retried: not an end, so d keeps waiting), a failing parent whose descendants end ``STOPPED``
and never start, and a fan-out of 150 children with their join (wider than one write
releases: the workers' release loop finishes it). Checked from the stored histories: every
task leaves ``WAITING`` exactly once, no child starts before its parents' success is
recorded, the join runs once."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from chongming_redis.client.client import Client
from chongming_redis.embedded.workers import WorkerProcesses
from chongming_redis.model import TaskStatus, Transition
from tests.support.store_targets import WITH_CLUSTER, StoreTarget

ROOT = Path(__file__).resolve().parents[1]
W, R, S = TaskStatus.WAITING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED
#: Entry times are each worker's estimate of the server's clock (``ServerClock``): two workers'
#: estimates differ by up to about a round trip (CI met 1.5 ms), so a child's start is judged
#: against its parent's success less this (the stress checkers' ``TOLERANCE``).
CLOCKS = timedelta(milliseconds=250)


def wait_until(what: str, check: Any, timeout: float, logs: Any = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while (found := check()) is None or found is False:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{logs()}")
        time.sleep(0.05)
    return found


def entries(store: Any, task_id: str) -> list[Transition]:
    return store.history(task_id)


def first_start(history: list[Transition]) -> Any:
    return min((t.at for t in history if t.to_status is R), default=None)


def success_at(history: list[Transition]) -> Any:
    (done,) = [t.at for t in history if t.to_status is S]
    return done


@pytest.mark.slow
@pytest.mark.parametrize("target", WITH_CLUSTER, indirect=True)
def test_graphs_hold_across_a_sigkill_of_a_branchs_worker(
    target: StoreTarget, tmp_path: Path
) -> None:
    workers = WorkerProcesses("tests.support.workflow_app:app", target.url, target.namespace,
                              logdir=tmp_path, cwd=ROOT)  # fmt: skip
    options = ["--num-buckets=8", "--worker-lease=2", "--task-lease=2", "--grace=2",
               "--concurrency=4", *target.flags]  # fmt: skip
    store = target.open()
    client = Client(store)
    try:
        pids = [workers.spawn(options) for _ in range(2)]
        wait_until("both workers in the pool", lambda: len(store.pool_state()[0]) == 2, 30,
                   workers.logs)  # fmt: skip
        a = client.submit("node", {"name": "a"})
        b = client.submit("node", {"name": "b", "sleep": 3}, after=[a])
        c = client.submit("node", {"name": "c"}, after=[a])
        d = client.submit("node", {"name": "d"}, after=[b, c])
        bad = client.submit("node", {"name": "bad", "fail": True})
        lost = [client.submit("node", {"name": "x"}, after=[bad])]
        lost.append(client.submit("node", {"name": "y"}, after=[lost[0]]))
        wf = client.workflow()
        root = wf.add("node", {"name": "root"})
        fan = wf.group(*(("node", {"name": f"k{i}"}) for i in range(150)), after=[root])
        join = wf.add("node", {"name": "join"}, after=fan)
        wf.submit()
        running = wait_until("b to run", lambda: (s := store.get(b.task_id)) is not None
                             and s.status is R and s.lease_owner, 30, workers.logs)  # fmt: skip
        victim = next(p for p in pids if workers.owner(p) == running)
        workers.kill9(victim)
        workers.spawn(options)
        ids = [a, b, c, d, bad, *lost, root, *fan, join]
        wait_until("every task to finish",
                   lambda: all((s := store.get(t.task_id)) is not None
                               and s.status.is_terminal for t in ids), 90,
                   workers.logs)  # fmt: skip
    finally:
        workers.stop_all(timeout=15)
    status = {t.task_id: store.get(t.task_id).status for t in ids}
    assert [status[t.task_id] for t in (a, b, c, d, bad)] == [S, S, S, S, TaskStatus.FAILED]
    assert [status[t.task_id] for t in lost] == [TaskStatus.STOPPED] * 2
    assert all(status[n.task_id] is S for n in (root, *fan, join))
    history_b = entries(store, b.task_id)
    # b's first attempt was found LOST and retried (not an end): d waited for the second one
    assert any(t.to_status is TaskStatus.LOST for t in history_b), history_b
    assert len([t for t in history_b if t.to_status is R]) == 2, history_b
    for child, parents in ((b, [a]), (c, [a]), (d, [b, c]), (join, [root]), *(
            (k, [root]) for k in fan[:: 15])):  # fmt: skip
        history = entries(store, child.task_id)
        assert history[0].to_status is W
        assert len([t for t in history if t.from_status is W]) == 1, history
        started = first_start(history)
        assert started is not None
        for parent in parents:  # no child starts before its parents' success is recorded
            assert started >= success_at(entries(store, parent.task_id)) - CLOCKS, (child, parent)
    join_history = entries(store, join.task_id)
    assert len([t for t in join_history if t.to_status is R]) == 1
    for never in lost:  # a failed parent's descendants never start
        assert not [t for t in entries(store, never.task_id) if t.to_status is R]
    result = store.get(d.task_id).result
    assert result == {"name": "d", "saw": sorted([b.task_id, c.task_id])}
    store.close()
