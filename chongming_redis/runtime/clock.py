"""One clock for leases: the store's (the Redis server's ``TIME``), not the worker's.

A worker whose own clock is minutes off would otherwise write leases that are already expired
(or far in the future) and get its tasks marked LOST early (or never). ``ServerClock`` measures
the offset between this process's clock and the store's every ``resync`` seconds and adds it.
A store without a clock (not a ``ServerClockStore``) leaves this process's clock in use.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable
from datetime import datetime, timedelta, timezone
from typing import Protocol


class TimeSource(Protocol):
    def server_time(self) -> datetime | None:
        """The store's time, or ``None`` when it has no clock of its own (``StoreAdapter``)."""
        ...


class AsyncTimeSource(Protocol):
    def server_time(self) -> Awaitable[datetime | None]:
        """``TimeSource`` for an asyncio caller (``AsyncRedisTaskStore``)."""
        ...


#: A measurement is off by up to half its round trip (the store's reading may have been taken
#: anywhere in it). One slower than this (seconds: a call that waited for a restarting server or
#: a free connection, seconds long on PostgreSQL) replaces only an offset measured no better,
#: and the clock measures again ``SLOW_RETRY`` seconds later instead of ``resync``.
SLOW_ROUND_TRIP = 0.5
SLOW_RETRY = 1.0


class _Offset:
    """The offset between this process's clock and the store's, and when it was measured."""

    def __init__(self, resync: float) -> None:
        self._resync = resync
        self._offset = timedelta(0)
        self._error = timedelta.max  # half the round trip of the offset's measurement
        self._synced_at = -float("inf")
        self._lock = threading.Lock()

    @property
    def stale(self) -> bool:
        return time.monotonic() - self._synced_at > self._resync

    def _record(self, before: datetime, server: datetime | None, after: datetime) -> None:
        if server is None:  # no store clock: this process's own
            self._synced_at = time.monotonic()
            return
        error = (after - before) / 2
        slow = error.total_seconds() > SLOW_ROUND_TRIP / 2
        with self._lock:
            if not slow or error <= self._error:
                self._offset = server - (before + error)
                self._error = error
            self._synced_at = time.monotonic() - (self._resync - SLOW_RETRY if slow else 0.0)

    def _read(self) -> datetime:
        return datetime.now(timezone.utc) + self._offset

    @property
    def offset(self) -> timedelta:
        return self._offset


class ServerClock(_Offset):
    def __init__(self, source: TimeSource, *, resync: float = 30.0) -> None:
        super().__init__(resync)
        self._source = source

    def now(self) -> datetime:
        if self.stale:
            self.sync()
        return self._read()

    def sync(self) -> None:
        """Measure the offset; keeps the last one if the store cannot be reached."""
        try:
            before = datetime.now(timezone.utc)
            server = self._source.server_time()
            after = datetime.now(timezone.utc)
        except Exception:  # a blip: keep the old offset, try again on the next call
            return
        self._record(before, server, after)


class AsyncServerClock(_Offset):
    """``ServerClock`` for an asyncio caller: ``await clock.now()``."""

    def __init__(self, source: AsyncTimeSource, *, resync: float = 30.0) -> None:
        super().__init__(resync)
        self._source = source

    async def now(self) -> datetime:
        if self.stale:
            await self.sync()
        return self._read()

    async def sync(self) -> None:
        try:
            before = datetime.now(timezone.utc)
            server = await self._source.server_time()
            after = datetime.now(timezone.utc)
        except Exception:  # a blip: keep the old offset, try again on the next call
            return
        self._record(before, server, after)
