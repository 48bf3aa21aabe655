"""What ``Client`` and ``AsyncClient`` do, written once, without I/O.

Each call of a client that decides something (submit, wait, stop/pause/resume, retry) is a
*flow*: a generator that yields *effects* (read a task, commit, sleep, read the clock, ...), is
sent their results, and returns the call's answer or raises its exception. ``Client`` performs
the effects with blocking calls and ``time.sleep``, ``AsyncClient`` with ``await`` and
``asyncio.sleep``; the decisions (when a wait gives up, when a control is a compare-and-set
and when a command, how often a changed task is looked at again) are the flows' alone::

    flow = client._wait_flow("t1", timeout=5.0)   # nothing has run yet
    effect = flow.send(None)                      # GetTask("t1")
    effect = flow.send(snapshot)                  # Sleep(0.005), ... or StopIteration(result)

The exceptions a producer meets are defined here and exported by ``chongming_redis.client.client``.
"""

from __future__ import annotations

import itertools
import math
import os
import secrets
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from chongming_redis.client.effects import (
    Commit,
    Effect,
    Flow,
    GetCommand,
    GetTask,
    Now,
    Nudge,
    RecordedBuckets,
    RecordedLimits,
    Sleep,
    SubmitCommand,
    TaskSchemas,
    TaskTypes,
    adrive,
    drive,
)
from chongming_redis.client.params_check import SchemaCache, check_sets
from chongming_redis.errors import StoreError, UniqueTaken
from chongming_redis.limits import BoundLimit
from chongming_redis.model import (
    Command,
    CommandKind,
    TaskQuery,
    TaskSnapshot,
    Transition,
)
from chongming_redis.runtime import submission
from chongming_redis.runtime.app import App, TaskType, UnknownTask
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.held import advance
from chongming_redis.runtime.limit_defs import DefinitionsCache
from chongming_redis.runtime.notify import WORK
from chongming_redis.stores.extensions import keeps_unique_ids
from chongming_redis.validation import check_identifier

__all__ = [
    "ClientFlows", "CommandTimeout", "Commit", "Effect", "Flow", "GetCommand", "GetTask", "Now",
    "Nudge", "RecordedBuckets", "RecordedLimits", "Sleep", "SubmitCommand", "TaskNotFinished",
    "TaskNotFound", "TaskSchemas", "TaskTypes", "adrive", "drive",
]  # fmt: skip

T = TypeVar("T")

#: How often a compare-and-set on a task nobody holds is tried again when it meets a change
#: (a worker started it meanwhile: then the command goes to that worker).
CONTROL_ROUNDS = 5


_MICROSECOND = timedelta(microseconds=1)


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


# -- the flows ---------------------------------------------------------------------------------


class ClientFlows:
    """The state and decisions ``Client`` and ``AsyncClient`` share."""

    #: The store, named in error messages.
    store: object

    def __init__(self, *, app: App | None, num_buckets: int | None, name: str | None) -> None:
        self.app = app
        self.name = check_identifier(name or f"client-{os.uname().nodename}-{os.getpid()}",
                                     "name")  # fmt: skip
        self._num_buckets = None if num_buckets is None else BucketPolicy(num_buckets).num_buckets
        self._buckets: BucketPolicy | None = None
        self._known_types: frozenset[str] = frozenset()
        self._recorded_limits = DefinitionsCache()
        self._schemas = SchemaCache()

    @property
    def _keeps_unique(self) -> bool:
        """Whether the store keeps unique ids: a ``TaskPoliciesStore``, or a producer's store
        whose writes keep them (``keeps_unique_ids``: the async Redis store)."""
        return keeps_unique_ids(self.store)

    @property
    def _reads_commands(self) -> bool:
        """Whether the store reads a command back (else a control cannot wait for it)."""
        return True

    def _resolve_flow(self, task: str | TaskType) -> Flow[tuple[str, TaskType | None]]:
        """The task's name and type. Without an app, a name is checked against the names the
        namespace's workers recorded (``TaskTypesStore``): a name none of them runs would
        wait forever. Parameters are validated by the app (or a typed handle), else against the
        schema the workers published (``_params_flow``)."""
        name, task_type = submission.resolve(self.app, task)
        if task_type is None and name not in self._known_types:
            known: frozenset[str] | None = yield TaskTypes()
            self._known_types = known or frozenset()
            if known and name not in known:
                raise UnknownTask(
                    f"unknown task type {name!r} (the namespace's workers run: "
                    f"{', '.join(sorted(known))})"
                )
        return name, task_type

    def _params_flow(
        self, name: str, task_type: TaskType | None, params: Iterable[Any]
    ) -> Flow[None]:
        """Without a ``TaskType`` (whose model validates them in ``new_task``), check each of
        ``params`` against the schema the type's workers published (read again after
        ``SCHEMA_TTL``; ``client/params_check.py``): ``InvalidParams``, nothing written."""
        if task_type is not None:
            return
        if not self._schemas.fresh(name):
            found = yield TaskSchemas((name,))
            self._schemas.update(name, None if found is None else found.get(name))
        check_sets(name, list(params), self._schemas.get(name))

    def _limits_flow(self, name: str, task_type: TaskType | None) -> Flow[tuple[BoundLimit, ...]]:
        """The limits a task of ``name`` is submitted under when no ``TaskType`` is known: the
        definitions its workers recorded (read again every few seconds). A type no worker has
        recorded yet gets none (``docs/runtime.md``, *Limits*)."""
        if task_type is not None:
            return ()
        if not self._recorded_limits.fresh():
            self._recorded_limits.update((yield RecordedLimits()))
        return self._recorded_limits.of(name)

    def _submit_flow(
        self,
        task: str | TaskType,
        params: Any,
        *,
        key: str | None,
        tags: Iterable[str],
        task_id: str | None,
        pipeline_run_id: str | None,
        delay: float | timedelta | None,
        not_before: datetime | None,
        priority: int | None = None,
        **policies: Any,
    ) -> Flow[tuple[str, bool]]:
        """``(the task's id, created)``: with ``unique`` held by an unfinished task, that
        task's id and False (nothing written). ``policies``: ``NewTask``'s ``unique``,
        ``retry``, ``timeout``, ``retention``, ``after``, ``on_parent_failure``."""
        if policies.get("unique") is not None and not self._keeps_unique:
            raise ValueError(f"{self.store!r} does not keep unique ids (it is no "
                             "TaskPoliciesStore): submit without unique=")  # fmt: skip
        policies = submission.with_parents(self.store, policies)
        name, task_type = yield from self._resolve_flow(task)
        yield from self._params_flow(name, task_type, [params])
        now: datetime = yield Now()
        spec = submission.NewTask(name, params, key=key, tags=tags, task_id=task_id,
                                  pipeline_run_id=pipeline_run_id, priority=priority,
                                  not_before=not_before_of(now, delay, not_before),
                                  **policies)  # fmt: skip
        buckets = yield from self._bucket_policy_flow()
        recorded = yield from self._limits_flow(name, task_type)
        snapshot, transition = submission.new_task(spec, task_type, now=now, buckets=buckets,
                                                   submitted_by=self.name,
                                                   recorded_limits=recorded)  # fmt: skip
        (error,) = yield Commit([(snapshot, None, [transition])])
        if isinstance(error, UniqueTaken):
            return error.holder, False
        if error is not None:
            raise error
        yield Nudge(WORK)
        return snapshot.task_id, True

    def _submit_many_flow(
        self,
        task: str | TaskType,
        params_list: Iterable[Any],
        *,
        key: str | None,
        tags: Iterable[str],
        pipeline_run_id: str | None,
        delay: float | timedelta | None,
        priority: int | None = None,
        **policies: Any,
    ) -> Flow[list[str]]:
        """The new tasks' ids; every parameter set is validated before anything is written.
        ``key``: every task's bucket key (one bucket for all; default: each task's id)."""
        policies = submission.with_parents(self.store, policies)
        name, task_type = yield from self._resolve_flow(task)
        params_list = list(params_list)  # each set checked before any is written
        yield from self._params_flow(name, task_type, params_list)
        now: datetime = yield Now()
        when = not_before_of(now, delay, None)
        buckets, tag_set = (yield from self._bucket_policy_flow()), frozenset(tags)
        recorded = yield from self._limits_flow(name, task_type)
        prepared = []
        for params in params_list:
            spec = submission.NewTask(name, params, key=key, tags=tag_set, priority=priority,
                                      pipeline_run_id=pipeline_run_id, not_before=when,
                                      **policies)  # fmt: skip
            prepared.append(submission.new_task(spec, task_type, now=now, buckets=buckets,
                                                submitted_by=self.name,
                                                recorded_limits=recorded))  # fmt: skip
            # Each task its own instant, in submission order: listings (ordered by created_at)
            # show a batch in the order it was given, as separate submits would.
            now = max((yield Now()), now + _MICROSECOND)
        if not prepared:
            return []
        items = [(snapshot, None, [transition]) for snapshot, transition in prepared]
        errors: Sequence[StoreError | None] = yield Commit(items)
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise error
        yield Nudge(WORK)
        return [snapshot.task_id for snapshot, _ in prepared]

    def _wait_flow(self, task_id: str, timeout: float | None) -> Flow[Any]:
        """The finished task's result, or its outcome raised (see ``Client.wait``)."""
        check_identifier(task_id, "task_id")
        deadline = deadline_of(timeout)
        began = time.monotonic()
        for attempt in itertools.count():
            snapshot: TaskSnapshot | None = yield GetTask(task_id)
            if snapshot is None:
                raise TaskNotFound(task_id)
            # Final as read: a retried task goes from FAILED / LOST to its next attempt in the
            # same write (TaskWriter.end_and_retry, Runner.finish), never through a read.
            if snapshot.status.is_terminal:
                return submission.outcome(snapshot)
            now = time.monotonic()
            if now >= deadline:
                raise TaskNotFinished(snapshot, now - began)
            yield Sleep(min(submission.backoff(attempt), max(0.0, deadline - now)))
        raise AssertionError("unreachable")

    def _retry_flow(self, task_id: str) -> Flow[str]:
        """A new attempt of a finished task (see ``Client.retry``); its id."""
        for _ in range(CONTROL_ROUNDS):
            snapshot: TaskSnapshot | None = yield GetTask(task_id)
            if snapshot is None:
                raise TaskNotFound(task_id)
            now: datetime = yield Now()
            new, transition = submission.retried(snapshot, now, self.name)
            (conflict,) = yield Commit([(new, snapshot.status_version, [transition])])
            if conflict is None:
                yield Nudge(WORK)
                return task_id
            if isinstance(conflict, UniqueTaken):  # another unfinished task took its unique id
                raise conflict
        raise RuntimeError(f"task {task_id!r} kept changing; not retried")

    def _control_flow(
        self, task_id: str, kind: CommandKind, wait: bool, timeout: float
    ) -> Flow[str]:
        """A stop/pause/resume's outcome (see ``Client.stop``)."""
        check_identifier(task_id, "task_id")
        check_timeout(timeout)
        for _ in range(CONTROL_ROUNDS):
            snapshot: TaskSnapshot | None = yield GetTask(task_id)
            if snapshot is None:
                return "no-such-task"
            if snapshot.status.is_terminal:
                return "already-terminal"
            if submission.is_unheld(snapshot):
                outcome = yield from self._control_unheld_flow(snapshot, kind)
                if outcome is not None:
                    return outcome
                continue  # it changed under us (a worker started it): look again
            # A holder answers every command it acts on (a race is judged again, never
            # answered): its outcome is final.
            return (yield from self._command_flow(snapshot, kind, wait, timeout))
        raise RuntimeError(f"task {task_id!r} kept changing; {kind.value} not applied")

    def _control_unheld_flow(self, snapshot: TaskSnapshot, kind: CommandKind) -> Flow[str | None]:
        """The outcome, or ``None`` when the task changed before the compare-and-set."""
        target = submission.unheld_target(snapshot, kind)
        if target is None:
            return submission.unchanged(snapshot, kind)
        now: datetime = yield Now()
        new = advance(snapshot, target, now)
        transition = Transition(snapshot.task_id, new.status_version, snapshot.status, target,
                                now, f"{kind.value} by {self.name}")  # fmt: skip
        (conflict,) = yield Commit([(new, snapshot.status_version, [transition])])
        if conflict is not None:
            return None
        return "resumed" if kind is CommandKind.RESUME else target.value

    def _command_flow(
        self, snapshot: TaskSnapshot, kind: CommandKind, wait: bool, timeout: float
    ) -> Flow[str]:
        """A command for the task's holder; with ``wait``, its outcome once applied."""
        now: datetime = yield Now()
        command = Command(f"cmd-{secrets.token_hex(8)}", snapshot.task_id, kind, now,
                          issued_by=self.name)  # fmt: skip
        if wait and not self._reads_commands:
            raise TypeError(f"{type(self.store).__name__} cannot read commands back: wait=False")
        yield SubmitCommand(command)
        yield Nudge(snapshot.lease_owner or WORK)
        if not wait:
            return f"sent:{command.command_id}"
        deadline, began = deadline_of(timeout), time.monotonic()
        for attempt in itertools.count():
            stored: Command | None = yield GetCommand(command.command_id)
            if stored is not None and stored.finished_at is not None:
                return stored.outcome or "done"
            monotonic = time.monotonic()
            if monotonic >= deadline:
                raise CommandTimeout(command, monotonic - began)
            yield Sleep(min(submission.backoff(attempt), deadline - monotonic))
        raise AssertionError("unreachable")

    def _bucket_policy_flow(self) -> Flow[BucketPolicy]:
        """The namespace's bucket count: given, else recorded by its workers, else 64. A given
        count that differs from the recorded one would put tasks where no worker looks."""
        if self._buckets is not None:
            return self._buckets
        recorded: int | None = yield RecordedBuckets()
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


# -- arguments ---------------------------------------------------------------------------------


def not_before_of(
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


def check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be seconds, not {type(timeout).__name__}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, not {timeout!r}")


def deadline_of(timeout: float | None) -> float:
    check_timeout(timeout)
    return math.inf if timeout is None else time.monotonic() + timeout


def query_of(query: TaskQuery | None, filters: dict[str, Any]) -> TaskQuery:
    """A ``TaskQuery``, given or from its fields as keywords (not both)."""
    if query is not None and filters:
        raise TypeError("pass a TaskQuery or its fields as keywords, not both")
    return query if query is not None else TaskQuery(**filters)
