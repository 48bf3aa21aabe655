"""The dependencies (``DependenciesStore``, ``stores/dependency_store.py``) in SQL, for every SQL
store; the in-memory reference (``stores/_memory_dependencies.py``) is the behaviour, the
tables are ``schema._v7``'s, and the one rule of a release is ``parents.release``.

* ``task_edges`` has one row per (child, parent) of a child created ``WAITING``, from its
  creation until it is final (``met``: the parent's end was applied to it); a finished task
  with an edge row as a parent is pinned (``schema.UNPINNED``: neither pruned nor expired).
* ``edge_releases`` holds the parents whose end is still to be applied to waiting children
  (``outcome``: the final status it ended in), oldest end first (``at_us``, then id).
* Every change is made by the write transaction of the task write that causes it
  (``Duties``: ``before`` the write refuses what breaks a rule, ``after`` it keeps the edges
  and applies an end to at most ``RELEASE_STEP`` children); each child moved is a save of the
  store's own (``tasks.save``: version one up, expiry, unique index, feed position) with its
  history entry and limit holds, its row locked first (``FOR UPDATE``, after the feed head
  every writer takes first).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from chongming_redis.errors import (
    ParentNotFound,
    StoreError,
    TaskAlreadyExists,
    WaitingMove,
)
from chongming_redis.model import TaskStatus, Transition
from chongming_redis.parents import release, release_reason
from chongming_redis.stores._sql import limits, tasks
from chongming_redis.stores._sql import unique as uniques
from chongming_redis.stores._sql.feed import FeedPositions
from chongming_redis.stores._sql.rows import (
    TASK_SELECT,
    claimed_unique,
    decode_task,
    integer,
    text,
)
from chongming_redis.stores._sql.schema import FINAL_STATUSES, MAX_IN_LIST, Tx, store_clock_us
from chongming_redis.stores.codec import (
    Row,
    decode_dt,
    snapshot_to_row,
    transition_to_row,
)
from chongming_redis.stores.dependency_store import RELEASE_STEP, check_release_limit

_WAITING = TaskStatus.WAITING.value


class SqlDependencies:
    """The ``DependenciesStore`` methods, mixed into ``SqlTaskStore`` (the duties on its writes
    are ``Duties``, which ``create``, ``save`` and ``commit_tasks`` run)."""

    if TYPE_CHECKING:  # provided by SqlTaskStore

        def _writing(self) -> AbstractContextManager[tuple[Tx, FeedPositions]]: ...

        def _reading(self) -> AbstractContextManager[Tx]: ...

    def release_dependents(self, *, limit: int = RELEASE_STEP) -> int:
        """Apply the recorded ends to up to ``limit`` waiting children, oldest end first, in
        one write transaction; how many children were judged."""
        size = check_release_limit(limit)
        with self._writing() as (tx, feed):
            return Duties(tx, feed).release_dependents(size)

    def release_backlog(self) -> int:
        with self._reading() as tx:
            ((count,),) = tx.rows("SELECT COUNT(*) FROM edge_releases")
        return int(count)


def _parents(row: Row) -> list[str]:
    value = row.get("parents")
    return [] if value is None else [str(p) for p in json.loads(text(value))]


class Duties:
    """The dependency duties of the writes of one transaction (``tasks.WriteDuties``):
    ``before`` each task write, ``after`` it; and the release walk."""

    def __init__(self, tx: Tx, feed: FeedPositions) -> None:
        self._tx, self._feed = tx, feed
        self._now_us: int | None = None  # the store's clock, read once
        #: task id -> its stored status before the write (``None``: a create), and the final
        #: statuses of a created child's parents that had ended.
        self._previous: dict[str, str | None] = {}
        self._ended_parents: dict[str, list[tuple[str, str]]] = {}
        #: The saved tasks that have parents (the others have no edge rows to drop).
        self._with_edges: set[str] = set()

    # -- before a write ----------------------------------------------------------------------

    def before(self, row: Row, expect: int | None) -> StoreError | None:
        """Why writing ``row`` (a create when ``expect`` is ``None``) breaks a dependency rule,
        judged on the rows as the writes before it left them; ``None`` if it does not (and a
        write that fails for another reason is left to report it)."""
        self._feed.lock()  # the head before any task row (FeedPositions.lock)
        task_id, status = text(row["task_id"]), text(row["status"])
        if expect is None:
            self._previous[task_id] = None
            return self._create_error(row, task_id) if status == _WAITING else None
        found = self._tx.rows(
            f"SELECT status, status_version, parents IS NOT NULL FROM tasks WHERE task_id = ?"
            f"{self._tx.dialect.for_update}",
            [task_id],
        )
        if not found or integer(found[0][1], "tasks/" + task_id, "status_version") != expect:
            return None  # the save's own compare-and-set refuses it
        stored = text(found[0][0])
        self._previous[task_id] = stored
        if found[0][2]:  # created WAITING: it has edge rows until it is final
            self._with_edges.add(task_id)
        entering = status == _WAITING and stored != _WAITING
        leaving = stored == _WAITING and status != _WAITING and status not in FINAL_STATUSES
        if not (entering or leaving):
            return None
        return self._unique_error(row, task_id) or WaitingMove(task_id, stored, status)

    def _create_error(self, row: Row, task_id: str) -> StoreError | None:
        parents = _parents(row)
        statuses: dict[str, str] = {}
        for start in range(0, len(parents), MAX_IN_LIST):
            in_chunk, params = self._tx.dialect.member_of(
                "task_id", parents[start : start + MAX_IN_LIST]
            )
            for parent, status in self._tx.rows(
                f"SELECT task_id, status FROM tasks WHERE {in_chunk}", params
            ):
                statuses[text(parent)] = text(status)
        missing = next((p for p in parents if p not in statuses), None)
        if missing is None:
            self._ended_parents[task_id] = [
                (p, statuses[p]) for p in parents if statuses[p] in FINAL_STATUSES
            ]
            return None
        # The id and the unique id first, as every store judges them.
        if tasks.stored_version(self._tx, task_id) is not None:
            return TaskAlreadyExists(task_id)
        return self._unique_error(row, task_id) or ParentNotFound(task_id, missing)

    def _unique_error(self, row: Row, task_id: str) -> StoreError | None:
        unique = claimed_unique(row)
        holder = None if unique is None else uniques.holder(self._tx, unique)
        if unique is None or holder is None or holder == task_id:
            return None
        return uniques.taken(self._tx, unique, holder)

    # -- after a write -----------------------------------------------------------------------

    def after(self, row: Row) -> list[Row]:
        """Keep the edges in step with the write of ``row`` (``before`` judged it) and apply
        what it ends, up to ``RELEASE_STEP`` children; returns the rows of the children moved
        (a caller following unique ids follows them too)."""
        task_id, status = text(row["task_id"]), text(row["status"])
        previous = self._previous.pop(task_id, None)
        moved: list[Row] = []
        if previous is None:
            ended = self._ended_parents.pop(task_id, None)
            if status == _WAITING and ended is not None:
                self._wait(task_id, _parents(row), ended, moved)
        elif (
            previous not in FINAL_STATUSES
            and status in FINAL_STATUSES
            and self._ended(task_id, status, has_edges=task_id in self._with_edges)
        ):
            self._release_from([task_id], RELEASE_STEP, moved)
        self._with_edges.discard(task_id)
        return moved

    def _wait(
        self, child: str, parents: list[str], ended: list[tuple[str, str]], moved: list[Row]
    ) -> None:
        step = MAX_IN_LIST // 3
        for start in range(0, len(parents), step):
            chunk = parents[start : start + step]
            self._tx.run(
                "INSERT INTO task_edges (child_id, parent_id, met) VALUES"
                f" {', '.join(['(?, ?, ?)'] * len(chunk))}",
                [value for parent in chunk for value in (child, parent, 0)],
            )
        # A parent that has ended already is applied at once (a new task has no children
        # yet, so ending it here starts no release of its own).
        for parent, outcome in ended:
            self._apply(child, parent, outcome, moved)

    def _ended(self, task_id: str, status: str, *, has_edges: bool = True) -> bool:
        """A task reached a final status: it stops waiting (its edges go, so its parents may
        be pruned) and its end is recorded for its waiting children; whether it has any.
        ``has_edges``: it was created with parents (a task without has no edge rows: the end
        of most tasks costs one probe, not a delete too)."""
        tx = self._tx
        if has_edges:
            tx.run("DELETE FROM task_edges WHERE child_id = ?", [task_id])
        if not tx.rows(
            "SELECT 1 FROM task_edges WHERE parent_id = ? AND met = ? LIMIT 1", [task_id, 0]
        ):
            return False
        tx.run(
            "INSERT INTO edge_releases (parent_id, outcome, at_us) VALUES (?, ?, ?)"
            " ON CONFLICT (parent_id) DO UPDATE SET outcome = excluded.outcome",
            [task_id, status, self._clock()],
        )
        return True

    def _apply(self, child: str, parent: str, outcome: str, moved: list[Row]) -> bool:
        """Apply ``parent``'s end (``outcome``) to ``child``; whether that ended the child
        with children of its own waiting."""
        tx = self._tx
        if not tx.run(
            "UPDATE task_edges SET met = ? WHERE child_id = ? AND parent_id = ? AND met = ?",
            [1, child, parent, 0],
        ):
            return False
        found = tx.rows(
            f"SELECT {TASK_SELECT} FROM tasks WHERE task_id = ?{tx.dialect.for_update}", [child]
        )
        if not found:
            return False
        snapshot = decode_task(found[0])
        if snapshot.status is not TaskStatus.WAITING:
            return False
        unmet = len(tx.rows(
            "SELECT 1 FROM task_edges WHERE child_id = ? AND met = ? LIMIT 1", [child, 0]
        ))  # fmt: skip
        decision = release(snapshot.on_parent_failure, outcome, unmet)
        if decision is None:
            return False
        now = decode_dt(self._clock())
        version = snapshot.status_version + 1
        row = snapshot_to_row(
            snapshot.evolve(status=TaskStatus(decision), status_version=version, updated_at=now)
        )
        error = tasks.save(tx, self._feed, row, snapshot.status_version)
        if error is not None:  # the row is locked and WAITING holds its unique id already
            raise StoreError(f"tasks/{child}: the release was refused: {error}")
        reason = release_reason(decision, parent, outcome)
        entry = Transition(child, version, TaskStatus.WAITING, TaskStatus(decision), now, reason)
        tasks.append(tx, [transition_to_row(entry)])
        limits.sync(tx, [(row, False)])
        moved.append(row)
        return decision == "stopped" and self._ended(child, decision)

    # -- the release walk --------------------------------------------------------------------

    def _release_from(self, queue: list[str], budget: int, moved: list[Row]) -> int:
        """Apply the recorded ends of the parents in ``queue`` (and of the children that end
        along the way), to at most ``budget`` children; what is left stays recorded."""
        tx, done = self._tx, 0
        while queue and done < budget:
            parent = queue[0]
            found = tx.rows("SELECT outcome FROM edge_releases WHERE parent_id = ?", [parent])
            waiting: Sequence[tuple[object, ...]] = []
            if found:
                waiting = tx.rows(
                    "SELECT child_id FROM task_edges WHERE parent_id = ? AND met = ?"
                    " ORDER BY child_id LIMIT ?",
                    [parent, 0, budget - done + 1],
                )
            taken = waiting[: budget - done]
            for (child,) in taken:
                done += 1
                if self._apply(text(child), parent, text(found[0][0]), moved):
                    queue.append(text(child))
            if len(taken) < len(waiting):
                break  # the step is spent: the rest stays recorded
            tx.run("DELETE FROM edge_releases WHERE parent_id = ?", [parent])
            queue.pop(0)
        return done

    def release_dependents(self, limit: int) -> int:
        self._feed.lock()  # the head before any task row (FeedPositions.lock)
        done, moved = 0, list[Row]()
        while done < limit:
            queue = [text(p) for (p,) in self._tx.rows(
                "SELECT parent_id FROM edge_releases ORDER BY at_us, parent_id LIMIT ?", [limit]
            )]  # fmt: skip
            if not queue:
                break
            done += self._release_from(queue, limit - done, moved)
        return done

    def _clock(self) -> int:
        """The store's clock (µs), read once per transaction: the database server's where
        it has one (``Dialect.clock_us``), else this machine's (SQLite's)."""
        if self._now_us is None:
            self._now_us = store_clock_us(self._tx)
        return self._now_us
