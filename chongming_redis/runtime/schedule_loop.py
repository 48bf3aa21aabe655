"""``ScheduleFirer``: a worker's part of the schedules. At start it stores the schedules its
app registered (``App.schedule``); then, every ``schedule_poll_interval``, it fires the due
schedules whose bucket it holds (``scheduling.fire_due``). The bucket of a schedule is its
id's, so the pool's ownership hand-over moves the duty with no election of its own; two
workers that both believe they hold a bucket still fire a tick once (the store's
compare-and-set). Times are the controller's server clock."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from chongming_redis.errors import StoreError
from chongming_redis.limits import BoundLimit
from chongming_redis.runtime import scheduling
from chongming_redis.runtime.app import App
from chongming_redis.runtime.buckets import BucketPolicy
from chongming_redis.runtime.events import WorkerEvents
from chongming_redis.runtime.limit_defs import DefinitionsCache, Recorded
from chongming_redis.runtime.loops import every, store_name
from chongming_redis.stores.schedule_store import SchedulesStore

log = logging.getLogger("chongming_redis.schedules")


class ScheduleFirer:
    def __init__(
        self,
        store: SchedulesStore,
        *,
        app: App,
        owner: str,
        buckets: BucketPolicy,
        now: Callable[[], datetime],
        serving: Callable[[], frozenset[int] | None],
        events: WorkerEvents,
        read_limits: Callable[[], Recorded | None] = lambda: None,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        """``serving``: the buckets this worker holds (``None``: every bucket);
        ``read_limits``: the recorded limit definitions (a tick of a type this app does not
        run is given the limits its own workers recorded, as a producer's submit is);
        ``wake``: called after a pass that created tasks (this worker's starter looks now)."""
        self.store = store
        self.app = app
        self.buckets = buckets
        self.now = now
        self.serving = serving
        self.events = events
        self.wake = wake
        self._limits, self._read_limits = DefinitionsCache(), read_limits
        self.maker = scheduling.TaskMaker(app, buckets, owner, self._recorded)

    def register(self) -> None:
        """Store the app's schedules (a changed definition replaces the stored one). A
        schedule of a task type the app does not run is refused, with nothing stored."""
        for schedule in self.app.schedules.values():
            self.app.get(schedule.task)  # UnknownTask: the worker refuses to start
        for schedule in self.app.schedules.values():
            scheduling.upsert(self.store, schedule, self.now, self.maker)

    def fire(self) -> None:
        """One pass over the schedules (``every`` calls it; a store error is its to log,
        anything else is logged here: the loop must outlive one bad pass)."""
        try:
            self._fire()
        except StoreError:
            raise
        except Exception:
            log.exception("schedules: a firing pass failed")

    def _fire(self) -> None:
        created = scheduling.fire_due(self.store, self.now, self.maker, owned=self._owned,
                                      report=self.events.schedule_ticks)  # fmt: skip
        if created:
            self.wake()

    def run(self, interval: float, running: threading.Event) -> None:
        """The loop: a pass every ``interval`` seconds while ``running`` is set."""
        every(interval, self.fire, running=running, wake=threading.Event(),
              what="fire schedules", events=self.events, operation="schedules")  # fmt: skip

    def _recorded(self, name: str) -> tuple[BoundLimit, ...]:
        if not self._limits.fresh():
            self._limits.update(self._read_limits())
        return self._limits.of(name)

    def _owned(self, schedule_id: str) -> bool:
        held = self.serving()
        return held is None or self.buckets.bucket_for(schedule_id) in held


def schedule_firer(store: object, *, app: App, **options: Any) -> ScheduleFirer | None:
    """The schedules' part of a worker on ``store``, its app's schedules stored
    (``UnknownTask``, ``InvalidParams``: refused, nothing has started); ``None`` on a store
    without schedules (``TypeError`` if the app registered some). ``options``: the
    ``ScheduleFirer``'s."""
    if not isinstance(store, SchedulesStore):
        if app.schedules:
            raise TypeError(f"{store_name(store)} keeps no schedules (no SchedulesStore)")
        return None
    firer = ScheduleFirer(store, app=app, **options)
    firer.register()
    return firer
