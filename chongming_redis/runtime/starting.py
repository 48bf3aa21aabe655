"""``Starting``: how a ``Runner`` starts tasks into its free slots (mixed into ``Runner``).

The starter thread's pass (``start_available``: the served buckets first, then, in a bucket pool,
the others), the start a group commit makes into the slots it frees (``start_with_commit``, sent
by ``TaskWriter.flush_many`` in the commit's own call), holding what a start moved to ``RUNNING``
(``take``), and how long the group committer waits for running tasks to join its call
(``linger``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from chongming_redis.model import TaskSnapshot, Transition
from chongming_redis.runtime.store_adapter import Started

if TYPE_CHECKING:
    from chongming_redis.runtime.app import App
    from chongming_redis.runtime.config import ControllerConfig
    from chongming_redis.runtime.held import Held
    from chongming_redis.runtime.window import Window
    from chongming_redis.runtime.writer import TaskWriter

#: The longest the group committer waits for running tasks to end and join its call (seconds).
MAX_LINGER = 0.002


class Starting:
    writer: TaskWriter
    config: ControllerConfig
    app: App
    num_buckets: int
    serving: Callable[[], frozenset[int] | None]
    look_elsewhere: Callable[[], bool]
    accepting: threading.Event
    wake_starter: threading.Event
    _starting: threading.Lock
    _window: Window
    _outstanding: int
    _busy: int
    _look_elsewhere_at: float

    if TYPE_CHECKING:

        def _hold(
            self, running: TaskSnapshot, renewed_at: float | None, pending: list[Transition]
        ) -> Held: ...

    def start_available(self, *, wait: bool = True) -> int:
        """Start as many due ``PENDING`` tasks as there are free slots (plus the prefetch, if
        one is configured), first from the buckets this worker serves, then — in a bucket
        pool (``look_elsewhere``), when those leave slots free — from the other buckets (work
        conservation: an idle slot takes due work another worker's buckets hold, or tasks of
        a type their owner cannot run; the compare-and-set start keeps it exactly-once). A
        look at the other buckets that found nothing waits one start interval before the
        next. Returns how many started. One call at a time: a caller waits for the call under
        way, unless ``wait`` is false (the committer): it then starts nothing and wakes the
        starter, which counts the slots again once that call is done (the starter's loop
        clears its wake before each pass, so the wake is not lost, and it waits, not spins)."""
        if not self._starting.acquire(blocking=wait):
            self.wake_starter.set()
            return 0
        try:
            return self._start_available()
        finally:
            self._starting.release()

    @contextmanager
    def start_turn(self) -> Iterator[bool]:
        """The one-start-call-at-a-time turn, if it is free (the group committer's start in
        its commit call): yields whether it was taken, released on leaving."""
        taken = self._starting.acquire(blocking=False)
        try:
            yield taken
        finally:
            if taken:
                self._starting.release()

    def wait_for_start(self) -> None:
        """Return once no start call is under way (shutdown: no start lands after it)."""
        with self._starting:
            pass

    def _start_available(self) -> int:
        free = self._window.size() - self._outstanding
        if free <= 0 or not self.accepting.is_set() or not self.app.types:
            return 0
        buckets = self.serving()
        started = self._start_from(buckets, free) if buckets is None or buckets else 0
        if (buckets is None or started >= free or not self.look_elsewhere()
                or time.monotonic() < self._look_elsewhere_at):  # fmt: skip
            return started
        others = frozenset(range(self.num_buckets)) - buckets
        taken = self._start_from(others, free - started) if others else 0
        if not taken:
            self._look_elsewhere_at = time.monotonic() + self.config.start_poll_interval
        return started + taken

    def _start_from(self, buckets: frozenset[int] | None, free: int) -> int:
        renewed_at = time.monotonic()
        started = self.writer.adapter.start(**self._start_args(buckets, free))
        if started:
            self._window.round_trip(time.monotonic() - renewed_at)
        self.take(started, renewed_at)
        return len(started)

    def _start_args(self, buckets: frozenset[int] | None, limit: int) -> dict[str, Any]:
        now = self.writer.clock.now()
        return {"now": now, "lease_until": now + timedelta(seconds=self.config.task_lease),
                "buckets": buckets, "num_buckets": self.num_buckets, "limit": min(limit, 100),
                "names": frozenset(self.app.types)}  # fmt: skip

    def start_with_commit(self, freed: int) -> dict[str, Any] | None:
        """The start a group commit of ``freed`` slots' tasks makes in its own call (the
        ``StoreAdapter.start`` arguments, for ``TaskWriter.flush_many``), from the buckets
        this worker serves; ``None`` when nothing may start (shutting down, no task types, no
        buckets). Those slots are taken over by the tasks it starts, so this start counts no
        free slots: the starter thread fills the others."""
        if freed <= 0 or not self.accepting.is_set() or not self.app.types:
            return None
        buckets = self.serving()
        if buckets is not None and not buckets:
            return None
        return self._start_args(buckets, freed)

    def take(self, started: list[Started], renewed_at: float) -> None:
        """Hold the tasks a start (``renewed_at``: when it was sent) moved to ``RUNNING``;
        where the start could not write the lease or the history, it is written now."""
        for one in started:
            held = self._hold(one.snapshot, renewed_at if one.leased else None, one.unwritten)
            if not one.leased:
                self.writer.renew_lease(held)
            if held.pending:
                self.writer.flush(held)

    def running(self) -> int:
        """How many slots run a task's function now."""
        return self._busy

    def took(self, seconds: float) -> None:
        """A group commit's round trip took ``seconds`` (``linger`` follows it)."""
        self._window.round_trip(seconds)

    def linger(self) -> float:
        """How long the group committer may wait, after a task ended, for the tasks still
        running to end too and join its call: up to one round trip (at most ``MAX_LINGER``),
        and only while tasks usually run shorter than that; 0 before both are measured."""
        run, trip = self._window.run_time, self._window.round_trip_time
        if run is None or trip is None:
            return 0.0
        bound = min(trip, MAX_LINGER)
        return bound if run < bound else 0.0
