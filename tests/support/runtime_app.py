"""A real worker process for the runtime tests: a ``Controller`` on the store at ``--url`` (any
store URL: ``redis://``, ``sqlite:///path``, ``postgresql://``; ``stores/urls.py``) that runs
``run_forever`` (SIGTERM/SIGINT shut it down)::

    python -m tests.support.runtime_app --url redis://127.0.0.1:PORT/0 --namespace NS \\
        --owner w1 --events /tmp/w1.jsonl [--fx-dir DIR] [--task-lease 2] [--concurrency 2] ...

Task types (``app``; the test process builds its pure-client ``Controller`` on the same app):

``steps``  ``{"steps": N, "sleep": S}``: N times ``ctx.checkpoint()``, then one side effect
           (an increment of the counter ``fx_key(namespace, task_id, attempt, owner)``: ``INCR``
           on a separate Redis client, or with ``--fx-dir`` one byte appended to that counter's
           file, ``FileCounters``, for a store that is not Redis), then ``sleep(S)``. Returns
           ``{"owner", "attempt", "steps", "fx_errors"}``.
``quick``  ``{"value": V}``: returns ``{"value": V, "owner", "attempt"}`` at once.

Events: one JSON line per event in ``--events``, flushed at once, so a killed or stopped worker's
file holds every line it wrote. ``hello`` (written before ``run_forever``) reports the pid, this
process's wall clock (``datetime.now``), the store's clock (``server_time``) and the measured clock
offset, which is how a test shows that a ``faketime`` skew really was in effect. ``task-start``,
``task-lost``, ``task-stopped``, ``task-end`` report what the task functions saw.

Clock skew: the tests run this module under libfaketime (``LD_PRELOAD`` + ``FAKETIME=+300s``
with ``FAKETIME_DONT_FAKE_MONOTONIC=1``). libfaketime 0.9.10 (Debian) mangles the absolute
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` that CPython 3.11's ``time.sleep`` uses:
EINVAL with ``DONT_FAKE_MONOTONIC``, a hang without it (wolfcw/libfaketime#426), and faking the
monotonic clock also hangs every ``threading`` wait. With ``RUNTIME_APP_SLEEP_VIA_WAIT=1`` this
module therefore replaces ``time.sleep`` (before ``redis`` imports it) by a wait on a
``threading.Event``, which uses the unfaked monotonic clock. Only sleeping changes; every clock
read (``datetime.now``, ``time.time``) still sees the skewed time.

Where libfaketime is not installed, ``RUNTIME_APP_SKEW_SECONDS=<n>`` simulates the skew
instead: the ``datetime`` that ``chongming_redis.runtime.clock`` (the runtime's only reader of
the wall clock) and the ``hello`` event see runs ``n`` seconds off. Weaker (a library reading
the clock elsewhere would not see it), so the tests prefer libfaketime and say which was used.
"""

from __future__ import annotations

import os
import threading
import time

SLEEP_ENV = "RUNTIME_APP_SLEEP_VIA_WAIT"
SKEW_ENV = "RUNTIME_APP_SKEW_SECONDS"


def _sleep_via_wait(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


if os.environ.get(SLEEP_ENV) == "1":
    time.sleep = _sleep_via_wait

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
from datetime import UTC, datetime, timedelta, tzinfo  # noqa: E402
from typing import IO, Any  # noqa: E402

import redis  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402
from redis.backoff import NoBackoff  # noqa: E402
from redis.retry import Retry  # noqa: E402

from chongming_redis.policy import RetryPolicy  # noqa: E402
from chongming_redis.runtime.app import App  # noqa: E402
from chongming_redis.runtime.context import TaskContext, TaskLost, TaskStopped  # noqa: E402
from chongming_redis.runtime.controller import Controller  # noqa: E402
from chongming_redis.stores.protocol import TaskStore  # noqa: E402
from chongming_redis.stores.urls import open_store_url  # noqa: E402

app = App("runtime-test")

#: Set by ``main``: the events file, the side-effect client and the namespace.
_state: dict[str, Any] = {}
_events_lock = threading.Lock()


def fx_key(namespace: str, task_id: str, attempt: int, owner: str) -> str:
    """The side-effect counter of one attempt of a task in one process (not a store key)."""
    return f"coord:{namespace}:fx:{task_id}:{attempt}:{owner}"


class FileCounters:
    """Side-effect counters in files of ``directory`` (for a store that is not Redis): ``incr``
    appends one byte (one ``O_APPEND`` write: concurrent processes never lose one), ``get``
    is the file's size. The same two calls as a ``redis.Redis``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key.replace("/", "_"))

    def incr(self, key: str) -> None:
        fd = os.open(self._path(key), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)

    def get(self, key: str) -> int:
        try:
            return os.path.getsize(self._path(key))
        except FileNotFoundError:
            return 0

    def close(self) -> None:
        pass


def emit(kind: str, **fields: Any) -> None:
    out: IO[str] | None = _state.get("events")
    if out is None:
        return
    record = {"event": kind, "pid": os.getpid(), "mono": time.monotonic(), **fields}
    with _events_lock:
        out.write(json.dumps(record, sort_keys=True, default=str) + "\n")
        out.flush()


class Steps(BaseModel):
    steps: int = Field(ge=1, le=1_000_000)
    sleep: float = Field(default=0.1, ge=0, le=10)


class Quick(BaseModel):
    value: int = 0


@app.task()
def steps(ctx: TaskContext, params: Steps) -> dict[str, Any]:
    emit("task-start", task_id=ctx.task_id, attempt=ctx.attempt, owner=ctx.owner)
    fx: redis.Redis | FileCounters | None = _state.get("fx")
    key = fx_key(_state.get("namespace", "?"), ctx.task_id, ctx.attempt, ctx.owner)
    fx_errors = 0
    try:
        for i in range(params.steps):
            ctx.checkpoint(current=i, total=params.steps)
            if fx is not None:
                try:
                    fx.incr(key)
                except (redis.RedisError, OSError) as exc:  # Redis down (the restart test)
                    fx_errors += 1
                    emit("fx-error", task_id=ctx.task_id, step=i, error=repr(exc))
            time.sleep(params.sleep)
        ctx.checkpoint(current=params.steps, total=params.steps)
    except TaskLost as exc:
        emit("task-lost", task_id=ctx.task_id, attempt=ctx.attempt, reason=str(exc))
        raise
    except TaskStopped:
        emit("task-stopped", task_id=ctx.task_id, attempt=ctx.attempt)
        raise
    emit("task-end", task_id=ctx.task_id, attempt=ctx.attempt, fx_errors=fx_errors)
    return {"owner": ctx.owner, "attempt": ctx.attempt, "steps": params.steps,
            "fx_errors": fx_errors}  # fmt: skip


@app.task()
def quick(ctx: TaskContext, params: Quick) -> dict[str, Any]:
    emit("task-end", task_id=ctx.task_id, attempt=ctx.attempt)
    return {"value": params.value, "owner": ctx.owner, "attempt": ctx.attempt}


def _simulate_skew(seconds: float) -> None:
    """The fallback for a missing libfaketime: skew the wall clock the runtime reads."""
    from chongming_redis.runtime import clock

    real, skew = datetime, timedelta(seconds=seconds)

    class SkewedDatetime(real):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> datetime:
            return real.now(tz) + skew

    clock.datetime = SkewedDatetime  # type: ignore[misc]
    globals()["datetime"] = SkewedDatetime


def retry_policy(max_attempts: int, delay: float) -> RetryPolicy:
    """Deterministic retries for the tests (no jitter)."""
    return RetryPolicy(max_attempts=max_attempts, base_delay=delay, max_delay=delay, jitter=0.0)


def build_controller(store: TaskStore, args: argparse.Namespace) -> Controller:
    return Controller(
        store,
        app=app,
        owner=args.owner,
        command_poll_interval=args.poll,
        command_lease=5.0,
        task_lease=args.task_lease,
        concurrency=args.concurrency,
        retry=retry_policy(args.max_attempts, args.retry_delay),
        start_poll_interval=args.poll,
        reconcile_interval=args.reconcile_interval,
        progress_interval=0.2,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.support.runtime_app")
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--events", required=True, help="JSON-lines file for events")
    parser.add_argument("--fx-dir", help="side-effect counters in files here (not in Redis)")
    parser.add_argument("--task-lease", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--reconcile-interval", type=float, default=0.5)
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--max-attempts", type=int, default=3)
    parser.add_argument("--retry-delay", type=float, default=0.2)
    parser.add_argument("--grace", type=float, default=1.0)
    parser.add_argument("--socket-timeout", type=float, default=2.0)
    parser.add_argument("--cluster", action="store_true", help="--url names a Redis Cluster node")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.environ.get(SKEW_ENV):
        _simulate_skew(float(os.environ[SKEW_ENV]))
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s {args.owner} %(threadName)s %(levelname)s %(name)s: %(message)s",
    )
    store: Any = open_store_url(
        args.url,
        namespace=args.namespace,
        redis_options={
            "socket_timeout": args.socket_timeout,
            "socket_connect_timeout": 1.0,
            "cluster": args.cluster,
        },
    )
    # The side effect goes through its own client without retries, so a Redis outage costs a
    # counted error, never a hidden double INCR (RELIABILITY fact 2).
    fx = (
        FileCounters(args.fx_dir)
        if args.fx_dir
        else redis.Redis.from_url(
            args.url, socket_timeout=1.0, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
        )
    )
    with open(args.events, "a", encoding="utf-8") as events:
        _state.update(events=events, fx=fx, namespace=args.namespace)
        controller = build_controller(store, args)
        controller.clock.sync()
        server = store.server_time()
        local = datetime.now(UTC)
        emit(
            "hello",
            owner=args.owner,
            local_now=local.timestamp(),
            time_time=time.time(),
            server_now=server.timestamp(),
            clock_offset=controller.clock.offset.total_seconds(),
            faketime=os.environ.get("FAKETIME"),
            simulated_skew=os.environ.get(SKEW_ENV),
        )
        try:
            # As a worker under a --processes parent: a repeat within 2 s is the same signal.
            controller.run_forever(grace=args.grace, same_signal_within=2.0)
        finally:
            emit("exit", owner=args.owner)
            store.close()
            fx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
