"""The nudge listener (``runtime/notify.RedisNotifier``, also PostgreSQL's through
``stores/_sql/pg_nudges.py``): a nudge sent while its connection was down never arrives, so
once it listens again it wakes every listener once (a spurious wake costs one start pass; a
missed one, a task waiting for the next poll)."""

from __future__ import annotations

import threading
from typing import Any

from chongming_redis.runtime.notify import RedisNotifier


class FlakyPubSub:
    """The first subscription's connection drops at its first read; later ones are quiet."""

    def __init__(self, owner: FlakyClient) -> None:
        self.owner = owner
        self.drops = owner.connections == 1

    def subscribe(self, *channels: str) -> None:
        self.owner.subscribed.append(set(channels))

    def get_message(self, timeout: float) -> Any:
        if self.drops:
            raise ConnectionError("connection lost")
        threading.Event().wait(timeout)
        return None

    def close(self) -> None:
        pass


class FlakyClient:
    def __init__(self) -> None:
        self.connections = 0
        self.subscribed: list[set[str]] = []

    def pubsub(self, **options: Any) -> FlakyPubSub:
        self.connections += 1
        return FlakyPubSub(self)

    def publish(self, channel: str, message: bytes) -> None:
        pass


def test_a_listener_that_reconnects_wakes_its_listeners_once() -> None:
    client = FlakyClient()
    notifier = RedisNotifier(client, "ns")
    work, pool = threading.Event(), threading.Event()
    notifier.subscribe("work", work)
    notifier.subscribe("pool", pool)
    try:
        assert work.wait(10) and pool.wait(10), "woken after the reconnect"
        assert client.connections == 2
        assert client.subscribed[-1] == {"{ns}:nudge:work", "{ns}:nudge:pool"}
        work.clear()
        assert not work.wait(0.3), "once: a quiet connection wakes nobody"
    finally:
        notifier.close()


def test_a_listener_that_never_lost_its_connection_wakes_nobody() -> None:
    client = FlakyClient()
    client.connections = 1  # its first pubsub is the second: never drops
    notifier = RedisNotifier(client, "ns")
    work = threading.Event()
    notifier.subscribe("work", work)
    try:
        assert notifier.wait_listening(5)
        assert not work.wait(0.3)
    finally:
        notifier.close()
