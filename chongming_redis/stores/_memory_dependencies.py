"""``MemoryDependencies``: the dependency duties of ``InMemoryTaskStore``
(``DependenciesStore``, ``stores/dependency_store.py``), the reference the other stores are
checked against.

State, all under the store's lock and changed only by the write that moves a task:

* ``_edges[child]``: ``{parent: met}`` for a child created ``WAITING`` and not final yet
  (``met``: the parent's end was applied to it);
* ``_children[parent]``: the children with an edge to it (ordered by creation): what its end
  is applied to, and what keeps it from being pruned or expiring while unfinished;
* ``_releases``: ``{parent: the final status it ended in}`` for the parents whose end is still
  to be applied to waiting children, oldest end first.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from chongming_redis.errors import ParentNotFound, WaitingMove
from chongming_redis.model import TaskStatus, Transition
from chongming_redis.parents import Release, release, release_reason
from chongming_redis.stores._feed import MemoryFeed
from chongming_redis.stores._memory_policies import is_final
from chongming_redis.stores.codec import Row, encode_dt, transition_to_row
from chongming_redis.stores.dependency_store import RELEASE_STEP, check_release_limit

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

_WAITING = TaskStatus.WAITING.value


def row_parents(row: Row) -> list[str]:
    text = row.get("parents")
    return [] if text is None else list(json.loads(str(text)))


class MemoryDependencies:
    _tasks: dict[str, Row]
    _history: dict[str, dict[int, Row]]
    _feed: MemoryFeed

    if TYPE_CHECKING:  # provided by InMemoryTaskStore

        def _open(self) -> AbstractContextManager[None]: ...

    def _init_dependencies(self) -> None:
        self._edges: dict[str, dict[str, bool]] = {}
        self._children: dict[str, dict[str, None]] = {}
        self._releases: dict[str, str] = {}

    # -- checks before a write -----------------------------------------------------------------

    def _dependency_error(
        self, row: Row, current: Row | None
    ) -> ParentNotFound | WaitingMove | None:
        """Why writing ``row`` over ``current`` (``None``: a create) breaks a dependency rule,
        judged on the state as the writes before it left it; ``None`` if it does not."""
        task_id, status = str(row["task_id"]), str(row["status"])
        if current is None:
            if status == _WAITING:
                for parent in row_parents(row):
                    if parent not in self._tasks:
                        return ParentNotFound(task_id, parent)
            return None
        stored = str(current["status"])
        entering = status == _WAITING and stored != _WAITING
        leaving = stored == _WAITING and status != _WAITING and not is_final(row)
        if entering or leaving:
            return WaitingMove(task_id, stored, status)
        return None

    # -- after a write ---------------------------------------------------------------------------

    def _dependencies_written(self, task_id: str, previous: Row | None) -> None:
        """Keep the edges in step with a write of ``task_id`` over ``previous`` (``None``: a
        create), and apply what it ends, up to ``RELEASE_STEP`` children."""
        row = self._tasks[task_id]
        if previous is None and row["status"] == _WAITING:
            self._wait(task_id, row)
        elif (previous is not None and not is_final(previous) and is_final(row)
              and self._ended(task_id, row)):  # fmt: skip
            self._release_from([task_id], RELEASE_STEP)

    def _kept_parent_columns(self, row: Row, current: Row) -> None:
        row["parents"], row["on_parent_failure"] = current["parents"], current["on_parent_failure"]

    def _wait(self, child: str, row: Row) -> None:
        parents = row_parents(row)
        self._edges[child] = dict.fromkeys(parents, False)
        for parent in parents:
            self._children.setdefault(parent, {})[child] = None
        # A parent that has ended already is applied at once (a new task has no children
        # yet, so ending it here starts no release of its own).
        for parent in [p for p in parents if is_final(self._tasks[p])]:
            self._apply(child, parent, str(self._tasks[parent]["status"]))

    def _ended(self, task_id: str, row: Row) -> bool:
        """A task reached a final status: it stops waiting (its edges go, so its parents may
        be pruned) and its end is noted for its waiting children; whether it has any."""
        for parent in self._edges.pop(task_id, {}):
            children = self._children.get(parent)
            if children is not None:
                children.pop(task_id, None)
                if not children:
                    del self._children[parent]
        if any(not self._edges[c][task_id] for c in self._children.get(task_id, {})):
            self._releases[task_id] = str(row["status"])
            return True
        return False

    def _apply(self, child: str, parent: str, outcome: str) -> bool:
        """Apply ``parent``'s end (``outcome``) to ``child``; whether that ended the child
        with children of its own waiting."""
        edges = self._edges.get(child)
        if edges is None or edges.get(parent) is not False:
            return False
        edges[parent] = True
        row = self._tasks[child]
        if row["status"] != _WAITING:
            return False
        unmet = sum(1 for met in edges.values() if not met)
        decision = self._decide(str(row["on_parent_failure"] or "stop"), outcome, unmet)
        if decision is None:
            return False
        return self._move_child(child, row, decision, parent, outcome)

    def _decide(self, policy: str, outcome: str, unmet: int) -> Release | None:
        """The one release rule (``parents.release``), a method of its own so that a test
        store can change the rule alone."""
        return release(policy, outcome, unmet)

    def _move_child(self, child: str, row: Row, to: Release, parent: str, outcome: str) -> bool:
        now = datetime.now(timezone.utc)
        version = int(row["status_version"]) + 1  # type: ignore[arg-type]
        row.update(status=to, status_version=version, updated_at=encode_dt(now))
        self._feed.move(child)
        entry = Transition(child, version, TaskStatus.WAITING, TaskStatus(to), now,
                           release_reason(to, parent, outcome))  # fmt: skip
        self._history.setdefault(child, {}).setdefault(version, transition_to_row(entry))
        return to == "stopped" and self._ended(child, row)

    def _release_from(self, queue: list[str], budget: int) -> int:
        """Apply the noted ends of the parents in ``queue`` (and of the children that end
        along the way), at most ``budget`` children; what is left stays in ``_releases``."""
        done = 0
        while queue and done < budget:
            parent = queue[0]
            outcome = self._releases.get(parent)
            waiting = [] if outcome is None else [
                c for c in self._children.get(parent, {}) if not self._edges[c][parent]
            ]  # fmt: skip
            taken = waiting[: budget - done]
            for child in taken:
                done += 1
                if self._apply(child, parent, str(outcome)):
                    queue.append(child)
            if len(taken) < len(waiting):
                break  # the step is spent: the rest stays noted
            self._releases.pop(parent, None)
            queue.pop(0)
        return done

    def _pinned(self, task_id: str) -> bool:
        """A final task that an unfinished child still depends on: kept."""
        return bool(self._children.get(task_id))

    # -- the extension ---------------------------------------------------------------------------

    def release_dependents(self, *, limit: int = RELEASE_STEP) -> int:
        size = check_release_limit(limit)
        with self._open():
            return self._release_from(list(self._releases), size)

    def release_backlog(self) -> int:
        with self._open():
            return len(self._releases)
