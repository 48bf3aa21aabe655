"""``client.schedules``: the schedules of a namespace, for producers and operators
(``Client.schedules``; the CLI's ``chongming-redis schedules``).

Every method is one read and one compare-and-set write (``runtime/scheduling.py``), retried
when another writer moved first. Times are the store's clock. A store that keeps no schedules
(no ``SchedulesStore``) makes every method a ``TypeError`` naming it."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING

from chongming_redis.limits import BoundLimit
from chongming_redis.runtime import scheduling
from chongming_redis.runtime.notify import WORK
from chongming_redis.runtime.scheduling import StoredSchedule, TaskMaker
from chongming_redis.schedules import Schedule
from chongming_redis.stores.schedule_store import SchedulesStore

if TYPE_CHECKING:
    from chongming_redis.client.client import Client, TaskHandle


class Schedules:
    """``upsert``, ``get``, ``list``, ``pause``, ``resume``, ``trigger``, ``delete``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def upsert(self, schedule: Schedule) -> StoredSchedule:
        """Store ``schedule`` (new, or replacing the definition of that id: its outcomes and
        pause stay; a changed timing starts from the next tick). The task name is checked as
        a submit's (against the client's app, else the names the workers recorded:
        ``UnknownTask``) and so are its parameters (``InvalidParams``: against the app, else the
        schema its workers published); nothing is written then. The same definition again
        writes nothing."""
        if not isinstance(schedule, Schedule):
            raise TypeError(f"upsert takes a Schedule, not {type(schedule).__name__}")
        client = self._client
        name, task_type = client._drive(client._resolve_flow(schedule.task))
        client._drive(client._params_flow(name, task_type, [schedule.params]))
        return scheduling.upsert(self._store, schedule, client.clock.now, self._maker())

    def get(self, schedule_id: str) -> StoredSchedule | None:
        return scheduling.read(self._store, schedule_id)

    def list(self) -> builtins.list[StoredSchedule]:
        """Every schedule, by id."""
        return scheduling.read_all(self._store)

    def pause(self, schedule_id: str) -> StoredSchedule:
        """No tick fires while paused (``ScheduleNotFound`` for an unknown id)."""
        return scheduling.set_paused(self._store, schedule_id, True, self._client.clock.now)

    def resume(self, schedule_id: str) -> StoredSchedule:
        """Fire again from the next tick after now (the ticks of the pause are not fired)."""
        return scheduling.set_paused(self._store, schedule_id, False, self._client.clock.now)

    def trigger(self, schedule_id: str) -> TaskHandle:
        """Fire one tick now, paused or not: a task of its own id
        (``<id>@<now>.<µs>.trigger``), recorded as ``triggered``."""
        client = self._client
        task_id = scheduling.trigger(self._store, schedule_id, client.clock.now, self._maker())
        client._nudge(WORK)
        return client.handle(task_id)

    def delete(self, schedule_id: str) -> bool:
        """Remove the schedule; whether it existed. Its tasks stay. A worker whose app still
        registers it stores it again when it starts."""
        return self._store.delete_schedule(schedule_id)

    @property
    def _store(self) -> SchedulesStore:
        store = self._client.store
        if not isinstance(store, SchedulesStore):
            raise TypeError(f"{type(store).__name__} keeps no schedules (no SchedulesStore)")
        return store

    def _maker(self) -> TaskMaker:
        client = self._client
        buckets = client._drive(client._bucket_policy_flow())

        def recorded(name: str) -> tuple[BoundLimit, ...]:
            return client._drive(client._limits_flow(name, None))

        return TaskMaker(client.app, buckets, client.name, recorded)
