"""``ServerClock`` and a slow measurement: a store call that waited seconds (for a restarting
PostgreSQL, or a free connection of its pool) measures the offset with an error of up to half
its round trip. Found by the stress run on PostgreSQL (``stress --store postgresql``): a worker
whose clock was measured during the server's restart ran ~2.5 s ahead for the 30 s until its
next resync, so its leases and deadlines were written that much late and a timeout was ended
past the run's bound. A slow measurement now replaces only an offset measured no better, and
is measured again a second later."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from chongming_redis.runtime import clock
from chongming_redis.runtime.clock import SLOW_RETRY, ServerClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: The store's clock is this far ahead of the process's.
OFFSET = timedelta(seconds=10)


class _Time:
    """The process's wall clock (``clock.datetime``) and monotonic clock, moved by hand."""

    wall = T0
    mono = 0.0

    @classmethod
    def now(cls, tz: object = None) -> datetime:
        return cls.wall


class _Source:
    """A store whose every answer takes ``took`` seconds and reads its clock at the end (the
    worst case: the call waited, then the server answered at once)."""

    def __init__(self) -> None:
        self.took = 0.0

    def server_time(self) -> datetime:
        _Time.wall += timedelta(seconds=self.took)
        return _Time.wall + OFFSET


@pytest.fixture
def source(monkeypatch: pytest.MonkeyPatch) -> _Source:
    _Time.wall, _Time.mono = T0, 0.0
    monkeypatch.setattr(clock, "datetime", _Time)
    monkeypatch.setattr(clock, "time", SimpleNamespace(monotonic=lambda: _Time.mono))
    return _Source()


def test_a_slow_measurement_does_not_replace_a_quick_one(source: _Source) -> None:
    server_clock = ServerClock(source, resync=30.0)
    server_clock.sync()  # quick: exact
    assert server_clock.offset == OFFSET
    source.took = 5.0
    server_clock.sync()  # 5 s waiting for the server: the midpoint is 2.5 s off
    assert server_clock.offset == OFFSET
    _Time.mono += SLOW_RETRY + 0.01
    assert server_clock.stale  # measured again soon, not after 30 s


def test_a_slow_first_measurement_is_used_until_a_quick_one(source: _Source) -> None:
    server_clock = ServerClock(source, resync=30.0)
    source.took = 5.0
    server_clock.sync()  # nothing better yet (a clock 300 s off needs it at once)
    assert server_clock.offset == OFFSET + timedelta(seconds=2.5)
    assert not server_clock.stale
    _Time.mono += SLOW_RETRY + 0.01
    assert server_clock.stale
    source.took = 0.0
    server_clock.now()  # stale: measures again, quickly this time
    assert server_clock.offset == OFFSET
    _Time.mono += SLOW_RETRY + 0.01
    assert not server_clock.stale  # a quick measurement lasts its resync
