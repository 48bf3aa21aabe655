"""Nudges: wake a process now instead of at its next poll (polling stays the fallback).

``RedisNotifier`` publishes on ``{ns}:nudge:<owner>`` (a command for a task that owner holds),
``{ns}:nudge:work`` (a task was submitted) and ``{ns}:nudge:pool`` (the bucket pool changed);
a listener thread sets events. It takes any client with redis-py's ``publish``/``pubsub``:
the Redis store's, or ``PostgresTaskStore``'s ``LISTEN``/``NOTIFY`` behind the same surface
(``NudgeStore.client``). Pub/sub is fire-and-forget: a lost nudge only delays the reaction to
the next poll; a lost listener connection is reopened every 0.5 s, polling covering the gap.
``LocalNotifier`` does the same inside one process (for ``InMemoryTaskStore``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, ClassVar

log = logging.getLogger("chongming_redis.runtime")

WORK = "work"
#: A worker joined, left or moved buckets: the bucket pool's members tick now.
POOL = "pool"


class LocalNotifier:
    _events: ClassVar[dict[tuple[int, str], list[threading.Event]]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, scope: object) -> None:
        self._scope = id(scope)
        self._mine: list[tuple[tuple[int, str], threading.Event]] = []

    def publish(self, topic: str) -> None:
        with self._lock:
            for event in self._events.get((self._scope, topic), []):
                event.set()

    def subscribe(self, topic: str, event: threading.Event) -> None:
        with self._lock:
            self._events.setdefault((self._scope, topic), []).append(event)
            self._mine.append(((self._scope, topic), event))

    def wait_listening(self, timeout: float) -> bool:
        return True  # in-process: a subscription is in place when subscribe returns

    def close(self) -> None:
        """Drop this notifier's own subscriptions (other controllers on the store keep theirs)."""
        with self._lock:
            for key, event in self._mine:
                events = self._events.get(key, [])
                if event in events:
                    events.remove(event)
                if not events:
                    self._events.pop(key, None)
            self._mine.clear()


class RedisNotifier:
    def __init__(self, client: Any, namespace: str) -> None:
        self._client = client
        self._prefix = "{" + namespace + "}:nudge:"
        self._events: dict[str, list[threading.Event]] = {}
        self._pubsub: Any = None
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        self._listening = threading.Event()  # every topic asked for so far is subscribed

    def publish(self, topic: str) -> None:
        try:
            self._client.publish(self._prefix + topic, b"1")
        except Exception as exc:  # a nudge is an optimisation; polling covers its loss
            log.debug("nudge %s not published: %s", topic, exc)

    def subscribe(self, topic: str, event: threading.Event) -> None:
        self._events.setdefault(self._prefix + topic, []).append(event)
        self._listening.clear()
        if self._thread is None:
            self._thread = threading.Thread(target=self._listen, name="nudges", daemon=True)
            self._thread.start()

    def _listen(self) -> None:
        subscribed: set[str] = set()
        deaf = False  # a connection was lost: nudges sent since then never reached us
        while not self._closed.is_set():
            try:
                if self._pubsub is None:
                    self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                    subscribed = set()
                missing = set(self._events) - subscribed  # topics added after the first
                if missing:
                    self._pubsub.subscribe(*missing)
                    subscribed |= missing
                if deaf:  # listening again: wake every listener once, for what it missed
                    deaf = False
                    for events in self._events.values():
                        for event in events:
                            event.set()
                if not set(self._events) - subscribed:  # none added meanwhile
                    self._listening.set()
                # Short: a topic subscribed while this call blocks is only sent to the server
                # when it returns (a newcomer to the pool waits for exactly that).
                message = self._pubsub.get_message(timeout=0.02)
                if message is not None:
                    for event in self._events.get(message["channel"].decode(), []):
                        event.set()
            except Exception as exc:  # reconnect after a blip; polling covers the gap
                log.debug("nudge listener: %s", exc)
                deaf = True
                self._reset()
                self._closed.wait(0.5)

    def wait_listening(self, timeout: float) -> bool:
        """Block until every topic subscribed so far is subscribed on the server (at most
        ``timeout`` seconds): a nudge published after this reaches us."""
        return self._listening.wait(timeout)

    def _reset(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                self._pubsub.close()
        self._pubsub = None

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._reset()
