"""``async def`` tasks (``runtime/task_loop.py``): run on the worker's event loop beside the thread
pool's tasks, each holding one slot of ``concurrency`` but no thread, with the awaitable
``ctx.acheckpoint()``; stop, pause/resume, lost leases and failures end them as they end plain
tasks. Also: the signature check at registration, the per-task log lines, and a real worker
process (``chongming-redis worker tests.support.async_app:app``) stopped from outside, its
task log lines on stderr.

On ``InMemoryTaskStore`` and a real redis-server, with the short timings of
``tests/test_controller.py``; every wait polls with a generous timeout, nothing is timed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from chongming_redis import InMemoryTaskStore, Progress, TaskStatus, Transition
from chongming_redis.runtime.app import App
from chongming_redis.runtime.context import TaskContext, TaskLost, TaskStopped
from chongming_redis.runtime.controller import Controller
from chongming_redis.stores.redis import RedisTaskStore
from tests.support import async_app
from tests.support.flaky_store import ALL, RecordingStore
from tests.support.redis_server import RedisProc
from tests.test_controller import (
    FAST,
    WAIT,
    assert_stays,
    chain,
    error_about,
    moves,
    wait_command_done,
    wait_history,
    wait_status,
    wait_until,
)

P, R, PA = TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.PAUSED
OK, FAILED, STOPPED = TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.STOPPED
ROOT = Path(__file__).resolve().parents[1]


class Numbers(BaseModel):
    count: int
    label: str = "x"


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, namespace: str) -> Iterator[Any]:
    if request.param == "memory":
        yield InMemoryTaskStore()
        return
    server: RedisProc = request.getfixturevalue("redis_proc")
    redis_store = RedisTaskStore.from_url(server.url, namespace=namespace)
    yield redis_store
    redis_store.close()


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """What waiting task functions poll; always set at teardown."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def make(store: Any, release: threading.Event) -> Iterator[Callable[..., Controller]]:
    """``make(backing=None, **options)``: a controller with the FAST timings (not started);
    every started one is shut down at teardown."""
    made: list[Controller] = []

    def factory(backing: Any = None, **options: Any) -> Controller:
        controller = Controller(backing if backing is not None else store, **{**FAST, **options})
        made.append(controller)
        return controller

    yield factory
    release.set()
    for controller in made:
        if controller._running.is_set():
            controller.shutdown(grace=0, hand_back="stop")


async def until(event: threading.Event, timeout: float = WAIT) -> None:
    """Await a thread's event without blocking the loop."""
    deadline = time.monotonic() + timeout
    while not event.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)


# -- running ----------------------------------------------------------------------------------


def test_an_async_task_runs_on_the_event_loop_and_its_result_is_stored(
    store: Any, make: Any
) -> None:
    worker = make()
    seen: dict[str, str] = {}

    @worker.task()
    async def double(ctx: TaskContext, params: Numbers) -> dict[str, Any]:
        await asyncio.sleep(0)
        seen["thread"] = threading.current_thread().name
        return {"doubled": params.count * 2, "label": params.label}

    worker.start()
    task_id = worker.submit("double", {"count": 21})
    done = wait_status(store, task_id, OK)
    assert (done.result, done.failure) == ({"doubled": 42, "label": "x"}, None)
    assert moves(wait_history(store, task_id, 3)) == chain(P, R, OK)
    assert seen["thread"] == f"{worker.owner}-loop"


def test_async_and_sync_tasks_run_side_by_side_in_one_worker(store: Any, make: Any) -> None:
    worker = make(concurrency=2)
    sync_running, async_running = threading.Event(), threading.Event()

    @worker.task()
    def blocking(ctx: TaskContext, params: Any) -> str:
        sync_running.set()
        return "sync" if async_running.wait(WAIT) else "alone"

    @worker.task()
    async def awaiting(ctx: TaskContext, params: Any) -> str:
        async_running.set()
        await until(sync_running)
        return "async" if sync_running.is_set() else "alone"

    worker.start()
    ids = [worker.submit("blocking"), worker.submit("awaiting")]
    assert [wait_status(store, task_id, OK).result for task_id in ids] == ["sync", "async"]


def test_more_tasks_than_slots_all_finish_and_never_more_than_concurrency_run_at_once(
    store: Any, make: Any
) -> None:
    worker = make(concurrency=3)
    lock = threading.Lock()
    running, peak = [0], [0]

    def enter() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])

    def leave() -> None:
        with lock:
            running[0] -= 1

    @worker.task()
    async def hop(ctx: TaskContext, params: Any) -> str:
        enter()
        try:
            for step in range(3):
                await ctx.acheckpoint(current=step, total=3)
                await asyncio.sleep(0.005)
        finally:
            leave()
        return "async"

    @worker.task()
    def walk(ctx: TaskContext, params: Any) -> str:
        enter()
        try:
            time.sleep(0.01)
        finally:
            leave()
        return "sync"

    worker.start()
    ids = worker.submit_many("hop", [None] * 24) + worker.submit_many("walk", [None] * 8)
    results = [wait_status(store, task_id, OK).result for task_id in ids]
    assert results == ["async"] * 24 + ["sync"] * 8
    assert 1 <= peak[0] <= 3


def test_many_async_tasks_run_at_once_on_the_loop_without_a_thread_each(
    store: Any, make: Any
) -> None:
    worker = make(concurrency=16)
    running = [0]  # touched on the loop thread only
    threads_when_all_ran: list[list[str]] = []

    @worker.task()
    async def meet(ctx: TaskContext, params: Any) -> int:
        running[0] += 1
        if running[0] == 16:  # all sixteen are inside their function, none has ended
            threads_when_all_ran.append(
                [t.name for t in threading.enumerate() if t.name.startswith(f"{ctx.owner}-task")]
            )
        deadline = time.monotonic() + WAIT
        while running[0] < 16 and time.monotonic() < deadline:
            await ctx.acheckpoint()
            await asyncio.sleep(0.005)
        return running[0]

    worker.start()
    ids = worker.submit_many("meet", [None] * 16)
    assert [wait_status(store, task_id, OK).result for task_id in ids] == [16] * 16
    assert threads_when_all_ran == [[]]  # sixteen running tasks, no pool thread


def test_an_async_task_holds_its_slot_so_a_task_started_behind_it_waits(make: Any) -> None:
    store = InMemoryTaskStore()
    worker = make(store, concurrency=1, prefetch=2)
    window = worker.runner._window
    window.ran(0.00001)
    window.round_trip(1.0)  # the window forced open: one more task is started and waits
    gate, ran = threading.Event(), []

    @worker.task()
    async def block(ctx: TaskContext, params: Any) -> None:
        ran.append(ctx.task_id)
        await until(gate)

    @worker.task()
    def quick(ctx: TaskContext, params: Any) -> None:
        ran.append(ctx.task_id)

    worker.start()
    blocker = worker.submit("block")
    wait_until(lambda: ran == [blocker], what="the async blocker to run")
    waiting = worker.submit("quick")
    wait_status(store, waiting, R)  # started (prefetched), its function not begun
    assert_stays(lambda: ran == [blocker], 0.3, "a task began while the slot was busy")
    gate.set()
    wait_status(store, waiting, OK)
    assert ran == [blocker, waiting]


# -- checkpoints ------------------------------------------------------------------------------


def test_acheckpoint_progress_and_the_heartbeat_reach_the_store(
    store: Any, make: Any, release: threading.Event
) -> None:
    worker = make()

    @worker.task()
    async def report(ctx: TaskContext, params: Any) -> str:
        await ctx.acheckpoint(current=3, total=10, message="three of ten")
        await until(release)
        return "done"

    worker.start()
    task_id = worker.submit("report")
    running = wait_until(
        lambda: (s := store.get(task_id)).progress is not None and s.heartbeat_at and s,
        what="progress in the store",
    )
    assert running.status is R
    assert running.progress == Progress(3, 10, "three of ten")
    release.set()
    assert wait_status(store, task_id, OK).progress == Progress(3, 10, "three of ten")


def test_the_blocking_checkpoint_is_refused_on_the_event_loop_but_works_in_a_thread(
    store: Any, make: Any
) -> None:
    worker = make()

    @worker.task()
    async def wrong(ctx: TaskContext, params: Any) -> None:
        ctx.checkpoint(current=1)  # would block every task on the loop during a pause

    @worker.task()
    async def offloaded(ctx: TaskContext, params: Any) -> str:
        await asyncio.to_thread(ctx.checkpoint, current=1)  # a thread may block
        return "ok"

    worker.start()
    failed = wait_status(store, worker.submit("wrong"), FAILED)
    assert failed.failure.error_type == "RuntimeError"
    assert "await ctx.acheckpoint()" in failed.failure.message
    assert wait_status(store, worker.submit("offloaded"), OK).result == "ok"


# -- control ----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["acheckpoint", "sleep"])
def test_a_stop_sent_by_another_process_ends_an_async_task_stopped(
    store: Any, make: Any, where: str
) -> None:
    """``acheckpoint``: the task checks in without ever yielding to the loop otherwise, so the
    stop reaches it as ``TaskStopped``; ``sleep``: it awaits ``asyncio.sleep(60)`` and the stop
    cancels it."""
    app = App()
    seen: dict[str, str] = {}

    @app.task()
    async def wait_for_stop(ctx: TaskContext, params: Any) -> str:
        try:
            await ctx.acheckpoint(current=1, message="waiting")
            if where == "sleep":
                await asyncio.sleep(60)
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:
                await ctx.acheckpoint()
                time.sleep(0.002)  # never yields: only acheckpoint can end it
        except TaskStopped:
            seen["how"] = "TaskStopped"
            raise
        except asyncio.CancelledError:
            seen["how"] = "cancelled"
            raise
        return "not stopped"

    worker = make(app=app, owner="holder")
    client = make(app=app, owner="client")  # never started: a pure client
    worker.start()
    task_id = client.submit("wait_for_stop")
    wait_until(lambda: store.get(task_id).progress is not None, what="the task to check in")
    sent = client.stop(task_id)
    assert sent.startswith("sent:")
    stopped = wait_status(store, task_id, STOPPED)
    assert (stopped.result, stopped.failure) == (None, None)
    assert wait_command_done(store, sent.removeprefix("sent:")).outcome == "stopped"
    assert moves(wait_history(store, task_id, 3)) == chain(P, R, STOPPED)
    assert seen["how"] == {"acheckpoint": "TaskStopped", "sleep": "cancelled"}[where]


def test_a_paused_async_task_waits_at_acheckpoint_while_the_others_keep_running(
    store: Any, make: Any
) -> None:
    app = App()
    counts = {"a": 0, "b": 0}

    @app.task()
    async def count(ctx: TaskContext, params: dict[str, str]) -> int:
        key = params["key"]
        while True:
            counts[key] += 1
            await ctx.acheckpoint(current=counts[key])
            await asyncio.sleep(0.005)

    worker = make(app=app, owner="holder", concurrency=2)
    client = make(app=app, owner="client")
    worker.start()
    a, b = client.submit("count", {"key": "a"}), client.submit("count", {"key": "b"})
    wait_until(lambda: min(counts.values()) > 5, what="both tasks to count")

    sent = client.pause(a)
    wait_status(store, a, PA)
    assert wait_command_done(store, sent.removeprefix("sent:")).outcome == "paused"
    at_pause, b_at_pause = counts["a"], counts["b"]
    assert_stays(lambda: counts["a"] <= at_pause + 1, 0.5, "a paused task must not advance")
    assert counts["b"] > b_at_pause + 5  # the loop kept running the other task

    sent = client.resume(a)
    wait_status(store, a, R)
    wait_until(lambda: counts["a"] > at_pause + 5, what="the resumed task to count again")

    for task_id in (a, b):
        client.stop(task_id)
    for task_id in (a, b):
        wait_status(store, task_id, STOPPED)
    assert moves(wait_history(store, a, 5)) == chain(P, R, PA, R, STOPPED)
    assert moves(wait_history(store, b, 3)) == chain(P, R, STOPPED)


@pytest.mark.parametrize("where", ["acheckpoint", "sleep"])
def test_a_lost_lease_ends_an_async_task_and_nothing_is_written_after(
    store: Any, make: Any, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Another writer moves the task on (as a reconciler would after the lease ran out): the
    worker's next fenced touch finds the version changed. ``acheckpoint`` raises ``TaskLost``;
    a task awaiting ``asyncio.sleep(60)`` is cancelled. Nothing of the worker lands after."""
    caplog.set_level(logging.ERROR, logger="chongming_redis.runtime")
    recording = RecordingStore(store)
    worker = make(recording)
    seen: dict[str, str] = {}

    @worker.task()
    async def busy(ctx: TaskContext, params: Any) -> str:
        try:
            await ctx.acheckpoint(current=1)
            if where == "sleep":
                await asyncio.sleep(60)
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:
                await ctx.acheckpoint()
                time.sleep(0.002)  # never yields: only acheckpoint can end it
        except TaskLost:
            seen["how"] = "TaskLost"
            raise
        except asyncio.CancelledError:
            seen["how"] = "cancelled"
            raise
        return "never"

    worker.start()
    task_id = worker.submit("busy")
    running = wait_status(store, task_id, R)
    wait_history(store, task_id, 2)
    now = store.server_time()
    intruder = dataclasses.replace(running, status=STOPPED, status_version=3, updated_at=now)
    store.save(intruder, expect_version=2)  # a second writer
    store.append(Transition(task_id, 3, R, STOPPED, now, "intruder"))

    wait_until(lambda: "how" in seen, what="the task to see the loss")
    assert seen["how"] == {"acheckpoint": "TaskLost", "sleep": "cancelled"}[where]
    wait_until(lambda: task_id not in worker.held, what="the worker to drop the task")
    after = store.get(task_id)
    assert (after.status, after.status_version, after.result) == (STOPPED, 3, None)
    assert moves(store.history(task_id)) == chain(P, R, STOPPED)
    assert len(recording.calls_of("save", task_id)) == 1  # the start; nothing after
    # The line is written as the run ends, which may come just after the task is dropped.
    wait_until(lambda: any(f"task {task_id} busy lost" in m for m in error_about(caplog, task_id)),
               what="the task's 'lost' line")  # fmt: skip


def test_a_sleeping_async_task_whose_lease_cannot_be_renewed_is_cancelled_by_its_deadline(
    store: Any, make: Any
) -> None:
    """The store is unreachable: nobody tells the task it is lost, but its own lease deadline
    (80 % of the lease after the last renewal) passes, and the loop's sweep cancels it."""
    partitioned = RecordingStore(store, failing=ALL)
    worker = make(partitioned, reconcile_interval=3600.0)  # its own reconciler stays out
    cancelled = threading.Event()

    @worker.task()
    async def sleeper(ctx: TaskContext, params: Any) -> str:
        try:
            await ctx.acheckpoint(current=1)
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "woke"

    worker.start()
    task_id = worker.submit("sleeper")
    wait_until(lambda: store.get(task_id).progress is not None, what="the task to sleep")
    partitioned.down = True
    wait_until(cancelled.is_set, what="the task to be cancelled")
    wait_until(lambda: task_id not in worker.held, what="the worker to drop the task")
    partitioned.down = False
    assert_stays(lambda: len(partitioned.calls_of("save", task_id)) == 1, 0.3, "a late save")
    assert store.get(task_id).status is R  # nothing written; a reconciler makes it LOST


def test_shutdown_cancels_a_sleeping_async_task_and_hands_it_back(store: Any, make: Any) -> None:
    worker = make()
    cancelled = threading.Event()

    @worker.task()
    async def sleeper(ctx: TaskContext, params: Any) -> str:
        try:
            await ctx.acheckpoint(current=1)
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "woke"

    worker.start()
    task_id = worker.submit("sleeper")
    wait_until(lambda: store.get(task_id).progress is not None, what="the task to sleep")
    worker.shutdown(grace=0.2)
    after = store.get(task_id)
    assert (after.status, after.attempt) == (P, 1)  # handed back: the same attempt runs again
    assert cancelled.is_set()


# -- failures ---------------------------------------------------------------------------------


def test_an_async_task_that_raises_is_failed_with_its_traceback(store: Any, make: Any) -> None:
    worker = make()

    @worker.task()
    async def explode(ctx: TaskContext, params: Any) -> None:
        await asyncio.sleep(0)
        raise ValueError("bad width")

    @worker.task()
    async def give_up(ctx: TaskContext, params: Any) -> None:
        raise asyncio.CancelledError  # not a stop: a failure like any other

    worker.start()
    task_id = worker.submit("explode")
    failure = wait_status(store, task_id, FAILED).failure
    assert (failure.error_type, failure.message) == ("ValueError", "bad width")
    assert "in explode" in failure.traceback
    assert 'raise ValueError("bad width")' in failure.traceback
    assert moves(wait_history(store, task_id, 3)) == chain(P, R, FAILED)
    gave_up = wait_status(store, worker.submit("give_up"), FAILED)
    assert gave_up.failure.error_type == "CancelledError"


def test_registration_refuses_a_function_that_cannot_take_ctx_and_params() -> None:
    app = App()

    def one(ctx: TaskContext) -> None: ...

    async def three(ctx: TaskContext, params: Any, extra: Any) -> None: ...

    async def flexible(ctx: TaskContext, params: Any, extra: Any = None) -> None: ...

    for wrong in (one, three):
        with pytest.raises(TypeError, match=r"must accept \(ctx, params\)"):
            app.task()(wrong)
    assert app.types == {}
    app.task()(flexible)
    assert app.types["flexible"].is_async


def test_registration_refuses_an_async_task_in_a_child_process() -> None:
    app = App()

    async def crunch(ctx: TaskContext, params: Any) -> None: ...

    with pytest.raises(ValueError, match="async"):
        app.task(isolation="process")(crunch)
    assert app.types == {}


# -- log lines --------------------------------------------------------------------------------


def test_each_task_logs_one_line_when_it_starts_and_one_when_it_ends(
    store: Any, make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="chongming_redis.runtime.tasks")
    worker = make()

    @worker.task()
    def resize(ctx: TaskContext, params: Any) -> str:
        return "ok"

    @worker.task()
    async def explode(ctx: TaskContext, params: Any) -> None:
        raise ValueError("bad width")

    @worker.task()
    async def nap(ctx: TaskContext, params: Any) -> None:
        await ctx.acheckpoint(current=1)
        await asyncio.sleep(60)

    worker.start()
    ok, bad, napping = (worker.submit(name) for name in ("resize", "explode", "nap"))
    wait_status(store, ok, OK)
    wait_status(store, bad, FAILED)
    wait_until(lambda: store.get(napping).progress is not None, what="the nap to begin")
    assert worker.stop(napping) == "stopping"
    wait_status(store, napping, STOPPED)

    lines = [(r.levelno, r.getMessage()) for r in caplog.records
             if r.name == "chongming_redis.runtime.tasks"]  # fmt: skip
    expected = [
        (logging.INFO, rf"task {ok} resize started \(attempt 1\)"),
        (logging.INFO, rf"task {ok} resize succeeded in \d+\.\d ms"),
        (logging.INFO, rf"task {bad} explode started \(attempt 1\)"),
        (logging.WARNING, rf"task {bad} explode failed in \d+\.\d ms: ValueError: bad width"),
        (logging.INFO, rf"task {napping} nap started \(attempt 1\)"),
        (logging.INFO, rf"task {napping} nap stopped in \d+\.\d ms"),
    ]
    for level, pattern in expected:
        assert [m for lv, m in lines if lv == level and re.fullmatch(pattern, m)], (pattern, lines)
    assert len(lines) == len(expected)


# -- a real worker process --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(120)
def test_a_worker_process_runs_async_tasks_and_a_stop_from_outside_ends_them(
    redis_proc: RedisProc, namespace: str, tmp_path: Path
) -> None:
    store = RedisTaskStore.from_url(redis_proc.url, namespace=namespace)
    client = Controller(store, app=async_app.app, owner="client")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_")}
    stderr_path = tmp_path / "worker.stderr"
    with stderr_path.open("wb") as err:
        worker = subprocess.Popen(
            [sys.executable, "-m", "chongming_redis.cli", "worker", "tests.support.async_app:app",
             f"--redis={redis_proc.url}", f"--namespace={namespace}", "--concurrency=3",
             "--task-lease=5", "--grace=5", "--log-level=INFO"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        nap = client.submit("nap", {"seconds": 60})
        tick = client.submit("tick")
        echo = client.submit("echo", {"value": 7})
        plain = client.submit("plain", {"value": 8})
        assert wait_status(store, echo, OK, timeout=60).result == {"value": 7}
        assert wait_status(store, plain, OK, timeout=60).result == {"value": 8}
        wait_until(lambda: (s := store.get(nap)).progress is not None
                   and s.progress.message == "napping", 60, "the nap to begin")  # fmt: skip
        wait_until(lambda: (s := store.get(tick)).progress is not None
                   and s.progress.current > 3, 60, "the ticker to tick")  # fmt: skip

        sent = [client.stop(task_id) for task_id in (nap, tick)]
        for task_id, command in zip((nap, tick), sent):
            assert command.startswith("sent:")
            stopped = wait_status(store, task_id, STOPPED)
            assert stopped.failure is None
            assert wait_command_done(store, command.removeprefix("sent:")).outcome == "stopped"
            assert moves(wait_history(store, task_id, 3)) == chain(P, R, STOPPED)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        client.notifier.close()
        store.close()
    logged = stderr_path.read_text(errors="replace")
    assert worker.returncode == 0, logged[-4000:]
    for pattern in (rf"task {echo} echo succeeded in \d+\.\d ms", rf"task {nap} nap stopped in "):
        assert re.search(pattern, logged), logged[-4000:]
