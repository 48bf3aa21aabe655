"""``Submitting``: how a ``Controller`` submits (``submit``, ``submit_many``): the same record
and first history entry as ``Client``'s (``runtime/submission.py``), written through the
controller's ``StoreAdapter`` and announced on its notifier."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from chongming_redis.errors import UniqueTaken
from chongming_redis.model import TaskSnapshot, Transition
from chongming_redis.runtime.app import App
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.clock import ServerClock
from chongming_redis.runtime.notify import WORK, LocalNotifier, RedisNotifier
from chongming_redis.runtime.store_adapter import StoreAdapter
from chongming_redis.runtime.submission import NewTask, new_task, with_parents
from chongming_redis.stores.extensions import keeps_unique_ids
from chongming_redis.stores.protocol import TaskStore


class Submitting:
    """The submit side of ``Controller`` (its attributes are the controller's)."""

    store: TaskStore
    app: App
    adapter: StoreAdapter
    clock: ServerClock
    buckets: BucketPolicy
    owner: str
    notifier: LocalNotifier | RedisNotifier

    def submit(
        self,
        name: str,
        params: Any = None,
        *,
        key: str | None = None,
        tags: Iterable[str] = (),
        task_id: str | None = None,
        pipeline_run_id: str | None = None,
        not_before: datetime | None = None,
        priority: int | None = None,
        **policies: Any,
    ) -> str:
        """Validate and create a ``PENDING`` task; returns its id (with ``unique`` held by an
        unfinished task: that task's id, nothing written). ``policies``: ``unique``, ``retry``,
        ``timeout``, ``retention``, ``after``, ``on_parent_failure`` as ``Client.submit``. A
        bad submit creates nothing: ``UnknownTask`` / ``InvalidParams`` / ``TypeError`` /
        ``ValueError``."""
        if policies.get("unique") is not None and not keeps_unique_ids(self.store):
            raise ValueError(f"{self.store!r} does not keep unique ids (it is no "
                             "TaskPoliciesStore): submit without unique=")  # fmt: skip
        policies = with_parents(self.store, policies)
        snapshot, transition = self._new_task(name, params, key=key, tags=tags,
                                              task_id=task_id, pipeline_run_id=pipeline_run_id,
                                              not_before=not_before, priority=priority,
                                              **policies)  # fmt: skip
        # The task and its first history entry: in one step where the store batches.
        (error,) = self.adapter.commit([(snapshot, None, [transition])], best_effort_history=True)
        if isinstance(error, UniqueTaken):
            return error.holder
        if error is not None:
            raise error
        self._nudge_work()
        return snapshot.task_id

    def submit_many(
        self, name: str, params_list: Iterable[Any], *, priority: int | None = None
    ) -> list[str]:
        """Submit one task per parameter set; on Redis up to 100 per round trip. Every set is
        validated before anything is written."""
        prepared = [self._new_task(name, params, priority=priority) for params in params_list]
        items = [(snapshot, None, [transition]) for snapshot, transition in prepared]
        errors = self.adapter.commit(items, best_effort_history=True)
        error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise error
        self._nudge_work()
        return [snapshot.task_id for snapshot, _ in prepared]

    def _nudge_work(self) -> None:
        """Wake idle workers, unless the store's create already did (one round trip)."""
        if self.adapter.nudge is None or not self.adapter.nudge.publishes_work:
            self.notifier.publish(WORK)

    def _new_task(
        self,
        name: str,
        params: Any,
        *,
        key: str | None = None,
        tags: Iterable[str] = (),
        task_id: str | None = None,
        pipeline_run_id: str | None = None,
        not_before: datetime | None = None,
        priority: int | None = None,
        **policies: Any,
    ) -> tuple[TaskSnapshot, Transition]:
        spec = NewTask(name, params, key=key, tags=tags, task_id=task_id, priority=priority,
                       pipeline_run_id=pipeline_run_id, not_before=not_before,
                       **policies)  # fmt: skip
        return new_task(spec, self.app.get(name), now=self.clock.now(), buckets=self.buckets,
                        submitted_by=self.owner)  # fmt: skip
