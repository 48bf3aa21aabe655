"""``Client``: what a producer needs — submit tasks, wait for their results, stop, pause,
resume or retry them, and read them — without running a worker.

    client = Client.from_url("redis://127.0.0.1:6379/0", namespace="app", app=app)
    handle = client.submit("resize", {"width": 640})     # or resize.submit(client, width=640)
    handle.wait(timeout=10.0)     # the result, or TaskFailed / TaskStopped / TaskLost
    client.stop(handle.task_id)   # "stopped": the outcome, once the holder acted

A client never claims commands (that would take them from the tasks' holders). A stop, pause
or resume of a task nobody holds (``PENDING``, or paused before it ran) is a compare-and-set
by the client itself, with its history entry; one for a running task is a command for its
holder, nudged at once, whose outcome the client waits for.
"""

from __future__ import annotations

import builtins
import math
import os
import secrets
import time
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from chongming_redis.model import (
    Command,
    CommandKind,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Transition,
)
from chongming_redis.runtime import submission
from chongming_redis.runtime.app import App, TaskType
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.clock import ServerClock
from chongming_redis.runtime.held import advance
from chongming_redis.runtime.notify import WORK, LocalNotifier, RedisNotifier
from chongming_redis.runtime.store_adapter import StoreAdapter
from chongming_redis.stores.protocol import TaskStore
from chongming_redis.validation import check_identifier

__all__ = ["Client", "CommandTimeout", "TaskHandle", "TaskNotFinished", "TaskNotFound"]

#: How often a compare-and-set on a task nobody holds is tried again when it meets a change
#: (a worker started it meanwhile: then the command goes to that worker).
_CONTROL_ROUNDS = 5


class TaskNotFound(LookupError):
    """No task with this id in the namespace (never submitted, or pruned)."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        super().__init__(f"no task {task_id!r}")


class TaskNotFinished(TimeoutError):
    """``wait`` ran out of time (or ``result`` was asked of a task still under way);
    ``snapshot``: the task as last read."""

    def __init__(self, snapshot: TaskSnapshot, waited: float) -> None:
        self.task_id = snapshot.task_id
        self.snapshot = snapshot
        state = snapshot.status.value
        after = f" after {waited:.1f}s" if waited > 0 else ""
        super().__init__(f"task {snapshot.task_id!r} is still {state}{after}")


class CommandTimeout(TimeoutError):
    """No holder answered a stop/pause/resume in time. The command stays queued and is
    applied when the task's holder (or any worker, for a task nobody holds) gets to it."""

    def __init__(self, command: Command, waited: float) -> None:
        self.command_id = command.command_id
        self.task_id = command.task_id
        super().__init__(
            f"{command.kind.value} of task {command.task_id!r}: no answer after {waited:.1f}s; "
            f"command {command.command_id} stays queued for the task's holder"
        )


class TaskHandle:
    """A submitted task: its id, and shortcuts to the client's calls about it."""

    def __init__(self, client: Client, task_id: str) -> None:
        self.client = client
        self.task_id = task_id

    def wait(self, timeout: float | None = None) -> Any:
        return self.client.wait(self.task_id, timeout=timeout)

    def result(self) -> Any:
        return self.client.result(self.task_id)

    def get(self) -> TaskSnapshot | None:
        return self.client.get(self.task_id)

    def history(self) -> list[Transition]:
        return self.client.history(self.task_id)

    def stop(self, *, wait: bool = True, timeout: float = 30.0) -> str:
        return self.client.stop(self.task_id, wait=wait, timeout=timeout)

    def pause(self, *, wait: bool = True, timeout: float = 30.0) -> str:
        return self.client.pause(self.task_id, wait=wait, timeout=timeout)

    def resume(self, *, wait: bool = True, timeout: float = 30.0) -> str:
        return self.client.resume(self.task_id, wait=wait, timeout=timeout)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskHandle) and other.task_id == self.task_id

    def __hash__(self) -> int:
        return hash(self.task_id)

    def __repr__(self) -> str:
        return f"TaskHandle({self.task_id!r})"


class Client:
    def __init__(
        self,
        store: TaskStore,
        *,
        app: App | None = None,
        num_buckets: int | None = None,
        name: str | None = None,
        owns_store: bool = False,
    ) -> None:
        """``app``: validate parameters against its task types (and refuse unknown names);
        without one, parameters are stored as given. ``num_buckets``: the namespace's bucket
        count (default: the one its workers recorded, else 64). ``name``: written into the
        history as who submitted or controlled a task."""
        if not isinstance(store, TaskStore):
            raise TypeError(f"store must implement TaskStore, not {type(store).__name__}")
        self.store = store
        self.app = app
        self.name = check_identifier(name or f"client-{os.uname().nodename}-{os.getpid()}",
                                     "name")  # fmt: skip
        self.adapter = StoreAdapter(store, owner=self.name)
        self.clock = ServerClock(self.adapter)
        self._num_buckets = None if num_buckets is None else BucketPolicy(num_buckets).num_buckets
        self._buckets: BucketPolicy | None = None
        self._owns_store = owns_store
        self._notifier: RedisNotifier | LocalNotifier | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "default",
        app: App | None = None,
        num_buckets: int | None = None,
        name: str | None = None,
        **store_options: Any,
    ) -> Client:
        """A client on the Redis at ``url`` (``redis://``, ``rediss://``, ``unix://``);
        ``store_options`` go to ``RedisTaskStore.from_url`` (timeouts, retries)."""
        from chongming_redis.stores.redis import RedisTaskStore

        store = RedisTaskStore.from_url(url, namespace=namespace, **store_options)
        return cls(store, app=app, num_buckets=num_buckets, name=name, owns_store=True)

    # -- submitting ------------------------------------------------------------------------

    def submit(
        self,
        task: str | TaskType,
        params: Any = None,
        *,
        key: str | None = None,
        tags: Iterable[str] = (),
        task_id: str | None = None,
        pipeline_run_id: str | None = None,
        delay: float | timedelta | None = None,
        not_before: datetime | None = None,
    ) -> TaskHandle:
        """Create one ``PENDING`` task; validated (name, parameters, options) before anything
        is written. ``delay`` (seconds) or ``not_before``: no worker starts it earlier."""
        name, task_type = submission.resolve(self.app, task)
        now = self.clock.now()
        spec = submission.NewTask(name, params, key=key, tags=tags, task_id=task_id,
                                  pipeline_run_id=pipeline_run_id,
                                  not_before=_not_before(now, delay, not_before))  # fmt: skip
        snapshot, transition = submission.new_task(spec, task_type, now=now,
                                                   buckets=self._bucket_policy(),
                                                   submitted_by=self.name)  # fmt: skip
        (error,) = self.adapter.commit([(snapshot, None, [transition])], best_effort_history=True)
        if error is not None:
            raise error
        self._nudge(WORK)
        return TaskHandle(self, snapshot.task_id)

    def submit_many(
        self,
        task: str | TaskType,
        params_list: Iterable[Any],
        *,
        tags: Iterable[str] = (),
        pipeline_run_id: str | None = None,
        delay: float | timedelta | None = None,
    ) -> builtins.list[TaskHandle]:
        """One task per parameter set (on Redis, 100 per round trip). Every set is validated
        before anything is written; an empty list writes nothing."""
        name, task_type = submission.resolve(self.app, task)
        now = self.clock.now()
        when = _not_before(now, delay, None)
        buckets, tag_set = self._bucket_policy(), frozenset(tags)
        prepared = [
            submission.new_task(submission.NewTask(name, params, tags=tag_set,
                                                   pipeline_run_id=pipeline_run_id,
                                                   not_before=when),
                                task_type, now=now, buckets=buckets, submitted_by=self.name)
            for params in params_list
        ]  # fmt: skip
        if not prepared:
            return []
        items = [(snapshot, None, [transition]) for snapshot, transition in prepared]
        errors = self.adapter.commit(items, best_effort_history=True)
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise error
        self._nudge(WORK)
        return [TaskHandle(self, snapshot.task_id) for snapshot, _ in prepared]

    def handle(self, task_id: str) -> TaskHandle:
        """A handle for a task submitted elsewhere (nothing is read)."""
        return TaskHandle(self, check_identifier(task_id, "task_id"))

    # -- waiting ---------------------------------------------------------------------------

    def wait(self, task_id: str, timeout: float | None = None) -> Any:
        """Block until the task finishes; its result. Raises ``TaskFailed`` (with the stored
        failure), ``TaskStopped``, ``TaskLost`` (no attempt left), ``TaskNotFound``, or
        ``TaskNotFinished`` after ``timeout`` seconds (``None``: no limit)."""
        check_identifier(task_id, "task_id")
        deadline = _deadline(timeout)
        began = time.monotonic()
        ended_at: float | None = None  # when it was first read FAILED / LOST
        for attempt in range(1_000_000_000):
            snapshot = self.get(task_id)
            if snapshot is None:
                raise TaskNotFound(task_id)
            now = time.monotonic()
            if snapshot.status in (TaskStatus.SUCCEEDED, TaskStatus.STOPPED):
                return submission.outcome(snapshot)
            if snapshot.status in (TaskStatus.FAILED, TaskStatus.LOST):
                ended_at = now if ended_at is None else ended_at
                if now - ended_at >= submission.RETRY_GRACE:  # no new attempt came
                    return submission.outcome(snapshot)
            else:
                ended_at = None
            if now >= deadline:
                if snapshot.status.is_terminal:
                    return submission.outcome(snapshot)
                raise TaskNotFinished(snapshot, now - began)
            time.sleep(min(submission.backoff(attempt), max(0.0, deadline - now)))
        raise AssertionError("unreachable")

    def result(self, task_id: str) -> Any:
        """A finished task's result now (``TaskNotFinished`` while it is under way; the
        ``TaskOutcome`` of one that ended without a result)."""
        return self.wait(task_id, timeout=0)

    # -- reading ---------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskSnapshot | None:
        return self.store.get(task_id)

    def list(self, query: TaskQuery | None = None, **filters: Any) -> builtins.list[TaskSnapshot]:
        """Tasks matching a ``TaskQuery`` (or its fields as keywords: ``statuses=``,
        ``name=``, ``tag=``, ``limit=``, ``newest_first=``, ...)."""
        if query is not None and filters:
            raise TypeError("pass a TaskQuery or its fields as keywords, not both")
        return self.store.query(query if query is not None else TaskQuery(**filters))

    def stats(self) -> dict[TaskStatus, int]:
        return self.store.counts()

    def history(self, task_id: str) -> builtins.list[Transition]:
        return self.store.history(task_id)

    # -- control ---------------------------------------------------------------------------

    def stop(self, task_id: str, *, wait: bool = True, timeout: float = 30.0) -> str:
        """Stop a task; returns the outcome (``"stopped"``, ``"already-terminal"``,
        ``"no-such-task"``; ``"sent:<command id>"`` with ``wait=False`` for a running task).
        A running task's holder stops it at its next checkpoint; the outcome comes when it
        has really ended (``CommandTimeout`` after ``timeout`` seconds)."""
        return self._control(task_id, CommandKind.STOP, wait, timeout)

    def pause(self, task_id: str, *, wait: bool = True, timeout: float = 30.0) -> str:
        """Pause a task (``"paused"``, ``"already-paused"``, ...); see ``stop``."""
        return self._control(task_id, CommandKind.PAUSE, wait, timeout)

    def resume(self, task_id: str, *, wait: bool = True, timeout: float = 30.0) -> str:
        """Resume a paused task (``"resumed"``, ``"not-paused"``, ...); see ``stop``."""
        return self._control(task_id, CommandKind.RESUME, wait, timeout)

    def retry(self, task_id: str) -> TaskHandle:
        """A new attempt of a ``FAILED``, ``STOPPED`` or ``LOST`` task, ``PENDING`` now
        (``ValueError`` for a task in any other status, ``TaskNotFound``)."""
        for _ in range(_CONTROL_ROUNDS):
            snapshot = self.get(task_id)
            if snapshot is None:
                raise TaskNotFound(task_id)
            new, transition = submission.retried(snapshot, self.clock.now(), self.name)
            (conflict,) = self.adapter.commit([(new, snapshot.status_version, [transition])],
                                              best_effort_history=True)  # fmt: skip
            if conflict is None:
                self._nudge(WORK)
                return TaskHandle(self, task_id)
        raise RuntimeError(f"task {task_id!r} kept changing; not retried")

    def _control(self, task_id: str, kind: CommandKind, wait: bool, timeout: float) -> str:
        check_identifier(task_id, "task_id")
        _check_timeout(timeout)
        for _ in range(_CONTROL_ROUNDS):
            snapshot = self.get(task_id)
            if snapshot is None:
                return "no-such-task"
            if snapshot.status.is_terminal:
                return "already-terminal"
            if submission.is_unheld(snapshot):
                outcome = self._control_unheld(snapshot, kind)
                if outcome is not None:
                    return outcome
                continue  # it changed under us (a worker started it): look again
            outcome = self._command(snapshot, kind, wait, timeout)
            if outcome != "conflict-retry":
                return outcome
        raise RuntimeError(f"task {task_id!r} kept changing; {kind.value} not applied")

    def _control_unheld(self, snapshot: TaskSnapshot, kind: CommandKind) -> str | None:
        """The outcome, or ``None`` when the task changed before the compare-and-set."""
        target = submission.unheld_target(snapshot, kind)
        if target is None:
            return "no-change"
        now = self.clock.now()
        new = advance(snapshot, target, now)
        transition = Transition(snapshot.task_id, new.status_version, snapshot.status, target,
                                now, f"{kind.value} by {self.name}")  # fmt: skip
        (conflict,) = self.adapter.commit([(new, snapshot.status_version, [transition])],
                                          best_effort_history=True)  # fmt: skip
        if conflict is not None:
            return None
        return "resumed" if kind is CommandKind.RESUME else target.value

    def _command(
        self, snapshot: TaskSnapshot, kind: CommandKind, wait: bool, timeout: float
    ) -> str:
        command = Command(f"cmd-{secrets.token_hex(8)}", snapshot.task_id, kind,
                          self.clock.now(), issued_by=self.name)  # fmt: skip
        if wait and not self.adapter.reads_commands:
            raise TypeError(f"{type(self.store).__name__} cannot read commands back: wait=False")
        self.store.submit_command(command)
        self._nudge(snapshot.lease_owner or WORK)
        if not wait:
            return f"sent:{command.command_id}"
        deadline, began = _deadline(timeout), time.monotonic()
        for attempt in range(1_000_000_000):
            stored = self.adapter.get_command(command.command_id)
            if stored is not None and stored.finished_at is not None:
                return stored.outcome or "done"
            now = time.monotonic()
            if now >= deadline:
                raise CommandTimeout(command, now - began)
            time.sleep(min(submission.backoff(attempt), deadline - now))
        raise AssertionError("unreachable")

    # -- plumbing --------------------------------------------------------------------------

    def _bucket_policy(self) -> BucketPolicy:
        """The namespace's bucket count: given, else recorded by its workers, else 64. A given
        count that differs from the recorded one would put tasks where no worker looks."""
        if self._buckets is not None:
            return self._buckets
        recorded = self.adapter.recorded_num_buckets()
        given = self._num_buckets
        if given is not None and recorded is not None and given != recorded:
            raise ValueError(
                f"the namespace's workers run with num_buckets={recorded}, not {given}: "
                "tasks submitted with another count would never run"
            )
        policy = BucketPolicy(given or recorded or 64)
        if recorded is not None or given is not None:
            self._buckets = policy  # a namespace's count never changes once recorded
        return policy

    def _nudge(self, topic: str) -> None:
        """Wake the task's holder (or idle workers) now instead of at their next poll; for a
        submit, only where the store's own write did not already publish it."""
        nudge = self.adapter.nudge
        if topic == WORK and nudge is not None and nudge.publishes_work:
            return
        if self._notifier is None:
            self._notifier = (
                LocalNotifier(self.store) if nudge is None
                else RedisNotifier(nudge.client, nudge.namespace)
            )  # fmt: skip
        self._notifier.publish(topic)

    def close(self) -> None:
        """Close the store if this client opened it (``from_url``)."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _not_before(
    now: datetime, delay: float | timedelta | None, not_before: datetime | None
) -> datetime | None:
    if delay is None:
        return not_before
    if not_before is not None:
        raise TypeError("pass delay or not_before, not both")
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"delay must be seconds or a timedelta, not {type(delay).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"delay must be a finite number of seconds >= 0, not {delay!r}")
    return now + timedelta(seconds=seconds)


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be seconds, not {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, not {timeout!r}")


def _deadline(timeout: float | None) -> float:
    _check_timeout(timeout)
    return math.inf if timeout is None else time.monotonic() + timeout
