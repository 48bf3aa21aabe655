"""``chongming-redis changes``: the feed as JSON lines, for scripts and pipes.

One JSON object per item (``wire.item_to_json``), then ``{"next_cursor": "N"}`` after every
non-empty page, so whoever reads the output can persist the cursor it got to (a run that finds
nothing new prints the cursor it was given). Without ``follow`` it reads until an empty page;
with ``follow`` it keeps polling until ``stop()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from chongming_redis.feed.wire import dumps, item_to_json
from chongming_redis.stores.protocol import ChangeFeed


def stream(
    feed: ChangeFeed,
    *,
    after: str,
    limit: int,
    follow: bool,
    write: Callable[[str], None],
    interval: float = 1.0,
    stop: Callable[[], bool] = lambda: False,
) -> str:
    """Print pages from ``after``; returns the last cursor."""
    cursor, printed = after, False
    while not stop():
        page = feed.changes(after=cursor, limit=limit)
        for item in page.tasks:
            write(dumps(item_to_json(item)))
        if page.tasks:
            cursor, printed = page.next_cursor, True
            write(dumps({"next_cursor": cursor}))
        elif not follow:
            break
        else:
            time.sleep(interval)
    if not printed:  # nothing new: still say where the reader stands
        write(dumps({"next_cursor": cursor}))
    return cursor
