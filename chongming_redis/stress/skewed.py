"""``python -m chongming_redis.stress.skewed worker APP ...``: ``chongming-redis`` (the same
arguments) in a process whose wall clock libfaketime moves; the stress run's ``clock_skew``
fault starts a worker this way with ``LD_PRELOAD=<libfaketime>``, ``FAKETIME=+300s`` (or
``-300s``) and ``FAKETIME_DONT_FAKE_MONOTONIC=1``.

libfaketime 0.9.10 (Debian) mangles the absolute ``clock_nanosleep(CLOCK_MONOTONIC,
TIMER_ABSTIME)`` that CPython 3.11's ``time.sleep`` uses: EINVAL with
``FAKETIME_DONT_FAKE_MONOTONIC`` (wolfcw/libfaketime#426). So before anything imports
``time.sleep`` by name (redis-py's ``retry`` module does), this module replaces it by a wait on a
``threading.Event``, which uses the unfaked monotonic clock, then runs ``chongming_redis.cli``
as ``__main__``. Only sleeping changes: every clock read (``datetime.now``, ``time.time``) still
sees the skewed time, and the runtime must correct it (``runtime/clock.py``).
"""

from __future__ import annotations

import runpy
import sys
import threading
import time


def _sleep_via_wait(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


def main() -> None:
    if "redis" in sys.modules:  # too late: redis.retry holds the real sleep
        raise RuntimeError("chongming_redis.stress.skewed must run before redis is imported")
    time.sleep = _sleep_via_wait  # type: ignore[assignment]
    runpy.run_module("chongming_redis.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
