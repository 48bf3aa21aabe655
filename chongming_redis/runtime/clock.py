"""One clock for leases: the store's (the Redis server's ``TIME``), not the worker's.

A worker whose own clock is minutes off would otherwise write leases that are already expired
(or far in the future) and get its tasks marked LOST early (or never). ``ServerClock`` measures
the offset between this process's clock and the store's every ``resync`` seconds and adds it.
A store without a clock (not a ``ServerClockStore``) leaves this process's clock in use.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Protocol


class TimeSource(Protocol):
    def server_time(self) -> datetime | None:
        """The store's time, or ``None`` when it has no clock of its own (``StoreAdapter``)."""
        ...


class ServerClock:
    def __init__(self, source: TimeSource, *, resync: float = 30.0) -> None:
        self._source = source
        self._resync = resync
        self._offset = timedelta(0)
        self._synced_at = -float("inf")
        self._lock = threading.Lock()

    def now(self) -> datetime:
        if time.monotonic() - self._synced_at > self._resync:
            self.sync()
        return datetime.now(timezone.utc) + self._offset

    def sync(self) -> None:
        """Measure the offset; keeps the last one if the store cannot be reached."""
        try:
            before = datetime.now(timezone.utc)
            server = self._source.server_time()
            after = datetime.now(timezone.utc)
        except Exception:  # a blip: keep the old offset, try again on the next call
            return
        if server is None:  # no store clock: this process's own
            self._synced_at = time.monotonic()
            return
        with self._lock:
            self._offset = server - (before + (after - before) / 2)
            self._synced_at = time.monotonic()

    @property
    def offset(self) -> timedelta:
        return self._offset
