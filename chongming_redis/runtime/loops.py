"""``every``: the one shape of the runtime's polling threads (starter, commands, reconciler):
wait for the interval or a nudge, run the body, log a store failure and go on.

``OUTAGE`` keeps the log of a store outage short: every thread of a worker fails at once and
keeps failing on each tick until the store is back. The first failure is logged, then at most
one summary line per ``summary_every`` seconds with the count, and one line when a call that
always reaches the store succeeds again ("reconnected to Redis after 12.0 s"; SQLite,
PostgreSQL, or "the store" for another one: ``store_name``): the pool heartbeat, and the loops
started with ``reaches_store=True``. (A loop whose body may return without a store call, the
starter with every slot taken, cannot tell that the store is back.) Without any such success,
a failure ``2 * summary_every`` seconds after the last one starts a new outage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from chongming_redis.errors import StoreError, StoreUnavailable
from chongming_redis.runtime.events import NO_EVENTS, WorkerEvents

log = logging.getLogger("chongming_redis.runtime")

#: The name an outage line gives each built-in store, by the module of its class (the runtime
#: imports no store).
_STORE_NAMES = {
    "chongming_redis.stores.redis": "Redis",
    "chongming_redis.stores.sqlite": "SQLite",
    "chongming_redis.stores.postgres": "PostgreSQL",
}


def store_name(store: object) -> str:
    """``Redis``, ``SQLite``, ``PostgreSQL``, or ``the store`` for any other store."""
    return _STORE_NAMES.get(type(store).__module__, "the store")


class OutageLog:
    """The process's view of a store outage, for the log; shared by its threads."""

    def __init__(
        self,
        *,
        summary_every: float = 15.0,
        logger: logging.Logger = log,
        clock: Callable[[], float] = time.monotonic,
        store: str = "Redis",
    ) -> None:
        self.summary_every = summary_every
        #: What the lines call the store (``store_name``; a ``Controller`` sets it).
        self.store = store
        self.logger = logger
        self.clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the outage began; None: no outage
        self._failures = 0  # in the whole outage
        self._unlogged = 0  # since the last line
        self._last_line = 0.0
        self._last_failure = 0.0

    @property
    def in_outage(self) -> bool:
        return self._since is not None

    def failed(self, what: str, exc: BaseException) -> None:
        """A call failed because the store could not be reached (``what`` failed)."""
        now = self.clock()
        with self._lock:
            if self._since is not None and now - self._last_failure > 2 * self.summary_every:
                self._since = None  # over long ago, with no success reported: a new one
            self._last_failure = now
            if self._since is None:
                self._since, self._last_line, self._unlogged, self._failures = now, now, 0, 1
                self.logger.warning("cannot %s: %s (further failures are summarised every "
                                    "%.0f s until %s answers)",
                                    what, exc, self.summary_every, self.store)  # fmt: skip
                return
            self._failures += 1
            self._unlogged += 1
            if now - self._last_line < self.summary_every:
                return
            count, self._unlogged, self._last_line = self._unlogged, 0, now
            down_for = now - self._since
        self.logger.warning("%s still unreachable after %.0f s (%d more failed call(s); "
                            "last: cannot %s: %s)", self.store[:1].upper() + self.store[1:],
                            down_for, count, what, exc)  # fmt: skip

    def succeeded(self) -> bool:
        """A store call succeeded: ends an outage, if there was one (then True: the caller
        counts the reconnect, once per outage and process)."""
        if self._since is None:  # the common case, without the lock
            return False
        with self._lock:
            if self._since is None:
                return False
            down_for, failures = self.clock() - self._since, self._failures
            self._since, self._failures, self._unlogged = None, 0, 0
        self.logger.info("reconnected to %s after %.1f s (%d failed call(s))",
                         self.store, down_for, failures)  # fmt: skip
        return True


#: One per process: a worker's threads report into it, so an outage is logged once.
OUTAGE = OutageLog()

#: The starter's poll while work is arriving, on a store without nudges (SQLite)...
BUSY_POLL = 0.02
#: ... for this long after the last pass that started a task, then its idle interval again.
BUSY_FOR = 2.0


class BusyPoll:
    """The starter's interval on a store without nudges: tasks come in bursts, so for
    ``busy_for`` seconds after a pass started one it looks every ``busy`` seconds (a task
    submitted by another process meanwhile starts within ``busy``), then every ``idle``."""

    def __init__(
        self,
        idle: float,
        *,
        busy: float | None = None,
        busy_for: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle, self.busy = idle, min(BUSY_POLL if busy is None else busy, idle)
        self.busy_for = BUSY_FOR if busy_for is None else busy_for  # read now: a bench sets it
        self._clock = clock
        self._busy_until = float("-inf")

    def started(self, count: int) -> None:
        """A pass started ``count`` tasks: more are likely to follow."""
        if count > 0:
            self._busy_until = self._clock() + self.busy_for

    def interval(self) -> float:
        return self.busy if self._clock() < self._busy_until else self.idle


def every(
    interval: float | Callable[[], float],
    body: Callable[[], object],
    *,
    running: threading.Event,
    wake: threading.Event,
    what: str,
    reaches_store: bool = False,
    outage: OutageLog = OUTAGE,
    events: WorkerEvents = NO_EVENTS,
    operation: str = "",
) -> None:
    """Run ``body`` every ``interval`` seconds (or as often as ``interval()`` says before each
    wait), or at once when ``wake`` is set, while
    ``running`` is set. A ``StoreError`` is logged (``what`` says what failed) and the loop
    goes on: the store may come back. An unreachable store goes to ``outage``, which logs it
    rate-limited; ``reaches_store``: every run of ``body`` calls the store, so its success
    ends an outage. ``events`` hears of each failure (as ``operation``) and of the reconnect."""
    while running.is_set():
        wake.wait(interval() if callable(interval) else interval)
        wake.clear()
        if not running.is_set():
            return
        try:
            body()
        except StoreUnavailable as exc:
            events.store_error(operation)
            outage.failed(what, exc)
        except StoreError as exc:
            events.store_error(operation)
            log.warning("cannot %s: %s", what, exc)
        else:
            if reaches_store and outage.succeeded():
                events.reconnected()
