"""Workflows in the runtime (issue 28): ``submit(after=...)`` and ``client.workflow()`` on a real
in-process worker, on the in-memory reference and a real redis-server: a diamond's join runs
once after both branches with their results in ``ctx.parent_results()``; a failed parent's
descendants end ``STOPPED`` and never start; ``"run"`` runs the child after a failure; a
fan-out wider than one write's step is finished by the workers' release loop; a missing
parent and a store without dependencies are refused with nothing written; ``WAITING`` tasks
refuse a pause and take a stop. No timing assertions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from chongming_redis import App, Client, Controller, InMemoryTaskStore, RedisTaskStore, TaskStatus
from chongming_redis.errors import ParentNotFound
from chongming_redis.model import TaskQuery
from chongming_redis.runtime.config import ControllerConfig
from chongming_redis.stores.protocol import TaskStore
from tests.support.flaky_store import ProtocolOnlyStore

WAIT = 30.0
FAST = ControllerConfig(command_poll_interval=0.05, start_poll_interval=0.02,
                        reconcile_interval=0.2, progress_interval=0.05,
                        release_poll_interval=0.05, concurrency=4)  # fmt: skip
W, P, S, X = TaskStatus.WAITING, TaskStatus.PENDING, TaskStatus.SUCCEEDED, TaskStatus.STOPPED

app = App("workflows")
ran: list[tuple[str, Any]] = []


@app.task()
def step(ctx: Any, params: Any) -> Any:
    ran.append((ctx.task_id, ctx.parent_results()))
    if isinstance(params, dict) and params.get("fail"):
        raise ValueError("failed on purpose")
    return params


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[TaskStore]:
    ran.clear()
    if request.param == "memory":
        made: TaskStore = InMemoryTaskStore()
    else:
        proc = request.getfixturevalue("redis_proc")
        made = RedisTaskStore.from_url(proc.url, namespace=f"wf-{uuid.uuid4().hex[:10]}")
    yield made
    made.close()


@pytest.fixture
def worker(store: TaskStore) -> Iterator[Controller]:
    controller = Controller(store, app=app, config=FAST)
    controller.start()
    yield controller
    controller.shutdown(grace=2)


def wait_all_final(client: Client, ids: list[str]) -> dict[str, TaskStatus]:
    deadline = time.monotonic() + WAIT
    while True:
        found = {i: client.get(i) for i in ids}
        if all(s is not None and s.status.is_terminal for s in found.values()):
            return {i: s.status for i, s in found.items() if s is not None}
        if time.monotonic() > deadline:
            raise AssertionError({i: s and s.status for i, s in found.items()})
        time.sleep(0.02)


def exits(store: TaskStore, task_id: str) -> list[Any]:
    return [t for t in store.history(task_id) if t.from_status is W]


def test_a_diamond_runs_its_join_once_after_both_branches(
    store: TaskStore, worker: Controller
) -> None:
    client = Client(store, app=app)
    a = client.submit("step", {"n": "a"})
    b = client.submit("step", {"n": "b"}, after=[a])
    c = client.submit("step", {"n": "c"}, after=[a.task_id])
    d = client.submit("step", {"n": "d"}, after=[b, c])
    ids = [a.task_id, b.task_id, c.task_id, d.task_id]
    assert wait_all_final(client, ids) == dict.fromkeys(ids, S)
    order = [task_id for task_id, _ in ran]
    assert sorted(order) == sorted(ids)  # each ran once
    assert order.index(d.task_id) > max(order.index(b.task_id), order.index(c.task_id))
    assert order.index(a.task_id) < min(order.index(b.task_id), order.index(c.task_id))
    assert dict(ran)[d.task_id] == {b.task_id: {"n": "b"}, c.task_id: {"n": "c"}}
    assert dict(ran)[a.task_id] == {}
    for child in (b, c, d):
        assert len(exits(store, child.task_id)) == 1
    first = store.history(d.task_id)[0]
    assert first.to_status is W and first.reason is not None and b.task_id in first.reason


def test_a_failing_parent_stops_its_descendants_and_run_children_still_run(
    store: TaskStore, worker: Controller
) -> None:
    client = Client(store, app=app)
    bad = client.submit("step", {"fail": True}, retry=None)
    child = client.submit("step", {"n": "child"}, after=[bad])
    grandchild = client.submit("step", {"n": "grand"}, after=[child])
    anyway = client.submit("step", {"n": "anyway"}, after=[bad], on_parent_failure="run")
    ids = [bad.task_id, child.task_id, grandchild.task_id, anyway.task_id]
    final = wait_all_final(client, ids)
    assert final[bad.task_id] is TaskStatus.FAILED
    assert final[child.task_id] is X and final[grandchild.task_id] is X
    assert final[anyway.task_id] is S
    started = {task_id for task_id, _ in ran}
    assert child.task_id not in started and grandchild.task_id not in started
    assert dict(ran)[anyway.task_id] == {bad.task_id: None}
    reason = exits(store, child.task_id)[0].reason
    assert reason is not None and bad.task_id in reason


def test_a_workflow_is_one_pipeline_and_a_wide_fan_out_is_released_by_the_workers(
    store: TaskStore, worker: Controller
) -> None:
    client = Client(store, app=app)
    wf = client.workflow()
    root = wf.add("step", {"n": "root"})
    leaves = wf.group(*(("step", {"n": i}) for i in range(230)), after=[root])
    join = wf.add("step", {"n": "join"}, after=leaves)
    tail = wf.chain(("step", {"n": "t1"}), ("step", {"n": "t2"}), after=[join])
    handles = wf.submit()
    assert [h.task_id for h in handles] == [n.task_id for n in wf.nodes]
    ids = [n.task_id for n in wf.nodes]
    assert wait_all_final(client, ids) == dict.fromkeys(ids, S)
    assert sorted(task_id for task_id, _ in ran) == sorted(ids)  # each exactly once
    assert len(dict(ran)[join.task_id]) == 230
    listed = store.query(TaskQuery(pipeline_run_id=wf.pipeline_run_id))
    assert len(listed) == len(ids) == 234
    assert [task_id for task_id, _ in ran[-2:]] == [tail[0].task_id, tail[1].task_id]
    with pytest.raises(RuntimeError, match="submitted already"):
        wf.submit()


def test_a_missing_parent_is_refused_with_nothing_written(store: TaskStore) -> None:
    client = Client(store, app=app)
    with pytest.raises(ParentNotFound) as caught:
        client.submit("step", {}, after=["no-such-task"])
    assert caught.value.parent == "no-such-task"
    wf = client.workflow()
    first = wf.add("step", {})
    wf.add("step", {}, after=[first, "ghost"])
    with pytest.raises(ParentNotFound):
        wf.submit()
    assert sum(store.counts().values()) == 0
    with pytest.raises(TypeError, match="list of tasks"):
        client.submit("step", {}, after="abc")
    with pytest.raises(ValueError, match="'stop' or 'run'"):
        client.submit("step", {}, after=[first], on_parent_failure="ignore")
    assert sum(store.counts().values()) == 0


def test_a_store_without_dependencies_refuses_after() -> None:
    client = Client(ProtocolOnlyStore(InMemoryTaskStore()), app=app)
    parent = client.submit("step", {})
    with pytest.raises(TypeError, match="no DependenciesStore"):
        client.submit("step", {}, after=[parent])
    assert sum(client.store.counts().values()) == 1


def test_a_waiting_task_refuses_a_pause_and_takes_a_stop(store: TaskStore) -> None:
    client = Client(store, app=app)
    parent = client.submit("step", {})
    child = client.submit("step", {}, after=[parent])
    assert client.get(child.task_id).status is W  # type: ignore[union-attr]
    assert client.pause(child.task_id) == "waiting"
    assert client.resume(child.task_id) == "waiting"
    assert client.stop(child.task_id) == "stopped"
    assert client.get(child.task_id).status is X  # type: ignore[union-attr]
