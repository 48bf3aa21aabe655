"""``Window``: how many started tasks a worker process may have outstanding (the runner's
slots plus the measured prefetch)."""

from __future__ import annotations

import math


class Window:
    """How many started tasks a process may have outstanding: ``concurrency`` running, plus a
    prefetch sized like a bandwidth-delay product — the tasks the slots finish during one
    start round trip, ``concurrency * round_trip / run_time`` rounded down (at most
    ``prefetch``). A worker of short tasks starts its next batch while the current one runs (a
    no-op drain would otherwise wait one round trip per ``concurrency`` tasks); a worker of
    tasks longer than ``concurrency`` round trips prefetches nothing, so no task waits behind a
    long one while another worker could run it. The round trip is a moving average; the run
    time rises at once with a longer task and falls slowly, so a switch to long tasks closes
    the window at the first one. Before both are measured there is no prefetch."""

    def __init__(self, concurrency: int, prefetch: int, weight: float = 0.2) -> None:
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.weight = weight
        self.run_time: float | None = None
        self.round_trip_time: float | None = None

    def ran(self, seconds: float) -> None:
        # Up at once, down slowly: one long task closes the window before the next batch.
        if self.run_time is None or seconds > self.run_time:
            self.run_time = seconds
        else:
            self.run_time = self._average(self.run_time, seconds)

    def round_trip(self, seconds: float) -> None:
        self.round_trip_time = self._average(self.round_trip_time, seconds)

    def size(self) -> int:
        if not self.prefetch or self.run_time is None or self.round_trip_time is None:
            return self.concurrency
        wanted = self.concurrency * self.round_trip_time / max(self.run_time, 1e-6)
        return self.concurrency + min(self.prefetch, math.floor(wanted))

    def _average(self, old: float | None, sample: float) -> float:
        return sample if old is None else old + self.weight * (sample - old)
