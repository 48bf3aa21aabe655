"""The task store as a sequential model, per task: the register the linearizability check
(``stress/linearizability.py``) replays each task's recorded operations on.

The state of one task is a :class:`Register`: its ``status_version`` (the compare-and-set token
of ``save``, ``commit_tasks``, ``start_tasks`` and ``touch_fenced``), its ``status`` and its
``lease_owner`` — what clients observe and what the store's writes decide on — or ``ABSENT``
(never created, or removed). The operations, as ``stores/protocol.py``,
``stores/extensions.py`` and the in-memory reference (``stores/memory.py``,
``stores/_memory_batching.py``) define them:

* ``Create(v, status, owner)``: ok only on an absent task (it then holds exactly that);
  ``exists`` only on a present one;
* ``Save(expect, v, status)`` (``save`` and a ``commit_tasks`` item): ok only when the stored
  version is ``expect`` (version and status replaced, the lease kept); ``conflict(actual)`` only
  when it is not, and ``actual`` is the stored version (``None``: absent);
* ``Start(owner, v)`` (a task ``start_tasks``/``commit_and_start`` returned, or a start entry
  of the task's stored history attributed to an unknown call): only from ``(v - 1, PENDING)``,
  to ``(v, RUNNING, owner)``;
* ``Release(v, status)``: the store moving a ``WAITING`` task (its parents ended) from
  ``(v - 1, WAITING)``; no client call does it, so it enters only from the stored history;
* ``Read()`` (``get``): ok with exactly the stored register;
* ``Touch(owner)``: writes the lease owner of a present task, nothing on an absent one;
  ``TouchFenced(expect, owner)``: ``True`` only at version ``expect`` (then the owner, if
  given, is written), ``False`` only at another version or on an absent task;
* ``Remove()`` (an id ``expire_finished`` returned, or a ``prune``: ``lin_history``): only a
  task in a final status.

``Refused`` outcomes (``UniqueTaken``, ``WaitingMove``, ``ParentNotFound``, an argument refused
before any I/O) write nothing and say nothing this model can check. An unknown outcome
(``UNKNOWN``) applies the call's effect when its precondition holds, and nothing otherwise
(the search also tries it never happening).

Scope, honestly: ``lease_until``, heartbeats, progress, payloads and the attempt counter are not
modelled; nor are ``query`` reads (not atomic across tasks). The control commands and their
leases are a model of their own, per command (``stress/lin_commands.py``). What depends on other
tasks is not checked per task: which final tasks a ``prune`` removes (``lin_history`` lets a
prune remove any final task seen absent later), whether a release of a ``WAITING`` task followed
its parents' ends (``stress/dependency_checks.py``), the unique ids and the limits. A check is
only as complete as the recording: every process that writes the store must record
(``stress/oplog.py``), else its writes look like violations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from chongming_redis.model import TaskStatus
from chongming_redis.stress.linearizability import UNKNOWN

PENDING, RUNNING, WAITING = TaskStatus.PENDING.value, TaskStatus.RUNNING.value, "waiting"
FINAL = frozenset(s.value for s in TaskStatus if s.is_terminal)


class Register(NamedTuple):
    version: int | None
    status: str | None
    owner: str | None

    def __repr__(self) -> str:
        if self.version is None:
            return "absent"
        return f"v{self.version} {self.status} owner={self.owner}"


ABSENT = Register(None, None, None)


@dataclass(frozen=True)
class Create:
    version: int
    status: str
    owner: str | None

    def __str__(self) -> str:
        return f"create v{self.version} {self.status} owner={self.owner}"


@dataclass(frozen=True)
class Save:
    expect: int
    version: int
    status: str

    def __str__(self) -> str:
        return f"save v{self.expect} -> v{self.version} {self.status}"


@dataclass(frozen=True)
class Start:
    owner: str
    version: int

    def __str__(self) -> str:
        return f"start by {self.owner} -> v{self.version}"


@dataclass(frozen=True)
class Release:
    version: int
    status: str

    def __str__(self) -> str:
        return f"store releases waiting task -> v{self.version} {self.status}"


@dataclass(frozen=True)
class Read:
    def __str__(self) -> str:
        return "get"


@dataclass(frozen=True)
class Touch:
    owner: str

    def __str__(self) -> str:
        return f"touch owner={self.owner}"


@dataclass(frozen=True)
class TouchFenced:
    expect: int
    owner: str | None

    def __str__(self) -> str:
        return f"touch_fenced at v{self.expect} owner={self.owner}"


@dataclass(frozen=True)
class Remove:
    def __str__(self) -> str:
        return "removed (expire_finished)"


@dataclass(frozen=True)
class Ok:
    def __repr__(self) -> str:
        return "ok"


@dataclass(frozen=True)
class Conflict:
    actual: int | None  # the stored version the store reported (None: no such task)

    def __repr__(self) -> str:
        return f"conflict (found {'nothing' if self.actual is None else f'v{self.actual}'})"


@dataclass(frozen=True)
class Exists:
    def __repr__(self) -> str:
        return "already exists"


@dataclass(frozen=True)
class Refused:
    kind: str

    def __repr__(self) -> str:
        return f"refused ({self.kind})"


OK = Ok()


class TaskModel:
    """``linearizability.Model`` of one task's register."""

    def init(self) -> Register:
        return ABSENT

    def step(self, state: Register, call: Any, outcome: Any) -> Register | None:
        if isinstance(outcome, Refused):
            return state
        handler = _STEPS.get(type(call))
        if handler is None:
            raise TypeError(f"not an operation of the task model: {call!r}")
        after: Register | None = handler(state, call, outcome)
        return after


def render(call: Any, outcome: Any) -> str:
    return f"{call} -> {outcome!r}"


def _create(state: Register, call: Create, outcome: Any) -> Register | None:
    present = state.version is not None
    if outcome is UNKNOWN:
        return state if present else Register(call.version, call.status, call.owner)
    if isinstance(outcome, Exists):
        return state if present else None
    return None if present else Register(call.version, call.status, call.owner)


def _save(state: Register, call: Save, outcome: Any) -> Register | None:
    matches = state.version == call.expect
    written = Register(call.version, call.status, state.owner)
    if outcome is UNKNOWN:
        return written if matches else state
    if isinstance(outcome, Conflict):
        return state if not matches and outcome.actual == state.version else None
    return written if matches else None


def _start(state: Register, call: Start, outcome: Any) -> Register | None:
    eligible = state.status == PENDING and state.version == call.version - 1
    if eligible:
        return Register(call.version, RUNNING, call.owner)
    return state if outcome is UNKNOWN else None


def _release(state: Register, call: Release, outcome: Any) -> Register | None:
    if state.status == WAITING and state.version == call.version - 1:
        return Register(call.version, call.status, state.owner)
    return state if outcome is UNKNOWN else None


def _read(state: Register, call: Read, outcome: Any) -> Register | None:
    return state if outcome is UNKNOWN or outcome == state else None


def _touch(state: Register, call: Touch, outcome: Any) -> Register | None:
    return state if state.version is None else state._replace(owner=call.owner)


def _touch_fenced(state: Register, call: TouchFenced, outcome: Any) -> Register | None:
    applies = state.version is not None and state.version == call.expect
    written = state if call.owner is None else state._replace(owner=call.owner)
    if outcome is UNKNOWN:
        return written if applies else state
    if outcome is True:
        return written if applies else None
    return None if applies else state


def _remove(state: Register, call: Remove, outcome: Any) -> Register | None:
    if state.status in FINAL:
        return ABSENT
    return state if outcome is UNKNOWN else None


_STEPS: dict[type, Any] = {
    Create: _create,
    Save: _save,
    Start: _start,
    Release: _release,
    Read: _read,
    Touch: _touch,
    TouchFenced: _touch_fenced,
    Remove: _remove,
}
