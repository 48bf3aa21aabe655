"""``every``: the one shape of the runtime's polling threads (starter, commands, reconciler):
wait for the interval or a nudge, run the body, log a store failure and go on."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from chongming_redis.errors import StoreError

log = logging.getLogger("chongming_redis.runtime")


def every(
    interval: float,
    body: Callable[[], object],
    *,
    running: threading.Event,
    wake: threading.Event,
    what: str,
) -> None:
    """Run ``body`` every ``interval`` seconds, or at once when ``wake`` is set, while
    ``running`` is set. A ``StoreError`` is logged (``what`` says what failed) and the loop
    goes on: the store may come back."""
    while running.is_set():
        wake.wait(interval)
        wake.clear()
        if not running.is_set():
            return
        try:
            body()
        except StoreError as exc:
            log.warning("cannot %s: %s", what, exc)
