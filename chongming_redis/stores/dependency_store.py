"""``DependenciesStore``: tasks that wait for other tasks (an extension,
``stores/extensions.py``; the runtime's side is ``submit(..., after=...)``).

A task created ``WAITING`` names its parents (``TaskSnapshot.parents``) and what a failed
parent does to it (``on_parent_failure``). The store resolves each (child, parent) edge once,
in the atomic step of the write that ends the parent, and moves the child itself:

* **Create** (``create``, ``commit_tasks``) of a ``WAITING`` task: every parent must exist
  (stored, or created by an earlier item of the same ``commit_tasks`` call), else
  ``ParentNotFound`` and nothing is written. A parent that has already ended is applied at
  once: the child may be stored and released in one step (its version one above the given
  one, with its history entry).
* **A parent ends** (a write moves it from an unfinished to a final status; a ``LOST``
  attempt retried in the same write never ends it): each of its ``WAITING`` children is
  judged by ``parents.release``: under ``"stop"`` a parent that ended other than
  ``SUCCEEDED`` ends the child ``STOPPED`` (and that end applies to the child's own
  children in turn); once every parent has ended (``"run"``) or succeeded (``"stop"``) the
  child becomes ``PENDING``. Each move is a compare-and-set write of the store's own: the
  version one up, ``updated_at`` the store's clock, one history entry
  (``WAITING -> PENDING/STOPPED``, ``parents.release_reason``), the next feed position, its
  indexes and counts. At most ``RELEASE_STEP`` children are moved by one write; the rest wait
  for ``release_dependents`` (the runtime calls it while it returns a full step).
* **Only the store moves a task out of ``WAITING``**, but for an end: a save or commit that
  moves a task into ``WAITING``, or from it to a status that is not final, is ``WaitingMove``
  (nothing written). A save or commit to a final status (a stop) ends the child: its edges go.
  A save never changes ``parents`` or ``on_parent_failure`` (the stored ones stay, as the
  lease does).
* **Retention**: a final task with an unfinished child (one created ``WAITING`` with it as a
  parent, not yet final) is neither pruned nor expired; ``prune`` passes over it, and its
  retention runs out at the earliest once the last such child has ended.

A task created in another status with parents is stored as given (no edges). A retry by hand
of an ended child starts it now, whatever its parents. A store without this extension stores
``WAITING`` like any status and moves nothing: the runtime refuses ``after=`` on it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from chongming_redis.validation import check_int

#: At most this many children are moved by one write (each a task write of its own); the rest
#: are left to ``release_dependents``.
RELEASE_STEP = 100


@runtime_checkable
class DependenciesStore(Protocol):
    """The dependency duties above, and the call that continues a wide release."""

    def release_dependents(self, *, limit: int = RELEASE_STEP) -> int:
        """Apply ended parents' outcomes to up to ``limit`` (1..1,000) of their waiting
        children that the write ending them left over, oldest end first; returns how many
        children were judged (each moved at most once: one judged twice is not counted
        twice). 0: nothing is left."""
        ...

    def release_backlog(self) -> int:
        """How many ended parents still have waiting children to apply their end to (0 once
        every release is done): what a dashboard shows and a test waits for."""
        ...


DEPENDENCY_METHODS: tuple[str, ...] = ("release_dependents", "release_backlog")


def check_release_limit(limit: object) -> int:
    return check_int(limit, "limit", minimum=1, maximum=1000)
