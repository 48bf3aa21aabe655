"""``ShutdownSignals``: SIGTERM/SIGINT counted for ``Controller.run_forever``: the first asks
for a graceful shutdown, a second for handing the running tasks back at once; a repeat within
``same_within`` seconds of the first is the same request (a worker under a ``--processes``
parent gets one Ctrl-C both directly and through the parent)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

log = logging.getLogger("chongming_redis.runtime")


class ShutdownSignals:
    def __init__(self, owner: str, grace: float, same_within: float = 0.0) -> None:
        self.owner, self.grace, self.same_within = owner, grace, same_within
        self.count = 0
        self._first = 0.0
        self.stop = threading.Event()  # set by the first signal

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.count == 1 and now - self._first < self.same_within:
            return
        self.count += 1
        if self.count == 1:
            self._first = now
            log.warning("%s: signal %d, shutting down (grace %.0fs)", self.owner, signum,
                        self.grace)  # fmt: skip
        self.stop.set()

    @property
    def again(self) -> bool:
        """A second request came (hand the running tasks back now)."""
        return self.count > 1
