"""The vocabulary of dependencies between tasks (``submit(..., after=...)``), shared by the
model, the runtime and every store: the checks of a task's parents and of its
``on_parent_failure`` policy, and the one rule that decides what a parent's end does to a
waiting child (``release``), so the in-memory reference, the SQL stores and the Redis scripts
(``lua/lib/dependencies.lua`` mirrors it) decide alike.

A child is created ``WAITING`` with the parents it names; the store resolves each edge once,
when the parent first ends (a final status written by the store: ``SUCCEEDED``, ``FAILED``,
``STOPPED`` or ``LOST`` with no retry in the same write), or at once when the parent had
already ended at the child's creation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from chongming_redis.validation import check_identifier

#: What a parent that ends other than ``SUCCEEDED`` does to its child.
STOP = "stop"
RUN = "run"
PARENT_FAILURE_POLICIES: tuple[str, ...] = (STOP, RUN)

#: At most this many parents per task (a wider fan-in: a tree of joins).
MAX_PARENTS = 10_000

Release = Literal["pending", "stopped"]


def check_parent_failure(value: object) -> str:
    if type(value) is not str:
        raise TypeError(f"on_parent_failure must be a str, not {type(value).__name__}")
    if value not in PARENT_FAILURE_POLICIES:
        raise ValueError(f"on_parent_failure must be 'stop' or 'run', not {value!r}")
    return value


def check_parents(value: object) -> tuple[str, ...]:
    """A task's parents as stored: a tuple of distinct task ids, in the order given."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"parents must be a tuple of task ids, not {type(value).__name__}")
    parents = tuple(value)
    for parent in parents:
        check_identifier(parent, "parent task id")
    if len(set(parents)) != len(parents):
        raise ValueError("parents must not repeat a task id")
    if len(parents) > MAX_PARENTS:
        raise ValueError(f"a task has at most {MAX_PARENTS} parents, not {len(parents)}")
    return parents


def release(policy: str, parent_status: str, unmet: int) -> Release | None:
    """What a parent's end does to a ``WAITING`` child with ``policy``: the parent ended in
    ``parent_status`` (a final status value) and ``unmet`` parents of the child have not ended
    yet (this one no longer counted). ``"stopped"``: a parent failed under ``"stop"``;
    ``"pending"``: the last parent ended and the child may run; ``None``: it waits on."""
    if parent_status != "succeeded" and policy == STOP:
        return "stopped"
    return "pending" if unmet == 0 else None


def release_reason(outcome: Release, parent: str, parent_status: str) -> str:
    """The history reason of a child's release (the parent whose end decided it)."""
    if outcome == "stopped":
        return f"parent {parent} ended {parent_status}"
    return f"parents ended (last: {parent} {parent_status})"
