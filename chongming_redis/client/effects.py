"""The effects a client flow (``client/flows.py``) yields — what it asks its client to do and
what it is sent back — and the two drivers that perform them, blocking and awaiting."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from chongming_redis.model import Command
from chongming_redis.stores.extensions import CommitItem

T = TypeVar("T")


@dataclass(frozen=True)
class Now:
    """The store's clock (``ServerClock``): a ``datetime``."""


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds``: ``None``."""

    seconds: float


@dataclass(frozen=True)
class GetTask:
    """The task as stored, or ``None``."""

    task_id: str


@dataclass(frozen=True)
class Commit:
    """``commit_tasks`` of ``items`` (history best effort): per item ``None`` or the conflict."""

    items: Sequence[CommitItem]


@dataclass(frozen=True)
class SubmitCommand:
    """Store and queue ``command``: ``None``."""

    command: Command


@dataclass(frozen=True)
class GetCommand:
    """The command as stored, or ``None``."""

    command_id: str


@dataclass(frozen=True)
class RecordedBuckets:
    """The namespace's recorded ``num_buckets``, or ``None``."""


@dataclass(frozen=True)
class Nudge:
    """Wake the holder ``topic`` (or idle workers, ``WORK``) now: ``None``."""

    topic: str


@dataclass(frozen=True)
class TaskTypes:
    """The task type names the namespace's workers recorded (``frozenset``), or ``None``
    when the store does not record them."""


@dataclass(frozen=True)
class RecordedLimits:
    """The limit definitions the namespace's workers recorded (``LimitsStore
    .limit_definitions()``: ``(id -> JSON, type -> ids)``), or ``None`` when the store records
    none."""


@dataclass(frozen=True)
class TaskSchemas:
    """The parameter schemas the namespace's workers published for ``names``
    (``TaskSchemasStore.task_schemas``: name -> ``PublishedSchema``, a name never published
    left out), or ``None`` when the store keeps none."""

    names: tuple[str, ...]


Effect = (
    Now | Sleep | GetTask | Commit | SubmitCommand | GetCommand | RecordedBuckets | Nudge
    | TaskTypes | RecordedLimits | TaskSchemas
)  # fmt: skip
Flow = Generator[Effect, Any, T]


def drive(flow: Flow[T], perform: Callable[[Effect], Any]) -> T:
    """Run ``flow``, performing each effect with ``perform``."""
    result: Any = None
    while True:
        try:
            effect = flow.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        result = perform(effect)


async def adrive(flow: Flow[T], perform: Callable[[Effect], Awaitable[Any]]) -> T:
    """``drive`` with an asynchronous ``perform``. Cancelling it between effects (its only
    ``await``) leaves nothing behind: a flow holds no resource."""
    result: Any = None
    while True:
        try:
            effect = flow.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        result = await perform(effect)
