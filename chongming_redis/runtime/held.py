"""Which tasks this process holds: ``Held`` (one task and its unwritten history) and
``HeldTasks`` (the registry, which owns the lock), with the rules every runtime part applies
to a task as the store shows it (``holder``, lease expiry, stalled heartbeat, the next state).

Low in the runtime: the engine's parts import it, and it imports only ``TaskContext`` (the
object a held task's function is given).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chongming_redis.model import TaskSnapshot, TaskStatus, Transition
from chongming_redis.policy import DEFAULT_RETENTION
from chongming_redis.runtime.context import TaskContext

HELD_STATUSES = (TaskStatus.RUNNING, TaskStatus.PAUSED)


@dataclass
class Held:
    """A task this process runs. ``snapshot`` is the holder's truth; ``stored_version`` is the
    version the store has confirmed; ``pending`` are transitions not yet written."""

    snapshot: TaskSnapshot
    stored_version: int
    ctx: TaskContext
    pending: list[Transition] = field(default_factory=list)
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    lease_renewed_at: float = 0.0
    heartbeat_written: int = 0
    stop_commands: list[str] = field(default_factory=list)
    done: bool = False
    began: bool = False  # its function was called (a prefetched task waits with False)
    #: Its last move here was made (its end, or its hand-back): claimed once, under
    #: ``write_lock``, so a hand-back or a pause racing the function's return cannot move a
    #: finished task on.
    ended: bool = False
    #: Its end here was a hand-back (``Writer.hand_back``): the run is over, the task is not.
    handed_back: bool = False
    final_outcome: str = "already-terminal"
    queued: bool = False  # waiting for the group committer
    #: Counted in the runner's outstanding tasks: until its end is written (or it is let go),
    #: so a slot is reused only once the store no longer says RUNNING for this task.
    outstanding: bool = False
    #: A write of ours met another writer's version: nothing more is ever written for it
    #: here (a flush that waited on ``write_lock`` meanwhile must not try again).
    conflicted: bool = False

    @property
    def task_id(self) -> str:
        return self.snapshot.task_id

    def stored(self) -> TaskSnapshot | None:
        """The snapshot, if the store holds this very version."""
        return self.snapshot if self.stored_version == self.snapshot.status_version else None


class HeldTasks:
    """The tasks this process holds, by id, behind one lock."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._held: dict[str, Held] = {}

    def add(self, held: Held) -> None:
        with self._lock:
            self._held[held.task_id] = held

    def get(self, task_id: str) -> Held | None:
        with self._lock:
            return self._held.get(task_id)

    def forget(self, held: Held) -> None:
        held.done = True
        with self._lock:
            if self._held.get(held.task_id) is held:
                del self._held[held.task_id]

    def active(self) -> list[Held]:
        """The held tasks still running (not finished, not handed back)."""
        with self._lock:
            return [h for h in self._held.values() if not h.done]

    def all(self) -> list[Held]:
        with self._lock:
            return list(self._held.values())

    def __contains__(self, task_id: object) -> bool:
        with self._lock:
            return task_id in self._held


def advance(
    snapshot: TaskSnapshot, status: TaskStatus, now: datetime, **changes: Any
) -> TaskSnapshot:
    """The next state: one version up (the store checks only that we held the previous one).
    A task that finishes with no retention of its own (its producer knew no policy and no
    worker ran it) gets ``DEFAULT_RETENTION``: no finished task is kept for ever."""
    if status.is_terminal and snapshot.retention is None and "retention" not in changes:
        changes["retention"] = DEFAULT_RETENTION
    return snapshot.evolve(status=status, status_version=snapshot.status_version + 1,
                           updated_at=now, **changes)  # fmt: skip


def without_lease(snapshot: TaskSnapshot) -> TaskSnapshot:
    return dataclasses.replace(snapshot, lease_owner=None, lease_until=None, heartbeat_at=None,
                               progress=None)  # fmt: skip


def holder(snapshot: TaskSnapshot) -> str | None:
    """Who supervises the task, judged from the store alone: the lease owner, if the lease was
    written after the task's last change. A task paused or requeued while nobody ran it keeps
    the lease fields of an earlier attempt (``save`` never writes them), but that lease is
    older than the change, so nobody holds it. ``PENDING`` tasks have no holder."""
    if snapshot.status not in HELD_STATUSES or snapshot.lease_owner is None:
        return None
    if snapshot.lease_until is None or snapshot.lease_until <= snapshot.updated_at:
        return None
    return snapshot.lease_owner


def lease_expired(snapshot: TaskSnapshot, now: datetime, lease: float) -> bool:
    if snapshot.lease_until is not None:
        return snapshot.lease_until <= now
    # Started but never leased (the holder died between its start and its first renewal):
    # give it one lease period from its last state change.
    return snapshot.updated_at + timedelta(seconds=lease) <= now


def heartbeat_stalled(snapshot: TaskSnapshot, now: datetime, stall_after: float) -> bool:
    beat = snapshot.heartbeat_at or snapshot.updated_at
    return beat + timedelta(seconds=stall_after) <= now
