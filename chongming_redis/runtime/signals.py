"""``ShutdownSignals``: SIGTERM/SIGINT counted for ``Controller.run_forever``: the first asks
for a graceful shutdown, a second for handing the running tasks back at once; a repeat within
``same_within`` seconds of the first is the same request.

A worker forked by a ``--processes`` parent (``cli/worker_parent.py``) is given its control
pipe (``parent``): the parent's requests come through it (``b"1"`` graceful, ``b"2"`` hand
back now), and its end — the parent gone, however it died — asks for the graceful shutdown,
so no child outlives its parent. Signals that reach such a child directly (a terminal's
Ctrl-C reaches the whole process group, systemd may signal every process) ask for the
graceful shutdown only: the parent gets each of them once and passes a second one on."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

log = logging.getLogger("chongming_redis.runtime")

#: The parent's requests on the control pipe (``cli/worker_parent.py`` writes them).
GRACEFUL, NOW = b"1", b"2"


class ShutdownSignals:
    def __init__(
        self, owner: str, grace: float, same_within: float = 0.0, parent: int | None = None
    ) -> None:
        self.owner, self.grace, self.same_within = owner, grace, same_within
        self.parent = parent
        self.count = 0
        self._first = 0.0
        self.stop = threading.Event()  # set by the first request

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)
        if self.parent is not None:
            name = f"{self.owner}-parent"
            threading.Thread(target=self._watch_parent, name=name, daemon=True).start()

    def on_signal(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.count == 1 and (self.parent is not None or now - self._first < self.same_within):
            return  # the same request (under a parent, only the parent escalates)
        self._request(f"signal {signum}", again=self.count >= 1)

    def _request(self, why: str, *, again: bool) -> None:
        if again:
            self.count = max(self.count, 1) + 1
        elif self.count == 0:
            self.count = 1
            self._first = time.monotonic()
            log.warning("%s: %s, shutting down (grace %.0fs)", self.owner, why, self.grace)
        self.stop.set()

    def _watch_parent(self) -> None:
        assert self.parent is not None
        while True:
            try:
                data = os.read(self.parent, 64)
            except OSError:
                data = b""
            if not data:  # the parent is gone: nobody supervises this process any more
                self._request("the parent process is gone", again=False)
                return
            if NOW in data:
                self._request("the parent's second signal", again=True)
            elif GRACEFUL in data:
                self._request("the parent's signal", again=False)

    @property
    def again(self) -> bool:
        """A second request came (hand the running tasks back now)."""
        return self.count > 1
